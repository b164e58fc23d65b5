// The arithmetic of the GPU decoder's kernel (resize_kernel.cu), for the host too: Pillow's BILINEAR resample
// of one output pixel of a crop (Note [Pillow's BILINEAR on the GPU] in resize_kernel.cu). Compiled by nvcc
// for the kernel, and by a host compiler in tests/python/test_image_gpu.py, which checks it against PIL
// (with -ffp-contract=off: no fused multiply-add there either). Needs no CUDA header.
#pragma once

#include <cstdint>

#ifdef __CUDACC__
#define FERRY_HD __host__ __device__
#else
#define FERRY_HD
#endif

namespace ferry::image::cuda_kernels {

/// One sample as the kernel reads it (the decoder's table, in device memory).
struct sample_desc {
  const std::uint8_t* planes = nullptr;  // plane 0; plane c at planes + c * plane_bytes
  std::uint64_t plane_bytes = 0;
  std::int32_t pitch = 0;     // bytes from one row of a plane to the next
  std::int32_t channels = 0;  // 3: RGB planes; 1: one luma plane, replicated; 0: not decoded, write zeros
  std::int32_t top = 0;       // the crop box, in the planes' pixels
  std::int32_t left = 0;
  std::int32_t height = 0;
  std::int32_t width = 0;
  std::int32_t flip = 0;  // 1: mirror the output left-right
  std::int32_t unused = 0;
};
static_assert(sizeof(sample_desc) == 48);

inline constexpr int precision_bits = 32 - 8 - 2;  // Pillow's PRECISION_BITS for 8-bit images
inline constexpr int half_unit = 1 << (precision_bits - 1);
inline constexpr int cached_taps = 32;  // horizontal weights kept per thread; a wider window recomputes them

// One output index's window on one axis of the crop, as precompute_coeffs computes it.
struct axis {
  int first = 0;  // first input index, relative to the crop
  int count = 0;  // inputs in the window
  double center = 0;
  double ss = 0;  // 1 / filterscale
  double ww = 0;  // the sum of the window's filter values
};

FERRY_HD inline double triangle(double x) {
  if (x < 0.0) x = -x;
  return x < 1.0 ? 1.0 - x : 0.0;
}

FERRY_HD inline double filter_at(const axis& a, int k) {
  return triangle((static_cast<double>(k + a.first) - a.center + 0.5) * a.ss);
}

FERRY_HD inline axis axis_of(int in_size, int out_size, int o) {
  axis a;
  // Pillow: scale = (double)(in1 - in0) / outSize with the float box (0, in_size); center = in0 + (o + 0.5)
  // * scale with in0 = 0.0f.
  const double scale = static_cast<double>(static_cast<float>(in_size)) / out_size;
  const double filterscale = scale < 1.0 ? 1.0 : scale;
  const double support = 1.0 * filterscale;  // BILINEAR's support is 1
  a.center = 0.0 + (o + 0.5) * scale;
  a.ss = 1.0 / filterscale;
  // Pillow's own rounding, truncation of x + 0.5, kept to the bit: lround would differ for negative values.
  int xmin = static_cast<int>(a.center - support + 0.5);  // NOLINT(bugprone-incorrect-roundings)
  if (xmin < 0) xmin = 0;
  int xmax = static_cast<int>(a.center + support + 0.5);  // NOLINT(bugprone-incorrect-roundings)
  if (xmax > in_size) xmax = in_size;
  a.first = xmin;
  a.count = xmax - xmin;
  double ww = 0.0;
  for (int k = 0; k < a.count; ++k) ww += filter_at(a, k);
  a.ww = ww;
  return a;
}

// normalize_coeffs_8bpc of tap k's normalised weight.
FERRY_HD inline int weight_at(const axis& a, int k) {
  double w = filter_at(a, k);
  if (a.ww != 0.0) w /= a.ww;
  const double scaled = w * static_cast<double>(1 << precision_bits);
  // NOLINTNEXTLINE(bugprone-incorrect-roundings): normalize_coeffs_8bpc's rounding, to the bit
  return w < 0 ? static_cast<int>(-0.5 + scaled) : static_cast<int>(0.5 + scaled);
}

FERRY_HD inline int clip8(int v) {
  v >>= precision_bits;
  return v < 0 ? 0 : (v > 255 ? 255 : v);
}

/// The three channel values (0..255) of output pixel (xo, yo) of sample `s` resized to size x size: the
/// horizontal pass rounds to 8 bits for every source row of the vertical window, then the vertical pass.
FERRY_HD inline void resample_pixel(const sample_desc& s, int size, int xo, int yo, int value[3]) {
  const int xs = s.flip != 0 ? size - 1 - xo : xo;  // the resized column this output pixel shows
  const axis ay = axis_of(s.height, size, yo);
  const axis ax = axis_of(s.width, size, xs);
  int kx[cached_taps];
  const bool cached = ax.count <= cached_taps;
  if (cached) {
    for (int k = 0; k < ax.count; ++k) kx[k] = weight_at(ax, k);
  }
  const int nc = s.channels == 1 ? 1 : 3;
  int acc[3] = {half_unit, half_unit, half_unit};
  for (int j = 0; j < ay.count; ++j) {
    const int ky = weight_at(ay, j);
    const std::uint64_t row =
        static_cast<std::uint64_t>(s.top + ay.first + j) * static_cast<std::uint64_t>(s.pitch);
    for (int c = 0; c < nc; ++c) {
      const std::uint8_t* src =
          s.planes + static_cast<std::uint64_t>(c) * s.plane_bytes + row + s.left + ax.first;
      int h = half_unit;
      for (int k = 0; k < ax.count; ++k) h += static_cast<int>(src[k]) * (cached ? kx[k] : weight_at(ax, k));
      acc[c] += clip8(h) * ky;
    }
  }
  for (int c = 0; c < 3; ++c) value[c] = clip8(acc[nc == 1 ? 0 : c]);
}

}  // namespace ferry::image::cuda_kernels
