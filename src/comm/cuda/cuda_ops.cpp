// comm's device ops on the cuda backend: the kernels of codec_kernels.cu on the caller's stream
// (stream_view::native() is the cudaStream_t). The stream's device is made current first (select,
// current_device.hpp), because a process may drive several GPUs from one thread.
#include <cuda_runtime_api.h>

#include "current_device.hpp"
#include "ferry/comm/detail/device_ops.hpp"
#include "ferry/cuda/detail/cuda_try.hpp"
#include "kernels.hpp"

namespace ferry::comm::detail {
namespace {

cuda_kernels::wire wire_of(codec_kind c) { return static_cast<cuda_kernels::wire>(c); }

class cuda_device_ops final : public device_ops {
 public:
  void encode(codec_kind c, const float* src, void* wire, std::size_t count, encode_params p,
              stream_view s) override {
    const cudaStream_t stream = select(s);
    FERRY_CUDA_TRY(cuda_kernels::launch_encode(wire_of(c), src, wire, count, p.scale, p.limit, stream));
  }

  void decode(codec_kind c, const void* wire, float* dst, std::size_t count, stream_view s) override {
    const cudaStream_t stream = select(s);
    FERRY_CUDA_TRY(cuda_kernels::launch_decode(wire_of(c), wire, dst, count, stream));
  }

  void fill(float* dst, std::size_t count, const f32_fill& f, stream_view s) override {
    const cudaStream_t stream = select(s);
    FERRY_CUDA_TRY(cuda_kernels::launch_fill(dst, count, f.base, f.scale, f.seed, f.ranks, stream));
  }

  void compare(const float* a, const float* b, const f32_fill& expected, std::size_t count, float tolerance,
               void* result, stream_view s) override {
    const cudaStream_t stream = select(s);
    FERRY_CUDA_TRY(cuda_kernels::launch_compare(a, b, count, tolerance, expected.base, expected.scale,
                                                expected.seed, expected.ranks, result, stream));
  }
};

}  // namespace

device_ops& cuda_ops() {
  static cuda_device_ops ops;
  return ops;
}

}  // namespace ferry::comm::detail
