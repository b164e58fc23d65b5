// unique_handle traits for raw CUDA runtime handles, for cuda code that works below the device interface
// (the P2P probe copies between two GPUs, which the device interface does not model yet). Closing never
// throws and reports a failure (the runtime may already be shutting down).
#pragma once

#include <cuda_runtime_api.h>

#include "ferry/core/unique_handle.hpp"
#include "ferry/cuda/detail/cuda_try.hpp"

namespace ferry::cuda_handles {

struct stream_traits {
  using handle_type = cudaStream_t;
  static constexpr cudaStream_t null() noexcept { return nullptr; }
  static bool is_null(cudaStream_t s) noexcept { return s == nullptr; }
  static void close(cudaStream_t s) noexcept { FERRY_CUDA_TRY_NOTHROW(cudaStreamDestroy(s)); }
};

struct event_traits {
  using handle_type = cudaEvent_t;
  static constexpr cudaEvent_t null() noexcept { return nullptr; }
  static bool is_null(cudaEvent_t e) noexcept { return e == nullptr; }
  static void close(cudaEvent_t e) noexcept { FERRY_CUDA_TRY_NOTHROW(cudaEventDestroy(e)); }
};

/// Device memory from cudaMalloc.
struct memory_traits {
  using handle_type = void*;
  static constexpr void* null() noexcept { return nullptr; }
  static bool is_null(void* p) noexcept { return p == nullptr; }
  static void close(void* p) noexcept { FERRY_CUDA_TRY_NOTHROW(cudaFree(p)); }
};

using unique_stream = unique_handle<stream_traits>;
using unique_event = unique_handle<event_traits>;
using unique_memory = unique_handle<memory_traits>;

}  // namespace ferry::cuda_handles
