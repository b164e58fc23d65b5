#include "ferry/core/pattern.hpp"

#include <gtest/gtest.h>

#include <vector>

namespace {

TEST(pattern, any_split_of_an_output_fills_the_same_bytes) {
  std::vector<std::byte> whole(1000), pieces(1000);
  ferry::fill_pattern(whole, 42);
  // Pieces at odd offsets and lengths, so the unaligned head and tail paths run.
  const std::size_t cuts[] = {0, 3, 8, 17, 64, 999, 1000};
  for (std::size_t k = 0; k + 1 < std::size(cuts); ++k) {
    ferry::fill_pattern(std::span(pieces).subspan(cuts[k], cuts[k + 1] - cuts[k]), 42, cuts[k]);
  }
  EXPECT_EQ(whole, pieces);
  EXPECT_FALSE(ferry::find_pattern_mismatch(whole, 42).has_value());
  EXPECT_FALSE(ferry::find_pattern_mismatch(std::span(whole).subspan(5, 100), 42, 5).has_value());
}

TEST(pattern, finds_the_first_wrong_byte_and_a_wrong_seed_or_offset) {
  std::vector<std::byte> out(4096);
  ferry::fill_pattern(out, 7);
  out[1234] ^= std::byte{0x01};
  out[2000] ^= std::byte{0x80};
  ASSERT_TRUE(ferry::find_pattern_mismatch(out, 7).has_value());
  EXPECT_EQ(*ferry::find_pattern_mismatch(out, 7), 1234u);
  EXPECT_EQ(*ferry::find_pattern_mismatch(std::span(out).subspan(1235), 7, 1235), 2000u);
  std::vector<std::byte> clean(64);
  ferry::fill_pattern(clean, 7);
  EXPECT_TRUE(ferry::find_pattern_mismatch(clean, 8).has_value()) << "another seed must not match";
  EXPECT_TRUE(ferry::find_pattern_mismatch(clean, 7, 8).has_value()) << "a shifted copy must not match";
}

TEST(pattern, words_are_little_endian_pattern_words) {
  std::vector<std::byte> out(16);
  ferry::fill_pattern(out, 3);
  std::uint64_t w1 = 0;
  for (int b = 7; b >= 0; --b) w1 = (w1 << 8) | std::to_integer<std::uint64_t>(out[8 + b]);
  EXPECT_EQ(w1, ferry::pattern_word(3, 1));
}

}  // namespace
