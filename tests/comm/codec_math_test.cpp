// The arithmetic the codecs share between backends: random values round to the nearer 16-bit neighbour
// (ties to even) through float16.hpp, as the cuda intrinsics do; the fill formula; saturation and the
// comparison's rules for infinity and NaN.
#include "ferry/comm/detail/codec_math.hpp"

#include "ferry/comm/float16.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

namespace ferry::comm::detail {
namespace {

using comm::bf16_to_float;
using comm::f16_to_float;
using comm::float_to_bf16;
using comm::float_to_f16;

float decode(std::uint16_t h, bool bf) { return bf ? bf16_to_float(h) : f16_to_float(h); }
std::uint16_t encode(float f, bool bf) { return bf ? float_to_bf16(f) : float_to_f16(f); }

// Random fp32 values over the whole range: the encoded value is the nearer of the two 16-bit values
// around x, and on a tie the one with an even last bit.
TEST(codec_math, random_values_round_to_nearest_even) {
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
        const float top = bf ? bf16_to_float(0x7f7fu) : 65504.0F;
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

TEST(codec_math, the_fill_formula_is_deterministic_and_spread_over_minus_one_to_one) {
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

TEST(codec_math, saturation_clamps_finite_values_only) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(scale_saturate(10.0F, 0.5F, 100.0F), 5.0F);
  EXPECT_EQ(scale_saturate(1000.0F, 0.5F, 100.0F), 100.0F);
  EXPECT_EQ(scale_saturate(-1000.0F, 0.5F, 100.0F), -100.0F);
  EXPECT_EQ(scale_saturate(inf, 0.5F, 100.0F), inf);
  EXPECT_EQ(scale_saturate(-inf, 0.5F, 100.0F), -inf);
  EXPECT_TRUE(std::isnan(scale_saturate(std::numeric_limits<float>::quiet_NaN(), 0.5F, 100.0F)));
}

TEST(codec_math, the_comparison_matches_nans_and_equal_infinities_only) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(compare_diff(1.0F, 1.5F), 0.5F);
  EXPECT_EQ(compare_diff(-1.0F, 1.0F), 2.0F);
  EXPECT_EQ(compare_diff(nan, nan), 0.0F);
  EXPECT_EQ(compare_diff(inf, inf), 0.0F);
  EXPECT_EQ(compare_diff(inf, -inf), inf);
  EXPECT_EQ(compare_diff(nan, 1.0F), inf);
  EXPECT_EQ(compare_diff(1.0F, nan), inf);
  EXPECT_EQ(compare_diff(inf, 1.0F), inf);
}

}  // namespace
}  // namespace ferry::comm::detail
