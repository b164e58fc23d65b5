// Per-sample crop boxes for image batches: torchvision's RandomResizedCrop (and a center crop) drawn from
// ferry's own generator, seeded by each sample's 64-bit seed, so the CPU decode, the device decode and a
// Python reference produce the same integers for the same seed.
//
// Generator (Note [Crop box generator]): splitmix64 with the sample's seed as its state; next() adds
// 0x9e3779b97f4a7c15 to the state and returns the state mixed (z ^= z >> 30, z *= 0xbf58476d1ce4e5b9,
// z ^= z >> 27, z *= 0x94d049bb133111eb, z ^= z >> 31). A uniform double in [0, 1) is (next() >> 11) * 2^-53;
// an integer in [0, n) is the high 64 bits of next() * n (128-bit product).
//
// Draw order of random_resized (torchvision RandomResizedCrop.get_params, doubles throughout): for each of
// 10 attempts, area = h * w * uniform(scale_min, scale_max), then log_ratio = uniform(log(ratio_min),
// log(ratio_max)), aspect = exp(log_ratio), bw = round(sqrt(area * aspect)), bh = round(sqrt(area /
// aspect)) (round half to even, as Python's round); when 0 < bw <= w and 0 < bh <= h, top = integer in
// [0, h - bh + 1) then left = integer in [0, w - bw + 1) and the attempts end. After 10 misses, the
// fallback: the whole image, its width cut to round(h * ratio_max) when w / h > ratio_max, its height cut to
// round(w / ratio_min) when w / h < ratio_min, centered with floor division. Then, when flip_probability > 0,
// one more draw: flip = uniform() < flip_probability. `uniform(a, b)` is a + (b - a) * uniform().
//
// Host only.
#pragma once

#include <cstdint>
#include <span>

namespace ferry::image {

/// A crop in the source image's full-resolution pixels, as the C ABI passes it (int32[5]):
/// rows [top, top + height), columns [left, left + width); flip 1 mirrors the output left-right.
struct crop_box {
  std::int32_t top = 0;
  std::int32_t left = 0;
  std::int32_t height = 0;
  std::int32_t width = 0;
  std::int32_t flip = 0;

  friend bool operator==(const crop_box&, const crop_box&) = default;
};
static_assert(sizeof(crop_box) == 5 * sizeof(std::int32_t));

/// How a batch's boxes are chosen.
enum class crop_mode : std::int32_t {
  random_resized = 0,  // torchvision RandomResizedCrop(size, scale, ratio) + RandomHorizontalFlip(p)
  center = 1,          // Resize(size / crop_fraction) + CenterCrop(size): the largest centered square
                       // scaled by crop_fraction; no flip
  full = 2             // the whole image (resized to size x size, aspect not kept); no flip
};

/// The parameters of the modes (torchvision's defaults).
struct crop_params {
  double scale_min = 0.08;
  double scale_max = 1.0;
  double ratio_min = 3.0 / 4.0;
  double ratio_max = 4.0 / 3.0;
  double flip_probability = 0.5;         // random_resized only
  double crop_fraction = 224.0 / 256.0;  // center only
};

/// splitmix64, the generator of the boxes (Note [Crop box generator] above).
class crop_rng {
 public:
  explicit constexpr crop_rng(std::uint64_t seed) noexcept : state_(seed) {}
  constexpr std::uint64_t next() noexcept {
    state_ += 0x9e3779b97f4a7c15ULL;
    std::uint64_t z = state_;
    z = (z ^ (z >> 30U)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27U)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31U);
  }
  /// [0, 1), 53 random bits.
  constexpr double uniform() noexcept { return static_cast<double>(next() >> 11U) * 0x1.0p-53; }
  /// [0, n) for n >= 1: the high 64 bits of next() * n.
  constexpr std::uint64_t below(std::uint64_t n) noexcept { return mul_high(next(), n); }
  /// The high 64 bits of the 128-bit product a * b.
  static constexpr std::uint64_t mul_high(std::uint64_t a, std::uint64_t b) noexcept {
    const std::uint64_t a_lo = a & 0xFFFFFFFFU;
    const std::uint64_t a_hi = a >> 32U;
    const std::uint64_t b_lo = b & 0xFFFFFFFFU;
    const std::uint64_t b_hi = b >> 32U;
    const std::uint64_t hi_lo = a_hi * b_lo;
    const std::uint64_t cross = ((a_lo * b_lo) >> 32U) + (hi_lo & 0xFFFFFFFFU) + a_lo * b_hi;
    return a_hi * b_hi + (hi_lo >> 32U) + (cross >> 32U);
  }

 private:
  std::uint64_t state_;
};

/// Throws logic_error naming the parameter when `p` is out of range (scale in (0, 1], scale_min <=
/// scale_max, ratio > 0, ratio_min <= ratio_max, flip_probability and crop_fraction in [0, 1] and (0, 1]).
void validate(const crop_params& p);

/// The box of one sample of `height` x `width` pixels (both >= 1; logic_error otherwise) for `seed`.
/// Does not validate `p` (call validate() once per batch).
[[nodiscard]] crop_box make_crop_box(std::int32_t height, std::int32_t width, std::uint64_t seed,
                                     crop_mode mode, const crop_params& p);

/// make_crop_box for each sample i of heights[i] x widths[i] and seeds[i] into out[i]; validates `p` and
/// the sizes first (logic_error naming the sample). All spans of one length.
void make_crop_boxes(std::span<const std::int32_t> heights, std::span<const std::int32_t> widths,
                     std::span<const std::uint64_t> seeds, crop_mode mode, const crop_params& p,
                     std::span<crop_box> out);

/// Throws logic_error naming the box and the image size unless `b` lies inside a height x width image
/// with height, width >= 1 and flip 0 or 1.
void validate(const crop_box& b, std::int32_t height, std::int32_t width);

}  // namespace ferry::image
