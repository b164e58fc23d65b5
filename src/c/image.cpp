// The C ABI's image functions: the JPEG header parse, the crop boxes and the CPU decode (ferry::image).
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <mutex>
#include <span>
#include <thread>
#include <vector>

#include "api.hpp"
#include "ferry/core/error.hpp"
#include "ferry/image/crop_box.hpp"
#include "ferry/image/jpeg_decode.hpp"
#include "ferry/image/jpeg_info.hpp"

using ferry::c_api::expect_out;
using ferry::c_api::guard;
namespace image = ferry::image;

namespace {

std::span<const std::byte> bytes_of(const void* bytes, std::size_t size, const char* fn) {
  FERRY_EXPECTS(bytes != nullptr || size == 0, fmt::format("{}: the bytes are NULL", fn));
  return {static_cast<const std::byte*>(bytes), size};
}

image::crop_box box_of(const std::int32_t* b) { return image::crop_box{b[0], b[1], b[2], b[3], b[4]}; }

image::pixel_layout layout_of(int layout) {
  FERRY_EXPECTS(layout == 0 || layout == 1, fmt::format("layout {} is neither CHW (0) nor HWC (1)", layout));
  return static_cast<image::pixel_layout>(layout);
}

std::size_t sample_bytes(std::int32_t out_size) {
  FERRY_EXPECTS(out_size >= 1 && out_size <= image::max_output_size,
                fmt::format("output size {} must lie in [1, {}]", out_size, image::max_output_size));
  return std::size_t{3} * static_cast<std::size_t>(out_size) * static_cast<std::size_t>(out_size);
}

}  // namespace

extern "C" {

int ferry_jpeg_info(const void* bytes, size_t size, int32_t* out) {
  return guard([&] {
    expect_out(out, "ferry_jpeg_info");
    const image::jpeg_info info = image::read_jpeg_info(bytes_of(bytes, size, "ferry_jpeg_info"));
    out[0] = static_cast<std::int32_t>(info.status);
    out[1] = info.height;
    out[2] = info.width;
    out[3] = info.components;
    out[4] = static_cast<std::int32_t>(info.process);
    out[5] = info.precision;
    out[6] = static_cast<std::int32_t>(info.adobe_transform);  // -1, 0, 1 or 2
    out[7] = info.decodable() ? 1 : 0;
    out[8] = static_cast<std::int32_t>(std::min<std::size_t>(info.offset, INT32_MAX));
  });
}

const char* ferry_jpeg_refusal(const void* bytes, size_t size) {
  if (bytes == nullptr && size > 0) return "the bytes are NULL";
  return image::undecodable_reason(image::read_jpeg_info({static_cast<const std::byte*>(bytes), size}));
}

int ferry_image_boxes(size_t n, const int32_t* heights, const int32_t* widths, const uint64_t* seeds,
                      int mode, const double* params, int32_t* boxes) {
  return guard([&] {
    FERRY_EXPECTS(n == 0 || (heights != nullptr && widths != nullptr && seeds != nullptr && boxes != nullptr),
                  fmt::format("ferry_image_boxes: a NULL array for {} samples", n));
    FERRY_EXPECTS(mode >= 0 && mode <= 2,
                  fmt::format("crop mode {} is none of random-resized (0), center (1) and full (2)", mode));
    image::crop_params p;
    if (params != nullptr) {
      p.scale_min = params[0];
      p.scale_max = params[1];
      p.ratio_min = params[2];
      p.ratio_max = params[3];
      p.flip_probability = params[4];
      p.crop_fraction = params[5];
    }
    static_assert(sizeof(image::crop_box) == 5 * sizeof(std::int32_t));
    image::make_crop_boxes({heights, n}, {widths, n}, {seeds, n}, static_cast<image::crop_mode>(mode), p,
                           // NOLINTNEXTLINE(cppcoreguidelines-pro-type-reinterpret-cast): int32[5] per box
                           {reinterpret_cast<image::crop_box*>(boxes), n});
  });
}

int ferry_jpeg_decode_crop(const void* bytes, size_t size, const int32_t* box, int32_t out_size, int layout,
                           void* out, size_t out_bytes) {
  return guard([&] {
    FERRY_EXPECTS(box != nullptr, "ferry_jpeg_decode_crop: the box is NULL");
    expect_out(out, "ferry_jpeg_decode_crop");
    image::decode_jpeg_crop(bytes_of(bytes, size, "ferry_jpeg_decode_crop"), box_of(box), out_size,
                            layout_of(layout), static_cast<std::uint8_t*>(out), out_bytes);
  });
}

int ferry_jpeg_decode_crop_batch(size_t n, const void* const* data, const size_t* sizes, const int32_t* boxes,
                                 int32_t out_size, int layout, void* out, size_t out_stride, int threads) {
  return guard([&] {
    const std::size_t need = sample_bytes(out_size);
    const image::pixel_layout lay = layout_of(layout);
    if (n == 0) return;
    FERRY_EXPECTS(data != nullptr && sizes != nullptr && boxes != nullptr,
                  fmt::format("ferry_jpeg_decode_crop_batch: a NULL array for {} samples", n));
    expect_out(out, "ferry_jpeg_decode_crop_batch");
    FERRY_EXPECTS(out_stride >= need,
                  fmt::format("an output stride of {} bytes cannot hold a 3 x {} x {} sample "
                              "({} bytes)",
                              out_stride, out_size, out_size, need));
    FERRY_EXPECTS(threads >= 0, fmt::format("threads {} must be >= 0 (0: one per core)", threads));
    auto* base = static_cast<std::uint8_t*>(out);
    std::atomic<std::size_t> next{0};
    std::mutex mu;
    std::size_t failed = n;  // the lowest failing sample
    std::exception_ptr error;
    auto work = [&] {
      for (std::size_t i = next.fetch_add(1); i < n; i = next.fetch_add(1)) {
        try {
          FERRY_EXPECTS(data[i] != nullptr || sizes[i] == 0, "its bytes are NULL");
          image::decode_jpeg_crop({static_cast<const std::byte*>(data[i]), sizes[i]}, box_of(boxes + 5 * i),
                                  out_size, lay, base + i * out_stride, need);
        } catch (...) {
          const std::lock_guard lock(mu);
          if (i < failed) {
            failed = i;
            error = std::current_exception();
          }
        }
      }
    };
    std::size_t count = threads > 0 ? static_cast<std::size_t>(threads) : std::thread::hardware_concurrency();
    count = std::clamp<std::size_t>(count, 1, n);
    {
      std::vector<std::jthread> pool;
      pool.reserve(count - 1);
      for (std::size_t t = 1; t < count; ++t) pool.emplace_back(work);
      work();
    }
    if (error) {
      try {
        std::rethrow_exception(error);
      } catch (const ferry::input_error& e) {
        throw ferry::input_error(fmt::format("sample {} of {}: {}", failed, n, e.what()));
      } catch (const std::exception& e) {
        throw ferry::logic_error(fmt::format("sample {} of {}: {}", failed, n, e.what()));
      }
    }
  });
}

}  // extern "C"
