// What the GPU decoder's interface has on every build: the output types, and where nvJPEG is (the shim
// builds without CUDA, so a CPU-only build still says whether this machine has nvJPEG).
#include <fmt/format.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "ferry/core/error.hpp"
#include "ferry/image/gpu_decoder.hpp"
#include "ferry/shim/nvjpeg.hpp"

namespace ferry::image {

std::size_t element_bytes(output_dtype t) {
  switch (t) {
    case output_dtype::uint8: return 1;
    case output_dtype::float32: return 4;
    case output_dtype::bfloat16:
    case output_dtype::float16: return 2;
  }
  throw logic_error(fmt::format("output dtype {} is not uint8 (0), float32 (1), bfloat16 (2) or float16 (3)",
                                static_cast<int>(t)));
}

const char* to_string(output_dtype t) noexcept {
  switch (t) {
    case output_dtype::uint8: return "uint8";
    case output_dtype::float32: return "float32";
    case output_dtype::bfloat16: return "bfloat16";
    case output_dtype::float16: return "float16";
  }
  return "unknown";
}

std::string nvjpeg_library_json(const std::vector<std::string>& library_dirs) {
  const auto api = shim::nvjpeg(library_dirs);
  nlohmann::json j = {{"available", api->ok()},
                      {"path", api->library.path()},
                      {"version", api->ok() ? api->version_string() : std::string()},
                      {"error", api->error},
                      {"tried", api->tried}};
  return j.dump();
}

}  // namespace ferry::image
