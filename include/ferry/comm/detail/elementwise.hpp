// The per-element rules of comm's device ops, shared by the host loops and the cuda kernels so both
// backends compute the same bits. C++17, host and device (see numeric.hpp).
#pragma once

#include <cstdint>

#include "ferry/comm/detail/numeric.hpp"

namespace ferry::comm::detail {

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
