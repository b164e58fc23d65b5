// The small device operations of ferry::comm (codec casts, fills, comparisons) behind one interface,
// implemented once per backend and chosen by the device's kind: plain C++ in a host function on the
// stream for the host backend, kernels for the cuda backend (src/comm/cuda, built with the toolkit only).
// Internal: callers use codec.hpp and f32_ops.hpp, which check arguments before they reach these.
#pragma once

#include <cstddef>
#include <cstdint>

#include "ferry/comm/codec.hpp"
#include "ferry/comm/f32_ops.hpp"
#include "ferry/device/device.hpp"

namespace ferry::comm::detail {

/// What encode does to each element: wire = cast(clamp(x * scale, +-limit)); limit applies to finite values.
struct encode_params {
  float scale = 1;
  float limit = 0;
};

/// One backend's implementation. Arguments are checked by the callers: pointers are valid for `count`
/// elements of their type, count > 0, and the stream is of the backend's kind. Stateless.
class device_ops {
 public:
  device_ops() = default;
  device_ops(const device_ops&) = delete;
  device_ops& operator=(const device_ops&) = delete;
  virtual ~device_ops() = default;

  virtual void encode(codec_kind c, const float* src, void* wire, std::size_t count, encode_params p,
                      stream_view s) = 0;
  virtual void decode(codec_kind c, const void* wire, float* dst, std::size_t count, stream_view s) = 0;
  virtual void fill(float* dst, std::size_t count, const f32_fill& f, stream_view s) = 0;
  /// Compares a with b (or with `expected` when b is null) into the f32_diff_bytes at `result`, which the
  /// op zeroes first.
  virtual void compare(const float* a, const float* b, const f32_fill& expected, std::size_t count,
                       float tolerance, void* result, stream_view s) = 0;
};

/// The implementation for `dev`'s backend. Throws logic_error for the cuda backend when ferry was built
/// without CUDA.
[[nodiscard]] device_ops& ops_for(device& dev);

/// The host implementation (also used by the cuda tests as the reference).
[[nodiscard]] device_ops& host_ops();

#if defined(FERRY_COMM_HAVE_CUDA)
/// The cuda implementation (src/comm/cuda).
[[nodiscard]] device_ops& cuda_ops();
#endif

/// Layout of a comparison's result, shared by both implementations: the largest difference's fp32 bits
/// (non-negative floats order as their bits) and the count of wrong elements.
struct diff_result {
  std::uint32_t max_bits;
  std::uint32_t pad;
  std::uint64_t wrong;
};
static_assert(sizeof(diff_result) == f32_diff_bytes);

}  // namespace ferry::comm::detail
