// The GPU a thread's CUDA calls go to, for comm's cuda code (the codec kernels, PowerSGD's cuBLAS products
// and kernels, the NCCL backend): one place that makes a stream's or a rank's GPU current (docs/COMM.md,
// Note [The stream's device is made current]).
#pragma once

#include <cuda_runtime_api.h>

#include "ferry/cuda/detail/cuda_try.hpp"
#include "ferry/device/device.hpp"

namespace ferry::comm::detail {

/// Makes GPU `ordinal` current on the calling thread unless it already is; the status of cudaSetDevice
/// (a failure to read the current device is cleared, and the device set).
inline cudaError_t make_current(int ordinal) noexcept {
  int current = -1;
  if (cudaGetDevice(&current) != cudaSuccess) {
    static_cast<void>(cudaGetLastError());
  } else if (current == ordinal) {
    return cudaSuccess;
  }
  return cudaSetDevice(ordinal);
}

/// Makes the GPU of `s` current on the calling thread (and leaves it so, as the cuda backend's own calls
/// do) and returns s as a cudaStream_t. Throws cuda_error.
inline cudaStream_t select(stream_view s) {
  const auto stream = static_cast<cudaStream_t>(s.native());
  int want = 0;
  FERRY_CUDA_TRY(cudaStreamGetDevice(stream, &want));
  FERRY_CUDA_TRY(make_current(want));
  return stream;
}

/// Makes `ordinal` the calling thread's current GPU for the scope's life (NCCL enqueues on the current
/// device's context), then the caller's again. Never throws: a failure is cleared from the runtime's last
/// error and shows in the call made under the scope.
class device_scope {
 public:
  explicit device_scope(int ordinal) noexcept {
    if (cudaGetDevice(&saved_) != cudaSuccess) {
      static_cast<void>(cudaGetLastError());
      saved_ = -1;
    }
    to(ordinal);
  }
  device_scope(const device_scope&) = delete;
  device_scope& operator=(const device_scope&) = delete;
  ~device_scope() {
    if (saved_ >= 0) to(saved_);
  }

  /// Moves the scope to GPU `ordinal` (one thread issuing every local rank's part of an NCCL group).
  void to(int ordinal) noexcept {
    if (make_current(ordinal) != cudaSuccess) static_cast<void>(cudaGetLastError());
  }

 private:
  int saved_ = -1;
};

}  // namespace ferry::comm::detail
