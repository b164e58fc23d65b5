// fp32 gradient helpers for tests and benches, on either backend: make gradients with a deterministic
// formula and check reduced ones against the exact mean, on the device, without copying them to the
// host. A kernel on the cuda backend; a host function on the stream on the host backend.
#pragma once

#include <cstddef>
#include <cstdint>

#include "ferry/device/device.hpp"

namespace ferry::comm {

/// A deterministic fp32 formula: element i of one rank's gradient is base + scale * noise(seed, i), with
/// noise(seed, i) in [-1, 1) (a hash of seed and i, of the form k 2^-23). With ranks > 1 the formula is
/// the mean over seeds seed .. seed + ranks - 1 (each rank's fp32 value, summed in double, rounded once):
/// the exact result of an average over ranks that filled with seed + rank. Every backend computes the
/// same bits.
struct f32_fill {
  float base = 0;
  float scale = 1;
  std::uint64_t seed = 0;
  std::uint32_t ranks = 1;

  /// Element i, computed on the host.
  [[nodiscard]] float value(std::uint64_t i) const noexcept;
  /// The largest |value(i)| can be: |base| + |scale| (a bound for error_bound's max_abs).
  [[nodiscard]] float max_abs() const noexcept;
  /// Every element `v`.
  [[nodiscard]] static f32_fill constant(float v) noexcept { return {v, 0, 0, 1}; }
};

/// dst[i] = f.value(i) for i < count, on `s`. dst must be device memory (or pinned) of s's device
/// holding count floats. Throws logic_error for a view too small, of pageable memory, or f.ranks == 0.
void fill_f32_async(mem_view dst, std::size_t count, const f32_fill& f, stream_view s);

/// What a comparison found: the largest |a[i] - b[i]| and how many elements differ by more than the
/// tolerance. A NaN on either side (unless both are NaN) or an infinity on one side counts as wrong, with
/// an infinite difference; equal infinities match.
struct f32_diff {
  float max_abs_diff = 0;
  std::uint64_t wrong = 0;
};

/// Bytes of device memory that the asynchronous comparisons write their f32_diff into.
inline constexpr std::size_t f32_diff_bytes = 16;

/// Compares a[0, count) with b[0, count) on `s`, writing the result into `result` (f32_diff_bytes of
/// device or pinned memory; read it with read_f32_diff once s has passed this point). Checks as
/// fill_f32_async.
void compare_f32_async(mem_view a, mem_view b, std::size_t count, float tolerance, mem_view result,
                       stream_view s);
/// Compares a[0, count) with expected.value(i), as above.
void compare_f32_async(mem_view a, const f32_fill& expected, std::size_t count, float tolerance,
                       mem_view result, stream_view s);
/// Decodes a result that the comparison wrote (host bytes, after they were copied to the host).
[[nodiscard]] f32_diff read_f32_diff(const std::byte* bytes) noexcept;

/// Synchronous forms: compare on `s`, wait for s, return the result. They allocate a small device and a
/// pinned buffer per call (for checks, not hot paths).
[[nodiscard]] f32_diff compare_f32(mem_view a, mem_view b, std::size_t count, float tolerance, stream_view s);
[[nodiscard]] f32_diff compare_f32(mem_view a, const f32_fill& expected, std::size_t count, float tolerance,
                                   stream_view s);

}  // namespace ferry::comm
