// The GPU decoder's crop, resize, flip and normalisation: one thread per output pixel (all three channels),
// one grid row per sample, the whole batch in one launch.
//
// Note [Pillow's BILINEAR on the GPU]: the reference is PIL's `img.crop(box).resize((size, size),
// Image.BILINEAR)` (torchvision's resized_crop on a PIL image), i.e. Pillow's ImagingResample on the
// cropped image: per axis, precompute_coeffs (the triangle filter, its support scaled by max(1, in / out),
// the window [int(center - support + 0.5), int(center + support + 0.5)) clipped to the crop, weights
// normalised to sum 1) and normalize_coeffs_8bpc (22-bit fixed point, rounded half away from zero); the
// horizontal pass rounds to 8 bits (clip8 of the sum started at 1 << 21), then the vertical pass on those
// values rounds again. Each thread recomputes the coefficients of its own row and column in double
// precision in Pillow's order of operations, and this file is compiled with --fmad=false, so that no
// multiply-add is fused (x86 Pillow fuses none): the weights, and so the 8-bit results, are Pillow's
// exactly. An axis Pillow skips (crop side == size) has identity weights here, which give the same values.
// The float outputs are (float(v) / 255 - mean) / std in float32, then rounded to nearest even for
// bfloat16 and float16, as torch's ToTensor + Normalize + .to(dtype) compute them.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "resize_kernel.hpp"
#include "resize_math.hpp"

namespace ferry::image::cuda_kernels {
namespace {

constexpr unsigned threads = 256;

// Sample blockIdx.y, output pixel blockIdx.x * threads + threadIdx.x.
__global__ void __launch_bounds__(threads) crop_resize_kernel(const sample_desc* samples, output_desc o) {
  const int size = o.size;
  const std::uint64_t pixel = static_cast<std::uint64_t>(blockIdx.x) * threads + threadIdx.x;
  const std::uint64_t plane = static_cast<std::uint64_t>(size) * size;
  if (pixel >= plane) return;
  const int yo = static_cast<int>(pixel / size);
  const int xo = static_cast<int>(pixel % size);
  const std::uint64_t n = blockIdx.y;
  const sample_desc s = samples[n];

  int value[3] = {0, 0, 0};
  const bool decoded = s.channels > 0;
  if (decoded) resample_pixel(s, size, xo, yo, value);

  for (int c = 0; c < 3; ++c) {
    const std::uint64_t at =
        o.layout == 0 ? ((n * 3 + c) * size + yo) * size + xo : ((n * size + yo) * size + xo) * 3 + c;
    if (o.dtype == 0) {
      static_cast<std::uint8_t*>(o.out)[at] = static_cast<std::uint8_t>(value[c]);
      continue;
    }
    const float f = decoded ? (static_cast<float>(value[c]) / 255.0F - o.mean[c]) / o.std[c] : 0.0F;
    if (o.dtype == 1) {
      static_cast<float*>(o.out)[at] = f;
    } else if (o.dtype == 2) {
      static_cast<__nv_bfloat16*>(o.out)[at] = __float2bfloat16_rn(f);
    } else {
      static_cast<__half*>(o.out)[at] = __float2half_rn(f);
    }
  }
}

}  // namespace

cudaError_t launch_crop_resize(const sample_desc* samples, std::uint32_t n, const output_desc& out,
                               cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  if (n > max_samples || out.size <= 0) return cudaErrorInvalidValue;
  const std::uint64_t plane = static_cast<std::uint64_t>(out.size) * static_cast<std::uint64_t>(out.size);
  const dim3 grid(static_cast<unsigned>((plane + threads - 1) / threads), n);
  crop_resize_kernel<<<grid, threads, 0, stream>>>(samples, out);
  return cudaGetLastError();
}

}  // namespace ferry::image::cuda_kernels
