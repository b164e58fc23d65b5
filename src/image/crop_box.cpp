#include "ferry/image/crop_box.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>

#include "ferry/core/error.hpp"

namespace ferry::image {

namespace {

constexpr int attempts = 10;  // torchvision RandomResizedCrop.get_params

// Python's round() of a finite double to an integer: half to even (std::nearbyint in the default rounding
// mode, which ferry never changes).
std::int64_t round_half_even(double x) noexcept { return static_cast<std::int64_t>(std::nearbyint(x)); }

crop_box random_resized(std::int32_t height, std::int32_t width, std::uint64_t seed, const crop_params& p) {
  crop_rng rng(seed);
  const double area = static_cast<double>(height) * static_cast<double>(width);
  const double log_min = std::log(p.ratio_min);
  const double log_max = std::log(p.ratio_max);
  crop_box b;
  bool found = false;
  for (int i = 0; i < attempts && !found; ++i) {
    const double target = area * (p.scale_min + (p.scale_max - p.scale_min) * rng.uniform());
    const double aspect = std::exp(log_min + (log_max - log_min) * rng.uniform());
    const std::int64_t w = round_half_even(std::sqrt(target * aspect));
    const std::int64_t h = round_half_even(std::sqrt(target / aspect));
    if (w > 0 && w <= width && h > 0 && h <= height) {
      b.height = static_cast<std::int32_t>(h);
      b.width = static_cast<std::int32_t>(w);
      b.top = static_cast<std::int32_t>(rng.below(static_cast<std::uint64_t>(height - h + 1)));
      b.left = static_cast<std::int32_t>(rng.below(static_cast<std::uint64_t>(width - w + 1)));
      found = true;
    }
  }
  if (!found) {
    const double in_ratio = static_cast<double>(width) / static_cast<double>(height);
    std::int64_t w = width;
    std::int64_t h = height;
    if (in_ratio < p.ratio_min) {
      h = round_half_even(static_cast<double>(width) / p.ratio_min);
    } else if (in_ratio > p.ratio_max) {
      w = round_half_even(static_cast<double>(height) * p.ratio_max);
    }
    // Rounding keeps both within the image (w/h between the ratios); the clamps guard odd parameters.
    h = std::clamp<std::int64_t>(h, 1, height);
    w = std::clamp<std::int64_t>(w, 1, width);
    b.height = static_cast<std::int32_t>(h);
    b.width = static_cast<std::int32_t>(w);
    b.top = static_cast<std::int32_t>((height - h) / 2);
    b.left = static_cast<std::int32_t>((width - w) / 2);
  }
  if (p.flip_probability > 0.0) b.flip = rng.uniform() < p.flip_probability ? 1 : 0;
  return b;
}

crop_box center(std::int32_t height, std::int32_t width, const crop_params& p) {
  const std::int32_t side = std::min(height, width);
  const auto s = static_cast<std::int32_t>(
      std::clamp<std::int64_t>(round_half_even(static_cast<double>(side) * p.crop_fraction), 1, side));
  return crop_box{(height - s) / 2, (width - s) / 2, s, s, 0};
}

}  // namespace

void validate(const crop_params& p) {
  FERRY_EXPECTS(std::isfinite(p.scale_min) && std::isfinite(p.scale_max) && p.scale_min > 0.0 &&
                    p.scale_max <= 1.0 && p.scale_min <= p.scale_max,
                fmt::format("crop scale ({}, {}) must satisfy 0 < scale_min <= scale_max <= 1", p.scale_min,
                            p.scale_max));
  FERRY_EXPECTS(
      std::isfinite(p.ratio_min) && std::isfinite(p.ratio_max) && p.ratio_min > 0.0 &&
          p.ratio_min <= p.ratio_max,
      fmt::format("crop ratio ({}, {}) must satisfy 0 < ratio_min <= ratio_max", p.ratio_min, p.ratio_max));
  FERRY_EXPECTS(p.flip_probability >= 0.0 && p.flip_probability <= 1.0,
                fmt::format("flip probability {} must lie in [0, 1]", p.flip_probability));
  FERRY_EXPECTS(p.crop_fraction > 0.0 && p.crop_fraction <= 1.0,
                fmt::format("crop fraction {} must lie in (0, 1]", p.crop_fraction));
}

crop_box make_crop_box(std::int32_t height, std::int32_t width, std::uint64_t seed, crop_mode mode,
                       const crop_params& p) {
  FERRY_EXPECTS(height >= 1 && width >= 1,
                fmt::format("an image of {} x {} pixels has no crop box; height and width must be >= 1",
                            height, width));
  switch (mode) {
    case crop_mode::random_resized: return random_resized(height, width, seed, p);
    case crop_mode::center: return center(height, width, p);
    case crop_mode::full: return crop_box{0, 0, height, width, 0};
  }
  FERRY_EXPECTS(false, fmt::format("crop mode {} is none of random_resized (0), center (1) and full (2)",
                                   static_cast<int>(mode)));
  return {};
}

void make_crop_boxes(std::span<const std::int32_t> heights, std::span<const std::int32_t> widths,
                     std::span<const std::uint64_t> seeds, crop_mode mode, const crop_params& p,
                     std::span<crop_box> out) {
  FERRY_EXPECTS(
      widths.size() == heights.size() && seeds.size() == heights.size() && out.size() == heights.size(),
      fmt::format("crop boxes: {} heights, {} widths, {} seeds and {} outputs must be as many",
                  heights.size(), widths.size(), seeds.size(), out.size()));
  validate(p);
  for (std::size_t i = 0; i < heights.size(); ++i) {
    FERRY_EXPECTS(
        heights[i] >= 1 && widths[i] >= 1,
        fmt::format("sample {} is {} x {} pixels; height and width must be >= 1", i, heights[i], widths[i]));
    out[i] = make_crop_box(heights[i], widths[i], seeds[i], mode, p);
  }
}

void validate(const crop_box& b, std::int32_t height, std::int32_t width) {
  FERRY_EXPECTS(height >= 1 && width >= 1,
                fmt::format("an image of {} x {} pixels cannot be cropped", height, width));
  FERRY_EXPECTS(
      b.top >= 0 && b.left >= 0 && b.height >= 1 && b.width >= 1 &&
          std::int64_t{b.top} + b.height <= height && std::int64_t{b.left} + b.width <= width,
      fmt::format("crop box (top {}, left {}, height {}, width {}) does not lie inside the {} x {} image",
                  b.top, b.left, b.height, b.width, height, width));
  FERRY_EXPECTS(b.flip == 0 || b.flip == 1, fmt::format("crop box flip {} must be 0 or 1", b.flip));
}

}  // namespace ferry::image
