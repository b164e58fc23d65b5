// The GPU decoder's one kernel (resize_kernel.cu), callable from host-only translation units: per sample, its
// crop box of the decoded planes resized to size x size as Pillow's BILINEAR does it (resize_math.hpp),
// flipped, and written into the output batch as uint8 or normalised floats (ferry/image/gpu_decoder.hpp).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "resize_math.hpp"

namespace ferry::image::cuda_kernels {

/// The output batch.
struct output_desc {
  void* out = nullptr;        // device memory: n * 3 * size * size elements
  std::int32_t size = 0;      // output side
  std::int32_t dtype = 0;     // output_dtype: 0 uint8, 1 float32, 2 bfloat16, 3 float16
  std::int32_t layout = 0;    // pixel_layout: 0 NCHW, 1 NHWC
  float mean[3] = {0, 0, 0};  // float dtypes: (x / 255 - mean[c]) / std[c]
  float std[3] = {1, 1, 1};
};

/// The largest batch one launch takes (the grid's y dimension).
inline constexpr std::uint32_t max_samples = 65535;

/// Launches the kernel for samples[0..n) (a device array) on `stream`; returns the launch's status.
cudaError_t launch_crop_resize(const sample_desc* samples, std::uint32_t n, const output_desc& out,
                               cudaStream_t stream);

}  // namespace ferry::image::cuda_kernels
