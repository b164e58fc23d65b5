// Kernels of the cuda backend, callable from host-only translation units.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace ferry::cuda_kernels {

/// Launches a one-warp kernel that occupies `stream` for `nanoseconds` of GPU time (read from the
/// global timer). Returns the launch status.
cudaError_t launch_spin(std::uint64_t nanoseconds, cudaStream_t stream);

}  // namespace ferry::cuda_kernels
