// comm's cuda kernels: the codecs' fused scale+saturate+cast and its inverse, the fill formula and the
// comparison. Grid-stride loops; the codecs move four elements per thread and iteration (one 16-byte
// fp32 load or store, one 8-byte 16-bit store or load) when the pointers allow it, else one.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>

#include "ferry/comm/detail/codec_math.hpp"
#include "kernels.hpp"

namespace ferry::comm::cuda_kernels {
namespace {

using detail::scale_saturate;

constexpr unsigned threads = 256;

// Blocks per SM of a grid-stride launch. The fill and the comparison (the benches' producers and checks)
// take the whole GPU. The codecs run on the communication stream beside backward, and every SM slot and
// byte of memory bandwidth they hold is taken from it: with 4 blocks per SM they run 10% slower alone than
// with 16 (512 MiB of fp32 to bf16 and back: 455 against 415 us on an H200) but cost a step of bench ddp
// at world size 1 1.1% instead of 1.7% (docs/PERFORMANCE.md, 2026-11-23; 2 per SM cost less beside
// backward but run 1.5 times slower alone).
constexpr unsigned whole_gpu_per_sm = 16;
constexpr unsigned codec_per_sm = 4;

// The current GPU's SMs (the launch's stream is on it); 132, an H100's or H200's, if it cannot be read:
// only the grid's size depends on it, and a runtime that cannot answer fails the launch after it anyway.
unsigned sm_count() {
  int dev = 0;
  int sms = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || sms <= 0) {
    static_cast<void>(cudaGetLastError());
    return 132;
  }
  return static_cast<unsigned>(sms);
}

unsigned blocks_for(std::size_t work_items, unsigned per_sm) {
  const std::size_t most = std::size_t{sm_count()} * per_sm;
  return static_cast<unsigned>(std::clamp<std::size_t>((work_items + threads - 1) / threads, 1, most));
}

__device__ std::size_t first_index() {
  return static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ std::size_t grid_stride() { return static_cast<std::size_t>(gridDim.x) * blockDim.x; }

// The wire type's cast, round to nearest even (the host implementation's rule).
template <wire W>
__device__ std::uint16_t to_wire16(float y) {
  if constexpr (W == wire::f16) {
    return __half_as_ushort(__float2half_rn(y));
  } else {
    return __bfloat16_as_ushort(__float2bfloat16_rn(y));
  }
}

template <wire W>
__device__ float from_wire16(std::uint16_t b) {
  if constexpr (W == wire::f16) {
    return __half2float(__ushort_as_half(b));
  } else {
    return __bfloat162float(__ushort_as_bfloat16(b));
  }
}

template <wire W>
__global__ void encode16_vec(const float4* src, uint2* dst, std::size_t quads, float scale, float limit) {
  for (std::size_t i = first_index(); i < quads; i += grid_stride()) {
    const float4 x = src[i];
    const std::uint32_t lo = to_wire16<W>(scale_saturate(x.x, scale, limit)) |
                             (std::uint32_t{to_wire16<W>(scale_saturate(x.y, scale, limit))} << 16);
    const std::uint32_t hi = to_wire16<W>(scale_saturate(x.z, scale, limit)) |
                             (std::uint32_t{to_wire16<W>(scale_saturate(x.w, scale, limit))} << 16);
    dst[i] = make_uint2(lo, hi);
  }
}

template <wire W>
__global__ void encode16_scalar(const float* src, std::uint16_t* dst, std::size_t count, float scale,
                                float limit) {
  for (std::size_t i = first_index(); i < count; i += grid_stride()) {
    dst[i] = to_wire16<W>(scale_saturate(src[i], scale, limit));
  }
}

__global__ void encode32_vec(const float4* src, float4* dst, std::size_t quads, float scale, float limit) {
  for (std::size_t i = first_index(); i < quads; i += grid_stride()) {
    const float4 x = src[i];
    dst[i] = make_float4(scale_saturate(x.x, scale, limit), scale_saturate(x.y, scale, limit),
                         scale_saturate(x.z, scale, limit), scale_saturate(x.w, scale, limit));
  }
}

__global__ void encode32_scalar(const float* src, float* dst, std::size_t count, float scale, float limit) {
  for (std::size_t i = first_index(); i < count; i += grid_stride())
    dst[i] = scale_saturate(src[i], scale, limit);
}

template <wire W>
__global__ void decode16_vec(const uint2* src, float4* dst, std::size_t quads) {
  for (std::size_t i = first_index(); i < quads; i += grid_stride()) {
    const uint2 w = src[i];
    dst[i] = make_float4(from_wire16<W>(static_cast<std::uint16_t>(w.x & 0xffffu)),
                         from_wire16<W>(static_cast<std::uint16_t>(w.x >> 16)),
                         from_wire16<W>(static_cast<std::uint16_t>(w.y & 0xffffu)),
                         from_wire16<W>(static_cast<std::uint16_t>(w.y >> 16)));
  }
}

template <wire W>
__global__ void decode16_scalar(const std::uint16_t* src, float* dst, std::size_t count) {
  for (std::size_t i = first_index(); i < count; i += grid_stride()) dst[i] = from_wire16<W>(src[i]);
}

__global__ void fill_kernel(float* dst, std::size_t count, float base, float scale, std::uint64_t seed,
                            std::uint32_t ranks) {
  for (std::size_t i = first_index(); i < count; i += grid_stride()) {
    dst[i] = detail::fill_mean(base, scale, seed, ranks, i);
  }
}

// Per-thread maximum and count, a warp reduction, one atomic of each kind per warp. Non-negative floats
// order as their bit patterns, so the maximum is an unsigned atomicMax.
__global__ void compare_kernel(const float* a, const float* b, std::size_t count, float tolerance, float base,
                               float scale, std::uint64_t seed, std::uint32_t ranks, unsigned* max_bits,
                               unsigned long long* wrong) {
  float worst = 0;
  unsigned long long bad = 0;
  for (std::size_t i = first_index(); i < count; i += grid_stride()) {
    const float want = b != nullptr ? b[i] : detail::fill_mean(base, scale, seed, ranks, i);
    const float d = detail::compare_diff(a[i], want);
    worst = fmaxf(worst, d);
    if (d > tolerance) ++bad;
  }
  for (int offset = 16; offset > 0; offset /= 2) {
    worst = fmaxf(worst, __shfl_down_sync(0xffffffffu, worst, offset));
    bad += __shfl_down_sync(0xffffffffu, bad, offset);
  }
  if ((threadIdx.x & 31) == 0) {
    atomicMax(max_bits, __float_as_uint(worst));
    if (bad != 0) atomicAdd(wrong, bad);
  }
}

// The comparison's result starts at zero; a kernel rather than a memset, since the result may be pinned
// host memory.
__global__ void zero_result(unsigned* max_bits, unsigned long long* wrong) {
  *max_bits = 0;
  *wrong = 0;
}

bool aligned(const void* p, std::size_t n) { return reinterpret_cast<std::uintptr_t>(p) % n == 0; }

template <wire W>
cudaError_t encode16(const float* src, void* dst, std::size_t count, float scale, float limit,
                     cudaStream_t stream) {
  auto* out = static_cast<std::uint16_t*>(dst);
  std::size_t done = 0;
  if (aligned(src, 16) && aligned(dst, 8) && count >= 4) {
    const std::size_t quads = count / 4;
    encode16_vec<W><<<blocks_for(quads, codec_per_sm), threads, 0, stream>>>(
        reinterpret_cast<const float4*>(src), reinterpret_cast<uint2*>(out), quads, scale, limit);
    done = quads * 4;
  }
  if (done < count) {
    encode16_scalar<W><<<blocks_for(count - done, codec_per_sm), threads, 0, stream>>>(
        src + done, out + done, count - done, scale, limit);
  }
  return cudaGetLastError();
}

template <wire W>
cudaError_t decode16(const void* src, float* dst, std::size_t count, cudaStream_t stream) {
  const auto* in = static_cast<const std::uint16_t*>(src);
  std::size_t done = 0;
  if (aligned(src, 8) && aligned(dst, 16) && count >= 4) {
    const std::size_t quads = count / 4;
    decode16_vec<W><<<blocks_for(quads, codec_per_sm), threads, 0, stream>>>(
        reinterpret_cast<const uint2*>(in), reinterpret_cast<float4*>(dst), quads);
    done = quads * 4;
  }
  if (done < count) {
    decode16_scalar<W>
        <<<blocks_for(count - done, codec_per_sm), threads, 0, stream>>>(in + done, dst + done, count - done);
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_encode(wire w, const float* src, void* dst, std::size_t count, float scale, float limit,
                          cudaStream_t stream) {
  switch (w) {
    case wire::f16: return encode16<wire::f16>(src, dst, count, scale, limit, stream);
    case wire::bf16: return encode16<wire::bf16>(src, dst, count, scale, limit, stream);
    case wire::f32: break;
  }
  auto* out = static_cast<float*>(dst);
  std::size_t done = 0;
  if (aligned(src, 16) && aligned(dst, 16) && count >= 4) {
    const std::size_t quads = count / 4;
    encode32_vec<<<blocks_for(quads, codec_per_sm), threads, 0, stream>>>(
        reinterpret_cast<const float4*>(src), reinterpret_cast<float4*>(out), quads, scale, limit);
    done = quads * 4;
  }
  if (done < count) {
    encode32_scalar<<<blocks_for(count - done, codec_per_sm), threads, 0, stream>>>(
        src + done, out + done, count - done, scale, limit);
  }
  return cudaGetLastError();
}

cudaError_t launch_decode(wire w, const void* src, float* dst, std::size_t count, cudaStream_t stream) {
  switch (w) {
    case wire::f16: return decode16<wire::f16>(src, dst, count, stream);
    case wire::bf16: return decode16<wire::bf16>(src, dst, count, stream);
    case wire::f32: break;
  }
  if (src == dst) return cudaSuccess;
  return cudaMemcpyAsync(dst, src, count * sizeof(float), cudaMemcpyDefault, stream);
}

cudaError_t launch_fill(float* dst, std::size_t count, float base, float scale, std::uint64_t seed,
                        std::uint32_t ranks, cudaStream_t stream) {
  fill_kernel<<<blocks_for(count, whole_gpu_per_sm), threads, 0, stream>>>(dst, count, base, scale, seed,
                                                                           ranks);
  return cudaGetLastError();
}

cudaError_t launch_compare(const float* a, const float* b, std::size_t count, float tolerance, float base,
                           float scale, std::uint64_t seed, std::uint32_t ranks, void* result,
                           cudaStream_t stream) {
  auto* bytes = static_cast<unsigned char*>(result);
  auto* max_bits = reinterpret_cast<unsigned*>(bytes);
  auto* wrong = reinterpret_cast<unsigned long long*>(bytes + 8);
  zero_result<<<1, 1, 0, stream>>>(max_bits, wrong);
  if (count != 0) {
    compare_kernel<<<blocks_for(count, whole_gpu_per_sm), threads, 0, stream>>>(
        a, b, count, tolerance, base, scale, seed, ranks, max_bits, wrong);
  }
  return cudaGetLastError();
}

}  // namespace ferry::comm::cuda_kernels
