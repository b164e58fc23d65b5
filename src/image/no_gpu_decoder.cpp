// The GPU decoder of a build without CUDA: it cannot be made, and says why.
#include "ferry/core/error.hpp"
#include "ferry/image/gpu_decoder.hpp"

namespace ferry::image {

struct gpu_jpeg_decoder::impl {};

gpu_jpeg_decoder::gpu_jpeg_decoder(device& /*dev*/, const gpu_decoder_options& /*options*/) {
  throw logic_error(
      "the GPU JPEG decoder needs ferry built with CUDA; this build has the host backend only (rebuild with "
      "the CUDA toolkit, or decode on the CPU)");
}

gpu_jpeg_decoder::~gpu_jpeg_decoder() = default;
gpu_jpeg_decoder::gpu_jpeg_decoder(gpu_jpeg_decoder&&) noexcept = default;
gpu_jpeg_decoder& gpu_jpeg_decoder::operator=(gpu_jpeg_decoder&&) noexcept = default;

void gpu_jpeg_decoder::decode(const gpu_decode_batch& /*batch*/, stream_view /*consumer*/,
                              event* /*inputs_done*/) {
  throw logic_error("GPU JPEG decode: this build of ferry has no CUDA");
}

decoded_image gpu_jpeg_decoder::last_image(std::size_t /*index*/, std::span<std::uint8_t> /*host*/) {
  throw logic_error("GPU JPEG decode: this build of ferry has no CUDA");
}

std::string gpu_jpeg_decoder::stats_json() const {
  throw logic_error("GPU JPEG decode: this build of ferry has no CUDA");
}

}  // namespace ferry::image
