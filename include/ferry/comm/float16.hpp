// IEEE binary16 (f16) and bfloat16 (bf16) on the host: conversions to and from float, rounding to the
// nearest value with ties to even, as CUDA's __float2half_rn and __float2bfloat16_rn do. The host
// communicator reduces f16 and bf16 through them (convert to float, sum, round back), and host-side codecs
// can cast with them, so a value leaves the host backend exactly as it would leave a GPU's cast.
#pragma once

#include <bit>
#include <cstdint>

namespace ferry::comm {

/// The float an f16 bit pattern holds (exact: every f16 is a float). NaN stays NaN, infinities stay.
[[nodiscard]] constexpr float f16_to_float(std::uint16_t h) noexcept {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000U) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1FU;
  std::uint32_t mant = h & 0x3FFU;
  if (exp == 0x1FU) return std::bit_cast<float>(sign | 0x7F800000U | (mant << 13));  // inf, NaN
  if (exp != 0) return std::bit_cast<float>(sign | ((exp + 112U) << 23) | (mant << 13));
  if (mant == 0) return std::bit_cast<float>(sign);  // +-0
  // Subnormal: shift the mantissa up to an implicit leading 1, lowering the exponent as it goes.
  std::uint32_t e = 113;
  while ((mant & 0x400U) == 0) {
    mant <<= 1;
    --e;
  }
  return std::bit_cast<float>(sign | (e << 23) | ((mant & 0x3FFU) << 13));
}

/// The f16 nearest to `f` (ties to even); beyond the largest f16 (65504) it is infinity, NaN stays NaN.
[[nodiscard]] constexpr std::uint16_t float_to_f16(float f) noexcept {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  const auto sign = static_cast<std::uint16_t>((x >> 16) & 0x8000U);
  const std::uint32_t abs = x & 0x7FFFFFFFU;
  if (abs > 0x7F800000U) return static_cast<std::uint16_t>(sign | 0x7E00U | ((abs >> 13) & 0x3FFU));  // NaN
  if (abs >= 0x477FF000U) return static_cast<std::uint16_t>(sign | 0x7C00U);  // rounds to beyond 65504
  if (abs >= 0x38800000U) {                                                   // normal f16 (>= 2^-14)
    const std::uint32_t rounded = abs + 0xFFFU + ((abs >> 13) & 1U);
    return static_cast<std::uint16_t>(sign | ((rounded - 0x38000000U) >> 13));
  }
  if (abs < 0x33000000U) return sign;  // below half the smallest subnormal (2^-25): rounds to 0
  // Subnormal f16: the value in units of 2^-24, rounded to nearest even.
  const std::uint32_t exp = abs >> 23;
  const std::uint32_t mant = (abs & 0x7FFFFFU) | 0x800000U;
  const std::uint32_t shift = 126U - exp;  // 14..24 for exponents 102..112
  const std::uint32_t half = 1U << (shift - 1);
  const std::uint32_t rest = mant & ((1U << shift) - 1U);
  std::uint32_t q = mant >> shift;
  if (rest > half || (rest == half && (q & 1U) != 0)) ++q;
  return static_cast<std::uint16_t>(sign | q);
}

/// The float a bf16 bit pattern holds (exact: bf16 is the top half of a float).
[[nodiscard]] constexpr float bf16_to_float(std::uint16_t b) noexcept {
  return std::bit_cast<float>(static_cast<std::uint32_t>(b) << 16);
}

/// The bf16 nearest to `f` (ties to even); NaN stays NaN, overflow rounds to infinity.
[[nodiscard]] constexpr std::uint16_t float_to_bf16(float f) noexcept {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  if ((x & 0x7FFFFFFFU) > 0x7F800000U) return static_cast<std::uint16_t>((x >> 16) | 0x40U);  // quiet NaN
  return static_cast<std::uint16_t>((x + 0x7FFFU + ((x >> 16) & 1U)) >> 16);
}

}  // namespace ferry::comm
