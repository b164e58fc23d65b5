// The per-element arithmetic of comm's device ops, shared by the host loops and the cuda kernels so both
// backends compute the same bits: the codecs' scale and saturation, the comparison's difference and the
// fill formula. C++17 and free of ferry's C++20 headers, because the cuda kernels (nvcc, C++17) include
// it too; every function runs on the host and on the device. The casts themselves are float16.hpp's on
// the host and the CUDA intrinsics (the same rounding, to nearest even) on the device.
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

FERRY_HD inline bool finite_f32(float x) { return (f32_bits(x) & 0x7f800000u) != 0x7f800000u; }

/// x * scale, clamped to +-limit when finite (infinity and NaN pass through unchanged).
FERRY_HD inline float scale_saturate(float x, float scale, float limit) {
  float y = x * scale;
  if (finite_f32(y)) {
    if (y > limit) y = limit;
    if (y < -limit) y = -limit;
  }
  return y;
}

/// |a - b| as a comparison counts it: 0 for two NaNs or equal values (equal infinities included),
/// infinity when only one side is NaN or the difference is not a number.
FERRY_HD inline float compare_diff(float a, float b) {
  const bool a_nan = a != a;
  const bool b_nan = b != b;
  if (a_nan && b_nan) return 0.0F;
  if (a == b) return 0.0F;
  const float d = a > b ? a - b : b - a;
  if (a_nan || b_nan || d != d) return f32_from_bits(0x7f800000u);
  return d;
}

}  // namespace ferry::comm::detail
