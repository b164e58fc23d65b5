// The C ABI's GPU JPEG decoder (ferry/image/gpu_decoder.hpp). The same functions on every build: without
// CUDA, or without nvJPEG, creating a decoder fails naming why, and where nvJPEG is can be asked anywhere.
#include <fmt/format.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <vector>

#include "api.hpp"
#include "ferry/core/error.hpp"
#include "ferry/image/gpu_decoder.hpp"
#include "interop.hpp"

struct ferry_jpeg_decoder {
  std::shared_ptr<ferry::c_api::device_state> state;
  std::unique_ptr<ferry::image::gpu_jpeg_decoder> decoder;
};

namespace {

using ferry::c_api::checked;
using ferry::c_api::dup_string;
using ferry::c_api::expect_out;
using ferry::c_api::guard;

// {"backend": "auto" | "hardware" | "software", "buffers": N, "threads": N, "library_dirs": ["folder", ...]};
// all but library_dirs only where `decoder_keys` (ferry_jpeg_decoder_create).
ferry::image::gpu_decoder_options options_of(const char* json, const char* fn, bool decoder_keys) {
  ferry::image::gpu_decoder_options o;
  if (json == nullptr || *json == '\0') return o;
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(json);
  } catch (const nlohmann::json::exception& e) {
    throw ferry::logic_error(fmt::format("{}: options {} are not JSON: {}", fn, json, e.what()));
  }
  FERRY_EXPECTS(j.is_object(), fmt::format("{}: options {} are not a JSON object", fn, json));
  const char* keys = decoder_keys ? "backend, buffers, threads, library_dirs" : "library_dirs";
  for (const auto& [key, value] : j.items()) {
    if (key == "library_dirs") {
      FERRY_EXPECTS(value.is_array(),
                    fmt::format("{}: library_dirs = {}: expected a list of folders", fn, value.dump()));
      for (const auto& d : value) {
        FERRY_EXPECTS(d.is_string(),
                      fmt::format("{}: library_dirs holds {}: expected folder names", fn, d.dump()));
        o.library_dirs.push_back(d.get<std::string>());
      }
    } else if (decoder_keys && key == "backend") {
      const std::string b = value.is_string() ? value.get<std::string>() : value.dump();
      if (b == "auto") {
        o.backend = ferry::image::gpu_backend::automatic;
      } else if (b == "hardware") {
        o.backend = ferry::image::gpu_backend::hardware;
      } else if (b == "software") {
        o.backend = ferry::image::gpu_backend::software;
      } else {
        throw ferry::logic_error(
            fmt::format("{}: backend '{}': expected \"auto\", \"hardware\" or \"software\"", fn, b));
      }
    } else if (decoder_keys && key == "buffers") {
      FERRY_EXPECTS(value.is_number_integer(),
                    fmt::format("{}: buffers = {}: expected an integer 1..8", fn, value.dump()));
      const auto b = value.get<long long>();  // NOLINT(google-runtime-int): nlohmann's integer type
      FERRY_EXPECTS(b >= 1 && b <= 8, fmt::format("{}: buffers = {}: expected 1..8", fn, b));
      o.buffers = static_cast<int>(b);
    } else if (decoder_keys && key == "threads") {
      constexpr int most = ferry::image::max_decode_threads;
      FERRY_EXPECTS(value.is_number_integer(),
                    fmt::format("{}: threads = {}: expected an integer 1..{}", fn, value.dump(), most));
      const auto t = value.get<long long>();  // NOLINT(google-runtime-int): nlohmann's integer type
      FERRY_EXPECTS(t >= 1 && t <= most, fmt::format("{}: threads = {}: expected 1..{}", fn, t, most));
      o.threads = static_cast<int>(t);
    } else {
      throw ferry::logic_error(fmt::format("{}: option '{}' is not one of {}", fn, key, keys));
    }
  }
  return o;
}

}  // namespace

