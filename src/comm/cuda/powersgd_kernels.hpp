// PowerSGD's cuda kernels (powersgd_kernels.cu), callable from host-only translation units. Each launcher
// returns the launch status; pointers are device memory.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace ferry::comm::cuda_kernels {

/// A run of floats to copy or add: dst[dst_offset + i] and src[src_offset + i] for i < elements.
struct segment {
  std::size_t dst_offset;
  std::size_t src_offset;
  std::size_t elements;
};

/// One matrix's P for the orthogonalization: its first float and its rows.
struct ortho_item {
  std::size_t p_offset;
  std::size_t rows;
};

/// q[j] = unit_noise(seed, j) for j < count.
cudaError_t launch_seed(float* q, std::size_t count, std::uint64_t seed, cudaStream_t stream);
/// For each of the `count` segments (device array; `largest` is the most elements of one):
/// dst[...] = src[...], or dst[...] += src[...] with `add`. One launch. count must be < 65536.
cudaError_t launch_segments(const segment* segs, unsigned count, std::size_t largest, float* dst,
                            const float* src, bool add, cudaStream_t stream);
/// out[i] = base + offsets[i] for i < count.
cudaError_t launch_pointers(float** out, const std::size_t* offsets, std::size_t count, float* base,
                            cudaStream_t stream);
/// Gram-Schmidt over the r columns of each item's P (rows x r, row-major, at p + p_offset), one block per
/// item, in one launch.
cudaError_t launch_orthogonalize(const ortho_item* items, unsigned count, float* p, std::size_t r,
                                 cudaStream_t stream);

}  // namespace ferry::comm::cuda_kernels
