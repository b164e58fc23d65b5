// The fp16/bf16 conversions every codec relies on: exhaustive round trips and round-to-nearest-even
// checked against the two neighbouring values, so the host codecs and the cuda intrinsics agree.
#include "ferry/comm/detail/numeric.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

namespace ferry::comm::detail {
namespace {

bool is_nan16(std::uint16_t h, bool bf) {
  return bf ? ((h & 0x7f80u) == 0x7f80u && (h & 0x7fu) != 0)
            : ((h & 0x7c00u) == 0x7c00u && (h & 0x3ffu) != 0);
}

float decode(std::uint16_t h, bool bf) { return bf ? bf16_bits_to_f32(h) : f16_bits_to_f32(h); }
std::uint16_t encode(float f, bool bf) { return bf ? f32_to_bf16_bits(f) : f32_to_f16_bits(f); }

TEST(numeric, every_16_bit_value_survives_a_round_trip) {
  for (const bool bf : {false, true}) {
    for (std::uint32_t h = 0; h <= 0xffffu; ++h) {
      const auto bits = static_cast<std::uint16_t>(h);
      const float f = decode(bits, bf);
      if (is_nan16(bits, bf)) {
        EXPECT_TRUE(std::isnan(f)) << h;
        EXPECT_TRUE(is_nan16(encode(f, bf), bf)) << h;
        continue;
      }
      ASSERT_EQ(encode(f, bf), bits) << (bf ? "bf16 " : "fp16 ") << std::hex << h;
    }
  }
}

TEST(numeric, known_values_decode_exactly) {
  EXPECT_EQ(f16_bits_to_f32(0x3c00u), 1.0F);
  EXPECT_EQ(f16_bits_to_f32(0x7bffu), 65504.0F);
  EXPECT_EQ(f16_bits_to_f32(0x0001u), std::ldexp(1.0F, -24));
  EXPECT_EQ(f16_bits_to_f32(0x8400u), -std::ldexp(1.0F, -14));
  EXPECT_EQ(bf16_bits_to_f32(0x3f80u), 1.0F);
  EXPECT_EQ(bf16_bits_to_f32(0xc0a0u), -5.0F);
  EXPECT_EQ(f32_to_f16_bits(65519.99F), 0x7bffu);              // below the midpoint to 65536
  EXPECT_EQ(f32_to_f16_bits(65520.0F), 0x7c00u);               // the tie rounds to even: infinity
  EXPECT_EQ(f32_to_f16_bits(std::ldexp(1.0F, -25)), 0x0000u);  // tie between 0 and 2^-24: even
  EXPECT_EQ(f32_to_f16_bits(std::ldexp(1.5F, -25)), 0x0001u);
  EXPECT_EQ(f32_to_bf16_bits(std::numeric_limits<float>::max()), 0x7f80u);  // rounds up to infinity
}

// Random fp32 values over the whole range: the encoded value is the nearer of the two 16-bit values
// around x, and on a tie the one with an even last bit.
TEST(numeric, random_values_round_to_nearest_even) {
  std::mt19937 rng(7);
  for (const bool bf : {false, true}) {
    for (int k = 0; k < 400'000; ++k) {
      // Exponents over fp16's whole range (and beyond) for fp16; anything for bf16.
      float x;
      if (bf) {
        x = std::bit_cast<float>(static_cast<std::uint32_t>(rng()));
        if (!std::isfinite(x)) continue;
      } else {
        x = std::ldexp(static_cast<float>(rng() % 0x1000000u) / 0x1000000, static_cast<int>(rng() % 44) - 27);
        if (rng() & 1u) x = -x;
      }
      const std::uint16_t h = encode(x, bf);
      const float y = decode(h, bf);
      if (std::isinf(y)) {
        // Overflow only past the largest finite value's rounding midpoint.
        const float top = bf ? bf16_bits_to_f32(0x7f7fu) : 65504.0F;
        const float step = bf ? std::ldexp(1.0F, 127 - 7) : 32.0F;
        EXPECT_GE(std::fabs(static_cast<double>(x)), static_cast<double>(top) + step / 2.0) << x;
        continue;
      }
      // The neighbour on the other side of x.
      const std::uint16_t mag = h & 0x7fffu;
      const bool away = std::fabs(x) > std::fabs(y);
      if (std::fabs(x) == std::fabs(y)) continue;
      const std::uint16_t other_mag =
          away ? static_cast<std::uint16_t>(mag + 1) : static_cast<std::uint16_t>(mag - 1);
      const float other = decode(static_cast<std::uint16_t>((h & 0x8000u) | other_mag), bf);
      const double dy = std::fabs(static_cast<double>(x) - y);
      const double dother = std::fabs(static_cast<double>(x) - other);
      if (std::isinf(other)) {
        EXPECT_LT(dy, dother);
        continue;
      }
      ASSERT_LE(dy, dother) << (bf ? "bf16 " : "fp16 ") << x << " -> " << y << " but " << other
                            << " is nearer";
      if (dy == dother) {
        EXPECT_EQ(mag & 1u, 0U) << "tie of " << x << " not to even";
      }
    }
  }
}

TEST(numeric, the_fill_formula_is_deterministic_and_spread_over_minus_one_to_one) {
  double lo = 1;
  double hi = -1;
  double sum = 0;
  constexpr int n = 100'000;
  for (int i = 0; i < n; ++i) {
    const float u = unit_noise(5, static_cast<std::uint64_t>(i));
    ASSERT_GE(u, -1.0F);
    ASSERT_LT(u, 1.0F);
    lo = std::min(lo, static_cast<double>(u));
    hi = std::max(hi, static_cast<double>(u));
    sum += u;
  }
  EXPECT_LT(lo, -0.999);
  EXPECT_GT(hi, 0.999);
  EXPECT_NEAR(sum / n, 0.0, 0.02);
  EXPECT_NE(unit_noise(5, 0), unit_noise(6, 0));
  EXPECT_EQ(fill_value(1.0F, 2.0F, 9, 3), fill_value(1.0F, 2.0F, 9, 3));
  // The mean of ranks' values equals the formula's own mean.
  const double mean = (static_cast<double>(fill_value(1.0F, 2.0F, 9, 3)) + fill_value(1.0F, 2.0F, 10, 3) +
                       fill_value(1.0F, 2.0F, 11, 3)) /
                      3;
  EXPECT_EQ(fill_mean(1.0F, 2.0F, 9, 3, 3), static_cast<float>(mean));
}

}  // namespace
}  // namespace ferry::comm::detail
