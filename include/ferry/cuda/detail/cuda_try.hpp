// FERRY_CUDA_TRY for the cuda backend: turns a failed CUDA runtime call into ferry::cuda_error (keeping
// the cudaError_t code) or, for allocation failures, ferry::out_of_memory. Private to src/device/cuda.
#pragma once

#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include "ferry/core/error.hpp"

namespace ferry::detail {

[[noreturn]] inline void throw_cuda_error(cudaError_t status, const char* call) {
  // Reset the runtime's last-error slot so a later, unrelated check does not report this failure again.
  static_cast<void>(cudaGetLastError());
  auto msg = fmt::format("{} failed: {} ({}: {})", call, cudaGetErrorString(status), cudaGetErrorName(status),
                         static_cast<int>(status));
  if (status == cudaErrorMemoryAllocation) throw out_of_memory(msg);
  throw cuda_error(static_cast<int>(status), msg);
}

/// True for errors a destructor may see while the CUDA runtime is shutting down at process exit.
inline bool runtime_shutting_down(cudaError_t status) noexcept {
  return status == cudaErrorCudartUnloading || status == cudaErrorContextIsDestroyed;
}

}  // namespace ferry::detail

/// Throws ferry::cuda_error (or ferry::out_of_memory) naming the call when it does not return cudaSuccess.
#define FERRY_CUDA_TRY(call)                                   \
  do {                                                         \
    const cudaError_t ferry_status_ = (call);                  \
    if (ferry_status_ != cudaSuccess) [[unlikely]]             \
      ::ferry::detail::throw_cuda_error(ferry_status_, #call); \
  } while (0)

/// For destructors: reports a failed call on stderr, unless the runtime is already shutting down.
#define FERRY_CUDA_TRY_NOTHROW(call)                                                           \
  do {                                                                                         \
    const cudaError_t ferry_status_ = (call);                                                  \
    FERRY_ASSERT_NOTHROW(                                                                      \
        ferry_status_ == cudaSuccess || ::ferry::detail::runtime_shutting_down(ferry_status_), \
        fmt::format("{} failed: {}", #call, cudaGetErrorString(ferry_status_)));               \
  } while (0)
