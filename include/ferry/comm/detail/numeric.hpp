// Numerics shared by the host and cuda implementations of comm's device ops: fp16/bf16 conversions
// (round to nearest even, as the CUDA intrinsics do) and the fill formula. C++17 and free of ferry's
// C++20 headers, because the cuda kernels (nvcc, C++17) include it too; every function runs on the host
// and on the device.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define FERRY_HD __host__ __device__
#else
#define FERRY_HD
#endif

namespace ferry::comm::detail {

FERRY_HD inline std::uint32_t f32_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
#endif
}

FERRY_HD inline float f32_from_bits(std::uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
#endif
}

/// fp32 -> IEEE binary16 bits, round to nearest even; overflow gives infinity, NaN stays a quiet NaN.
FERRY_HD inline std::uint16_t f32_to_f16_bits(float f) {
  const std::uint32_t x = f32_bits(f);
  const std::uint32_t sign = (x >> 16) & 0x8000u;
  const std::uint32_t abs = x & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<std::uint16_t>(sign | 0x7e00u);   // NaN
  if (abs >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // rounds to >= 65520: inf
  if (abs >= 0x38800000u) {                                                   // normal in fp16 (>= 2^-14)
    // Rebias the exponent (127 -> 15) and round the 13 dropped mantissa bits to nearest even.
    const std::uint32_t m = abs - 0x38000000u;
    const std::uint32_t rounded = (m + 0x0fffu + ((m >> 13) & 1u)) >> 13;
    return static_cast<std::uint16_t>(sign | rounded);
  }
  if (abs < 0x33000000u) return static_cast<std::uint16_t>(sign);  // below half the smallest subnormal: 0
  // Subnormal in fp16: value = mant * 2^-24. Shift the full significand and round to nearest even.
  const std::uint32_t exp = abs >> 23;  // 102..112
  const std::uint32_t sig = (abs & 0x7fffffu) | 0x800000u;
  const std::uint32_t shift = 126u - exp;  // 14..24: sig * 2^(exp-150) / 2^-24 = sig >> shift
  const std::uint32_t half = 1u << (shift - 1);
  const std::uint32_t rest = sig & ((1u << shift) - 1u);
  std::uint32_t mant = sig >> shift;
  if (rest > half || (rest == half && (mant & 1u))) ++mant;
  return static_cast<std::uint16_t>(sign | mant);
}

/// IEEE binary16 bits -> fp32 (exact).
FERRY_HD inline float f16_bits_to_f32(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1fu;
  const std::uint32_t mant = h & 0x3ffu;
  if (exp == 0x1fu) return f32_from_bits(sign | 0x7f800000u | (mant << 13));  // inf, NaN
  if (exp != 0) return f32_from_bits(sign | ((exp + 112u) << 23) | (mant << 13));
  // Zero or subnormal: mant * 2^-24, exact in fp32.
  const float v = static_cast<float>(mant) * 5.9604644775390625e-8f;
  return sign != 0 ? -v : v;
}

/// fp32 -> bfloat16 bits, round to nearest even; NaN stays a quiet NaN.
FERRY_HD inline std::uint16_t f32_to_bf16_bits(float f) {
  const std::uint32_t x = f32_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((x >> 16) | 0x0040u);
  return static_cast<std::uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

/// bfloat16 bits -> fp32 (exact).
FERRY_HD inline float bf16_bits_to_f32(std::uint16_t b) {
  return f32_from_bits(static_cast<std::uint32_t>(b) << 16);
}

/// splitmix64: the fill formula's hash of (seed, index).
FERRY_HD inline std::uint64_t mix64(std::uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/// A value in [-1, 1) of the form k * 2^-23 (exact in fp32) from (seed, i).
FERRY_HD inline float unit_noise(std::uint64_t seed, std::uint64_t i) {
  const std::uint64_t h = mix64(seed * 0xd1342543de82ef95ull + mix64(i));
  const auto k = static_cast<std::int32_t>(h >> 40) - (1 << 23);  // 24 bits, centred
  return static_cast<float>(k) * 1.1920928955078125e-7f;          // 2^-23
}

/// One rank's value of the fill formula: base + scale * unit_noise(seed, i), computed in double (the
/// product of two floats is exact there, so a fused multiply-add gives the same bits) and rounded once.
FERRY_HD inline float fill_value(float base, float scale, std::uint64_t seed, std::uint64_t i) {
  return static_cast<float>(static_cast<double>(base) +
                            static_cast<double>(scale) * static_cast<double>(unit_noise(seed, i)));
}

/// The mean over `ranks` ranks of fill_value(base, scale, seed + r, i), each rank's fp32 value summed in
/// double: the reference an fp32 all-reduce (avg) of such fills is checked against.
FERRY_HD inline float fill_mean(float base, float scale, std::uint64_t seed, std::uint32_t ranks,
                                std::uint64_t i) {
  if (ranks <= 1) return fill_value(base, scale, seed, i);
  double sum = 0;
  for (std::uint32_t r = 0; r < ranks; ++r) sum += static_cast<double>(fill_value(base, scale, seed + r, i));
  return static_cast<float>(sum / static_cast<double>(ranks));
}

}  // namespace ferry::comm::detail