extern "C" {

int ferry_jpeg_gpu_library_json(const char* options_json, char** out) {
  return guard([&] {
    expect_out(out, "ferry_jpeg_gpu_library_json");
    const auto o = options_of(options_json, "ferry_jpeg_gpu_library_json", false);
    *out = dup_string(ferry::image::nvjpeg_library_json(o.library_dirs));
  });
}

int ferry_jpeg_decoder_create(ferry_device* dev, const char* options_json, ferry_jpeg_decoder** out) {
  return guard([&] {
    expect_out(out, "ferry_jpeg_decoder_create");
    const auto o = options_of(options_json, "ferry_jpeg_decoder_create", true);
    auto& d = checked(dev, "ferry_jpeg_decoder_create");
    auto h = std::make_unique<ferry_jpeg_decoder>();
    h->state = d.state;
    h->decoder = std::make_unique<ferry::image::gpu_jpeg_decoder>(*d.state->dev, o);
    *out = h.release();
  });
}

int ferry_jpeg_decoder_decode(ferry_jpeg_decoder* d, size_t n, const void* const* data, const size_t* lengths,
                              const int32_t* boxes, int32_t size, void* out, int dtype, int layout,
                              const float* mean, const float* std, uintptr_t consumer_stream, int32_t* status,
                              ferry_event** inputs_done) {
  return guard([&] {
    constexpr const char* fn = "ferry_jpeg_decoder_decode";
    auto& h = checked(d, fn);
    FERRY_EXPECTS(n >= 1, fmt::format("{}: n = 0; a batch has at least one sample", fn));
    FERRY_EXPECTS(data != nullptr && lengths != nullptr && boxes != nullptr,
                  fmt::format("{}: data, lengths and boxes must not be NULL", fn));
    FERRY_EXPECTS(
        dtype >= 0 && dtype <= 3,
        fmt::format("{}: dtype {} is not 0 (uint8), 1 (float32), 2 (bfloat16) or 3 (float16)", fn, dtype));
    FERRY_EXPECTS(layout == 0 || layout == 1,
                  fmt::format("{}: layout {} is not 0 (NCHW) or 1 (NHWC)", fn, layout));
    ferry::image::gpu_decode_batch b;
    b.data = std::span<const void* const>(data, n);
    b.lengths = std::span<const std::size_t>(lengths, n);
    b.boxes =
        std::span<const ferry::image::crop_box>(reinterpret_cast<const ferry::image::crop_box*>(boxes), n);
    b.size = size;
    b.dtype = static_cast<ferry::image::output_dtype>(dtype);
    b.layout = static_cast<ferry::image::pixel_layout>(layout);
    for (int c = 0; c < 3; ++c) {
      if (mean != nullptr) b.mean[c] = mean[c];
      if (std != nullptr) b.std[c] = std[c];
    }
    b.out = out;
    if (status != nullptr) b.status = std::span<std::int32_t>(status, n);
    auto& st = *h.state;
    const ferry::stream_view consumer = ferry::c_api::producer_view(st, consumer_stream);
    ferry::event done;
    h.decoder->decode(b, consumer, inputs_done != nullptr ? &done : nullptr);
    // A default stream's later work waits for the kernel, which ran on the bridge after the default
    // stream's queued work.
    if (ferry::c_api::is_default_stream(st, consumer_stream))
      ferry::c_api::join_into(st, consumer_stream, consumer);
    if (inputs_done != nullptr) *inputs_done = new ferry_event{h.state, std::move(done)};
  });
}

int ferry_jpeg_decoder_image(ferry_jpeg_decoder* d, size_t index, uint8_t* out, size_t out_bytes,
                             int32_t* height, int32_t* width, int32_t* channels) {
  return guard([&] {
    auto& h = checked(d, "ferry_jpeg_decoder_image");
    FERRY_EXPECTS(out != nullptr || out_bytes == 0,
                  "ferry_jpeg_decoder_image: out is NULL but out_bytes is not 0");
    const ferry::image::decoded_image img = h.decoder->last_image(
        index, out == nullptr ? std::span<std::uint8_t>() : std::span<std::uint8_t>(out, out_bytes));
    if (height != nullptr) *height = img.height;
    if (width != nullptr) *width = img.width;
    if (channels != nullptr) *channels = img.channels;
  });
}

int ferry_jpeg_decoder_stats_json(ferry_jpeg_decoder* d, char** out) {
  return guard([&] {
    expect_out(out, "ferry_jpeg_decoder_stats_json");
    *out = dup_string(checked(d, "ferry_jpeg_decoder_stats_json").decoder->stats_json());
  });
}

void ferry_jpeg_decoder_destroy(ferry_jpeg_decoder* d) { delete d; }

}  // extern "C"
