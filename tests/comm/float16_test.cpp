// f16 and bf16 conversions: known bit patterns, rounding to nearest even, and the special values.
#include "ferry/comm/float16.hpp"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

namespace ferry::comm {
namespace {

TEST(float16, known_f16_bit_patterns_convert_both_ways) {
  const struct {
    float f;
    std::uint16_t h;
  } known[] = {{1.0F, 0x3C00},
               {-2.0F, 0xC000},
               {0.5F, 0x3800},
               {65504.0F, 0x7BFF},
               {0.0F, 0x0000},
               {-0.0F, 0x8000},
               {std::ldexp(1.0F, -14), 0x0400},
               {std::ldexp(1.0F, -24), 0x0001},
               {std::ldexp(1023.0F, -24), 0x03FF},
               {std::numeric_limits<float>::infinity(), 0x7C00}};
  for (const auto& k : known) {
    EXPECT_EQ(float_to_f16(k.f), k.h) << k.f;
    EXPECT_EQ(std::bit_cast<std::uint32_t>(f16_to_float(k.h)), std::bit_cast<std::uint32_t>(k.f)) << k.h;
  }
}

TEST(float16, f16_rounds_to_nearest_with_ties_to_even) {
  const float ulp = std::ldexp(1.0F, -10);                    // at 1.0
  EXPECT_EQ(float_to_f16(1.0F + ulp / 2), 0x3C00);            // tie, to even (down)
  EXPECT_EQ(float_to_f16(1.0F + 3 * ulp / 2), 0x3C02);        // tie, to even (up)
  EXPECT_EQ(float_to_f16(1.0F + ulp / 2 + ulp / 8), 0x3C01);  // above the tie
  EXPECT_EQ(float_to_f16(65519.0F), 0x7BFF);                  // below the tie with infinity
  EXPECT_EQ(float_to_f16(65520.0F), 0x7C00);                  // the tie rounds to even: infinity
  EXPECT_EQ(float_to_f16(std::ldexp(1.0F, -25)), 0x0000);     // half the smallest subnormal: to even, 0
  EXPECT_EQ(float_to_f16(std::ldexp(1.5F, -25)), 0x0001);
  EXPECT_EQ(float_to_f16(std::ldexp(3.0F, -25)), 0x0002);  // 1.5 subnormal units: tie, to even (2)
  EXPECT_TRUE(std::isnan(f16_to_float(float_to_f16(std::numeric_limits<float>::quiet_NaN()))));
}

TEST(float16, every_f16_survives_a_round_trip_through_float) {
  for (std::uint32_t h = 0; h <= 0xFFFF; ++h) {
    const auto bits = static_cast<std::uint16_t>(h);
    const float f = f16_to_float(bits);
    if (std::isnan(f)) continue;
    ASSERT_EQ(float_to_f16(f), bits) << std::hex << h;
  }
}

TEST(float16, bf16_is_the_rounded_top_half_of_a_float) {
  EXPECT_EQ(float_to_bf16(1.0F), 0x3F80);
  EXPECT_EQ(float_to_bf16(std::bit_cast<float>(0x3F808000U)), 0x3F80);  // tie, to even (down)
  EXPECT_EQ(float_to_bf16(std::bit_cast<float>(0x3F818000U)), 0x3F82);  // tie, to even (up)
  EXPECT_EQ(float_to_bf16(std::bit_cast<float>(0x3F808001U)), 0x3F81);
  EXPECT_EQ(bf16_to_float(0xC040), -3.0F);
  EXPECT_EQ(float_to_bf16(std::numeric_limits<float>::max()), 0x7F80);  // rounds to infinity
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  for (std::uint32_t b = 0; b <= 0xFFFF; ++b) {
    const auto bits = static_cast<std::uint16_t>(b);
    if (std::isnan(bf16_to_float(bits))) continue;
    ASSERT_EQ(float_to_bf16(bf16_to_float(bits)), bits) << std::hex << b;
  }
}

}  // namespace
}  // namespace ferry::comm
