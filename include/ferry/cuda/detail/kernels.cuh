// Kernels of the cuda backend, callable from host-only translation units.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace ferry::cuda_kernels {

/// Loads a kernel of this build on the current device: cudaErrorNoKernelImageForDevice (or another
/// error) when the build carries no code the GPU can run.
cudaError_t check_kernels_load();

/// Launches a one-warp kernel that occupies `stream` for `nanoseconds` of GPU time (read from the
/// global timer). Returns the launch status.
cudaError_t launch_spin(std::uint64_t nanoseconds, cudaStream_t stream);

/// Launches a kernel writing the verification pattern of `seed` (ferry/core/pattern.hpp) into `bytes`
/// bytes at `dst` (device memory, or pinned host memory mapped into the device's address space).
cudaError_t launch_fill_pattern(void* dst, std::size_t bytes, std::uint64_t seed, cudaStream_t stream);

/// Launches a kernel adding ferry's checksum (checksum_term summed over the words of `bytes` bytes at
/// `src`, a final partial word zero-padded) into `*result` (device memory, zeroed by the caller).
cudaError_t launch_checksum(const void* src, std::size_t bytes, std::uint64_t* result, cudaStream_t stream);

}  // namespace ferry::cuda_kernels
