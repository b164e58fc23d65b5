#include "ferry/core/units.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <string>

#include "ferry/core/error.hpp"

namespace {

using ferry::GiB;
using ferry::KiB;
using ferry::MiB;

TEST(units, format_bytes_three_significant_digits) {
  EXPECT_EQ(ferry::format_bytes(0), "0 B");
  EXPECT_EQ(ferry::format_bytes(512), "512 B");
  EXPECT_EQ(ferry::format_bytes(1023), "1023 B");
  EXPECT_EQ(ferry::format_bytes(KiB), "1.00 KiB");
  EXPECT_EQ(ferry::format_bytes(1536), "1.50 KiB");
  EXPECT_EQ(ferry::format_bytes(64 * MiB), "64.0 MiB");
  EXPECT_EQ(ferry::format_bytes(8 * MiB), "8.00 MiB");
  EXPECT_EQ(ferry::format_bytes(512 * MiB), "512 MiB");
  EXPECT_EQ(ferry::format_bytes(GiB), "1.00 GiB");
  EXPECT_EQ(ferry::format_bytes(static_cast<std::uint64_t>(1.41 * GiB)), "1.41 GiB");
  // Rounding picks the precision: 9.999 KiB reads "10.0 KiB", and just under 1 MiB reads "1.00 MiB".
  EXPECT_EQ(ferry::format_bytes(10238), "10.0 KiB");
  EXPECT_EQ(ferry::format_bytes(MiB - 1), "1.00 MiB");
  EXPECT_EQ(ferry::format_bytes(std::numeric_limits<std::uint64_t>::max()), "16.0 EiB");
}

TEST(units, format_duration_ns) {
  EXPECT_EQ(ferry::format_duration_ns(0), "0 ns");
  EXPECT_EQ(ferry::format_duration_ns(850), "850 ns");
  EXPECT_EQ(ferry::format_duration_ns(12'345), "12.3 us");
  EXPECT_EQ(ferry::format_duration_ns(1'200'000), "1.20 ms");
  EXPECT_EQ(ferry::format_duration_ns(3'450'000'000), "3.45 s");
  EXPECT_EQ(ferry::format_duration_ns(999'999), "1.00 ms");
}

TEST(units, gb_per_s_is_decimal) {
  EXPECT_DOUBLE_EQ(ferry::gb_per_s(2'000'000'000, 1.0), 2.0);
  EXPECT_DOUBLE_EQ(ferry::gb_per_s(GiB, 0.5), 2.147483648);
  EXPECT_EQ(ferry::gb_per_s(GiB, 0.0), 0.0);
  EXPECT_EQ(ferry::gb_per_s(GiB, -1.0), 0.0);
  EXPECT_EQ(ferry::gb_per_s(GiB, std::numeric_limits<double>::quiet_NaN()), 0.0);
}

TEST(units, parse_bytes_accepts_binary_units_in_any_case) {
  EXPECT_EQ(ferry::parse_bytes("4096"), 4096U);
  EXPECT_EQ(ferry::parse_bytes("0"), 0U);
  EXPECT_EQ(ferry::parse_bytes("512B"), 512U);
  EXPECT_EQ(ferry::parse_bytes("512k"), 512 * KiB);
  EXPECT_EQ(ferry::parse_bytes("512K"), 512 * KiB);
  EXPECT_EQ(ferry::parse_bytes("512KB"), 512 * KiB);
  EXPECT_EQ(ferry::parse_bytes("512kib"), 512 * KiB);
  EXPECT_EQ(ferry::parse_bytes("64MiB"), 64 * MiB);
  EXPECT_EQ(ferry::parse_bytes("64mb"), 64 * MiB);
  EXPECT_EQ(ferry::parse_bytes("2G"), 2 * GiB);
  EXPECT_EQ(ferry::parse_bytes("1.5GiB"), 3 * GiB / 2);
  EXPECT_EQ(ferry::parse_bytes("0.5k"), 512U);
  EXPECT_EQ(ferry::parse_bytes("3T"), 3ULL << 40);
  EXPECT_EQ(ferry::parse_bytes(" 64 MiB "), 64 * MiB);
  EXPECT_EQ(ferry::parse_bytes("1."), 1U);
  EXPECT_EQ(ferry::parse_bytes("16777215.999999T"), 16777215ULL * (1ULL << 40) + 1099510528264ULL);
}

TEST(units, parse_bytes_rounds_fractions_of_a_unit_down) {
  // 1.1 KiB is 1126.4 bytes.
  EXPECT_EQ(ferry::parse_bytes("1.1K"), 1126U);
}

void expect_bad(const std::string& text, const std::string& why) {
  try {
    (void)ferry::parse_bytes(text);
    ADD_FAILURE() << "parse_bytes(\"" << text << "\") did not throw";
  } catch (const ferry::logic_error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("\"" + text + "\""), std::string::npos) << what;
    EXPECT_NE(what.find(why), std::string::npos) << what;
  }
}

TEST(units, parse_bytes_errors_name_the_text) {
  expect_bad("", "empty");
  expect_bad("   ", "empty");
  expect_bad("-5M", "negative");
  expect_bad("abc", "no number");
  expect_bad("12 parsecs", "not a unit");
  expect_bad("64MiBs", "not a unit");
  expect_bad("5iB", "not a unit");
  expect_bad("1.2.3", "not a unit");
  expect_bad("+5", "no number");
  expect_bad("1.5", "whole number");
  expect_bad("18446744073709551616", "64 bits");
  expect_bad("99999999999999999999999", "64 bits");
  expect_bad("16777216T", "64 bits");
}

TEST(units, parse_bytes_accepts_the_largest_value) {
  EXPECT_EQ(ferry::parse_bytes("18446744073709551615"), std::numeric_limits<std::uint64_t>::max());
}

TEST(units, parse_and_format_round_trip) {
  for (std::uint64_t v : {std::uint64_t{1} * KiB, 64 * MiB, 3 * GiB}) {
    EXPECT_EQ(ferry::parse_bytes(ferry::format_bytes(v)), v) << ferry::format_bytes(v);
  }
}

}  // namespace
