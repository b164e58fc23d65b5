// PowerSGD's cuda kernels (the products are cuBLAS's, src/comm/cuda/powersgd_cuda.cpp): the seeded first Q,
// the segment copies around the products (E += G before them, the uncompressed tensors into and out of
// the wire buffer), the per-step pointer array of the bucket's matrices, and Gram-Schmidt over P's r
// columns, one block per matrix, every matrix of the bucket in one launch. Accumulation in fp64, as the
// host implementation does, so both backends agree to fp32 rounding.
#include <algorithm>

#include "ferry/comm/detail/codec_math.hpp"
#include "powersgd_kernels.hpp"

namespace ferry::comm::cuda_kernels {
namespace {

constexpr unsigned threads = 256;
constexpr std::size_t max_blocks_x = 1024;

unsigned blocks_for(std::size_t work_items) {
  return static_cast<unsigned>(
      std::clamp<std::size_t>((work_items + threads - 1) / threads, 1, max_blocks_x));
}

__global__ void seed_kernel(float* q, std::size_t count, std::uint64_t seed) {
  for (std::size_t j = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; j < count;
       j += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    q[j] = detail::unit_noise(seed, j);
  }
}

// Segment blockIdx.y: dst[dst_offset + i] (+)= src[src_offset + i].
__global__ void segments_kernel(const segment* segs, float* dst, const float* src, bool add) {
  const segment sg = segs[blockIdx.y];
  float* d = dst + sg.dst_offset;
  const float* s = src + sg.src_offset;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < sg.elements;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    d[i] = add ? d[i] + s[i] : s[i];
  }
}

__global__ void pointers_kernel(float** out, const std::size_t* offsets, std::size_t count, float* base) {
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    out[i] = base + offsets[i];
  }
}

// The block's sum of `v` (every thread gets it). `scratch` holds `threads` doubles.
__device__ double block_sum(double v, double* scratch) {
  scratch[threadIdx.x] = v;
  __syncthreads();
  for (unsigned half = threads / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) scratch[threadIdx.x] += scratch[threadIdx.x + half];
    __syncthreads();
  }
  const double sum = scratch[0];
  __syncthreads();  // scratch is reused by the next call
  return sum;
}

// Matrix blockIdx.x: its P (rows x r, row-major) gets orthonormal columns by Gram-Schmidt, in the host
// implementation's order (for each column k: subtract its projection on every earlier column, then
// normalise; a zero column stays zero).
__global__ void __launch_bounds__(threads)
    orthogonalize_kernel(const ortho_item* items, float* p, std::size_t r) {
  __shared__ double scratch[threads];
  const ortho_item it = items[blockIdx.x];
  float* pm = p + it.p_offset;
  for (std::size_t k = 0; k < r; ++k) {
    for (std::size_t l = 0; l < k; ++l) {
      double part = 0;
      for (std::size_t i = threadIdx.x; i < it.rows; i += threads)
        part += static_cast<double>(pm[i * r + l]) * pm[i * r + k];
      const double dot = block_sum(part, scratch);
      for (std::size_t i = threadIdx.x; i < it.rows; i += threads)
        pm[i * r + k] -= static_cast<float>(dot * pm[i * r + l]);
      __syncthreads();
    }
    double part = 0;
    for (std::size_t i = threadIdx.x; i < it.rows; i += threads)
      part += static_cast<double>(pm[i * r + k]) * pm[i * r + k];
    const double norm = sqrt(block_sum(part, scratch));
    const double inv = norm > 0 ? 1.0 / norm : 0.0;
    for (std::size_t i = threadIdx.x; i < it.rows; i += threads)
      pm[i * r + k] = static_cast<float>(pm[i * r + k] * inv);
    __syncthreads();
  }
}

}  // namespace

cudaError_t launch_seed(float* q, std::size_t count, std::uint64_t seed, cudaStream_t stream) {
  seed_kernel<<<blocks_for(count), threads, 0, stream>>>(q, count, seed);
  return cudaGetLastError();
}

cudaError_t launch_segments(const segment* segs, unsigned count, std::size_t largest, float* dst,
                            const float* src, bool add, cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  const dim3 grid(blocks_for(largest), count);
  segments_kernel<<<grid, threads, 0, stream>>>(segs, dst, src, add);
  return cudaGetLastError();
}

cudaError_t launch_pointers(float** out, const std::size_t* offsets, std::size_t count, float* base,
                            cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  pointers_kernel<<<blocks_for(count), threads, 0, stream>>>(out, offsets, count, base);
  return cudaGetLastError();
}

cudaError_t launch_orthogonalize(const ortho_item* items, unsigned count, float* p, std::size_t r,
                                 cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  orthogonalize_kernel<<<count, threads, 0, stream>>>(items, p, r);
  return cudaGetLastError();
}

}  // namespace ferry::comm::cuda_kernels
