#include "ferry/core/pattern_word.hpp"
#include "ferry/cuda/detail/kernels.cuh"

#include <algorithm>

namespace ferry::cuda_kernels {
namespace {

__device__ std::uint64_t global_timer_ns() {
  std::uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void spin_kernel(std::uint64_t nanoseconds) {
  const std::uint64_t start = global_timer_ns();
  while (global_timer_ns() - start < nanoseconds) {
    __nanosleep(1000);
  }
}

// One 8-byte word per thread and grid-stride, so a 1.4 GB output is written at device-memory speed;
// the last partial word is written byte by byte.
__global__ void fill_pattern_kernel(unsigned char* dst, std::size_t bytes, std::uint64_t seed) {
  const std::size_t words = bytes / 8;
  auto* out = reinterpret_cast<std::uint64_t*>(dst);
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < words;
       i += stride) {
    out[i] = pattern_word(seed, i);
  }
  if (blockIdx.x == 0 && threadIdx.x < bytes % 8) {
    const std::size_t g = words * 8 + threadIdx.x;
    dst[g] = static_cast<unsigned char>(pattern_word(seed, words) >> (8 * threadIdx.x));
  }
}

// Grid-stride sum of checksum terms per thread, a warp reduction, one atomic add per warp.
__global__ void checksum_kernel(const unsigned char* src, std::size_t bytes, unsigned long long* result) {
  const std::size_t words = bytes / 8;
  const auto* in = reinterpret_cast<const std::uint64_t*>(src);
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  std::uint64_t sum = 0;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < words;
       i += stride) {
    sum += checksum_term(in[i], i);
  }
  if (blockIdx.x == 0 && threadIdx.x == 0 && bytes % 8 != 0) {
    std::uint64_t w = 0;
    for (std::size_t k = 0; k < bytes % 8; ++k) w |= std::uint64_t{src[words * 8 + k]} << (8 * k);
    sum += checksum_term(w, words);
  }
  for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_down_sync(0xffffffffu, sum, offset);
  if ((threadIdx.x & 31) == 0) atomicAdd(result, static_cast<unsigned long long>(sum));
}

}  // namespace

cudaError_t launch_checksum(const void* src, std::size_t bytes, std::uint64_t* result, cudaStream_t stream) {
  if (reinterpret_cast<std::uintptr_t>(src) % 8 != 0) return cudaErrorMisalignedAddress;
  const std::size_t words = bytes / 8;
  const unsigned blocks = static_cast<unsigned>(std::min<std::size_t>((words + 255) / 256 + 1, 132 * 8));
  checksum_kernel<<<blocks, 256, 0, stream>>>(static_cast<const unsigned char*>(src), bytes,
                                              reinterpret_cast<unsigned long long*>(result));
  return cudaGetLastError();
}

cudaError_t launch_fill_pattern(void* dst, std::size_t bytes, std::uint64_t seed, cudaStream_t stream) {
  // Whole 8-byte stores need 8-byte alignment; ferry's buffers are at least 256-byte aligned, a foreign
  // view may not be.
  if (reinterpret_cast<std::uintptr_t>(dst) % 8 != 0) return cudaErrorMisalignedAddress;
  const std::size_t words = bytes / 8;
  const unsigned blocks = static_cast<unsigned>(std::min<std::size_t>((words + 255) / 256 + 1, 132 * 16));
  fill_pattern_kernel<<<blocks, 256, 0, stream>>>(static_cast<unsigned char*>(dst), bytes, seed);
  return cudaGetLastError();
}

cudaError_t check_kernels_load() {
  cudaFuncAttributes attributes{};
  return cudaFuncGetAttributes(&attributes, spin_kernel);
}

cudaError_t launch_spin(std::uint64_t nanoseconds, cudaStream_t stream) {
  spin_kernel<<<1, 32, 0, stream>>>(nanoseconds);
  return cudaGetLastError();
}

}  // namespace ferry::cuda_kernels
