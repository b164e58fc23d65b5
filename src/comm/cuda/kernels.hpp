// comm's cuda kernels (codec_kernels.cu), callable from host-only translation units. Each launcher
// returns the launch status; pointers are device memory (or mapped pinned memory).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace ferry::comm::cuda_kernels {

/// The codecs as the kernels number them (codec_kind's values).
enum class wire : std::uint8_t { f32 = 0, f16 = 1, bf16 = 2 };

/// wire[i] = cast(clamp(src[i] * scale, +-limit)) for i < count (limit applies to finite values).
cudaError_t launch_encode(wire w, const float* src, void* dst, std::size_t count, float scale, float limit,
                          cudaStream_t stream);
/// dst[i] = fp32(src[i]) for i < count.
cudaError_t launch_decode(wire w, const void* src, float* dst, std::size_t count, cudaStream_t stream);
/// dst[i] = fill_mean(base, scale, seed, ranks, i) for i < count.
cudaError_t launch_fill(float* dst, std::size_t count, float base, float scale, std::uint64_t seed,
                        std::uint32_t ranks, cudaStream_t stream);
/// Folds the comparison of a (against b, or the fill formula when b is null) into *result (a
/// detail::diff_result the caller zeroed): the largest difference's bits and the count above tolerance.
cudaError_t launch_compare(const float* a, const float* b, std::size_t count, float tolerance, float base,
                           float scale, std::uint64_t seed, std::uint32_t ranks, void* result,
                           cudaStream_t stream);

}  // namespace ferry::comm::cuda_kernels
