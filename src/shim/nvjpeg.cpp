#include "ferry/shim/nvjpeg.hpp"

#include <fmt/format.h>
#include <link.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

// The toolkit's <nvjpeg.h>, where the build has one (the CUDA toolkit's nvJPEG development files), only to
// check that the declarations of ferry/shim/nvjpeg.hpp match nvJPEG's: nothing here calls nvJPEG through it.
#if __has_include(<nvjpeg.h>)
#include <nvjpeg.h>

#include <cstddef>
#include <type_traits>
#define FERRY_SHIM_HAVE_NVJPEG_H 1
#endif

// Set by src/shim/CMakeLists.txt from the toolkit found at configure time, ':'-separated.
#ifndef FERRY_NVJPEG_DIRS
#define FERRY_NVJPEG_DIRS "/usr/local/cuda/lib64"
#endif

namespace ferry::shim {

#ifdef FERRY_SHIM_HAVE_NVJPEG_H
static_assert(sizeof(nvjpeg_status) == sizeof(nvjpegStatus_t));
static_assert(nvjpeg_success == NVJPEG_STATUS_SUCCESS &&
              nvjpeg_not_initialized == NVJPEG_STATUS_NOT_INITIALIZED &&
              nvjpeg_invalid_parameter == NVJPEG_STATUS_INVALID_PARAMETER &&
              nvjpeg_bad_jpeg == NVJPEG_STATUS_BAD_JPEG &&
              nvjpeg_jpeg_not_supported == NVJPEG_STATUS_JPEG_NOT_SUPPORTED &&
              nvjpeg_allocator_failure == NVJPEG_STATUS_ALLOCATOR_FAILURE &&
              nvjpeg_execution_failed == NVJPEG_STATUS_EXECUTION_FAILED &&
              nvjpeg_arch_mismatch == NVJPEG_STATUS_ARCH_MISMATCH &&
              nvjpeg_internal_error == NVJPEG_STATUS_INTERNAL_ERROR &&
              nvjpeg_implementation_not_supported == NVJPEG_STATUS_IMPLEMENTATION_NOT_SUPPORTED &&
              nvjpeg_incomplete_bitstream == NVJPEG_STATUS_INCOMPLETE_BITSTREAM);
static_assert(sizeof(nvjpeg_backend) == sizeof(nvjpegBackend_t) &&
              static_cast<int>(nvjpeg_backend::default_backend) == NVJPEG_BACKEND_DEFAULT &&
              static_cast<int>(nvjpeg_backend::hybrid) == NVJPEG_BACKEND_HYBRID &&
              static_cast<int>(nvjpeg_backend::gpu_hybrid) == NVJPEG_BACKEND_GPU_HYBRID &&
              static_cast<int>(nvjpeg_backend::hardware) == NVJPEG_BACKEND_HARDWARE &&
              static_cast<int>(nvjpeg_backend::gpu_hybrid_device) == NVJPEG_BACKEND_GPU_HYBRID_DEVICE &&
              static_cast<int>(nvjpeg_backend::hardware_device) == NVJPEG_BACKEND_HARDWARE_DEVICE);
static_assert(sizeof(nvjpeg_output_format) == sizeof(nvjpegOutputFormat_t) &&
              static_cast<int>(nvjpeg_output_format::unchanged) == NVJPEG_OUTPUT_UNCHANGED &&
              static_cast<int>(nvjpeg_output_format::yuv) == NVJPEG_OUTPUT_YUV &&
              static_cast<int>(nvjpeg_output_format::y) == NVJPEG_OUTPUT_Y &&
              static_cast<int>(nvjpeg_output_format::rgb) == NVJPEG_OUTPUT_RGB &&
              static_cast<int>(nvjpeg_output_format::bgr) == NVJPEG_OUTPUT_BGR &&
              static_cast<int>(nvjpeg_output_format::rgbi) == NVJPEG_OUTPUT_RGBI &&
              static_cast<int>(nvjpeg_output_format::bgri) == NVJPEG_OUTPUT_BGRI);
static_assert(sizeof(nvjpeg_chroma_subsampling) == sizeof(nvjpegChromaSubsampling_t) &&
              static_cast<int>(nvjpeg_chroma_subsampling::css_444) == NVJPEG_CSS_444 &&
              static_cast<int>(nvjpeg_chroma_subsampling::css_422) == NVJPEG_CSS_422 &&
              static_cast<int>(nvjpeg_chroma_subsampling::css_420) == NVJPEG_CSS_420 &&
              static_cast<int>(nvjpeg_chroma_subsampling::css_440) == NVJPEG_CSS_440 &&
              static_cast<int>(nvjpeg_chroma_subsampling::css_411) == NVJPEG_CSS_411 &&
              static_cast<int>(nvjpeg_chroma_subsampling::css_410) == NVJPEG_CSS_410 &&
              static_cast<int>(nvjpeg_chroma_subsampling::gray) == NVJPEG_CSS_GRAY &&
              static_cast<int>(nvjpeg_chroma_subsampling::css_410v) == NVJPEG_CSS_410V &&
              static_cast<int>(nvjpeg_chroma_subsampling::unknown) == NVJPEG_CSS_UNKNOWN);
static_assert(nvjpeg_max_component == NVJPEG_MAX_COMPONENT && sizeof(nvjpeg_image) == sizeof(nvjpegImage_t) &&
              offsetof(nvjpeg_image, channel) == offsetof(nvjpegImage_t, channel) &&
              offsetof(nvjpeg_image, pitch) == offsetof(nvjpegImage_t, pitch));
static_assert(sizeof(library_property) == sizeof(libraryPropertyType) &&
              static_cast<int>(library_property::major_version) == MAJOR_VERSION &&
              static_cast<int>(library_property::minor_version) == MINOR_VERSION &&
              static_cast<int>(library_property::patch_level) == PATCH_LEVEL);
static_assert(std::is_pointer_v<nvjpegHandle_t> && std::is_pointer_v<nvjpegJpegState_t> &&
              std::is_pointer_v<nvjpegJpegStream_t> && std::is_pointer_v<cudaStream_t>);
// The entry points' parameter lists, in nvJPEG's types (the types above stand for them one to one).
static_assert(std::is_same_v<decltype(&nvjpegGetProperty), nvjpegStatus_t (*)(libraryPropertyType, int*)>);
static_assert(std::is_same_v<decltype(&nvjpegCreateEx),
                             nvjpegStatus_t (*)(nvjpegBackend_t, nvjpegDevAllocator_t*,
                                                nvjpegPinnedAllocator_t*, unsigned int, nvjpegHandle_t*)>);
static_assert(std::is_same_v<decltype(&nvjpegDestroy), nvjpegStatus_t (*)(nvjpegHandle_t)>);
static_assert(
    std::is_same_v<decltype(&nvjpegJpegStateCreate), nvjpegStatus_t (*)(nvjpegHandle_t, nvjpegJpegState_t*)>);
static_assert(std::is_same_v<decltype(&nvjpegJpegStateDestroy), nvjpegStatus_t (*)(nvjpegJpegState_t)>);
static_assert(std::is_same_v<decltype(&nvjpegDecode),
                             nvjpegStatus_t (*)(nvjpegHandle_t, nvjpegJpegState_t, const unsigned char*,
                                                size_t, nvjpegOutputFormat_t, nvjpegImage_t*, cudaStream_t)>);
static_assert(
    std::is_same_v<decltype(&nvjpegDecodeBatchedInitialize),
                   nvjpegStatus_t (*)(nvjpegHandle_t, nvjpegJpegState_t, int, int, nvjpegOutputFormat_t)>);
static_assert(
    std::is_same_v<decltype(&nvjpegDecodeBatched),
                   nvjpegStatus_t (*)(nvjpegHandle_t, nvjpegJpegState_t, const unsigned char* const*,
                                      const size_t*, nvjpegImage_t*, cudaStream_t)>);
static_assert(std::is_same_v<decltype(&nvjpegJpegStreamCreate),
                             nvjpegStatus_t (*)(nvjpegHandle_t, nvjpegJpegStream_t*)>);
static_assert(std::is_same_v<decltype(&nvjpegJpegStreamDestroy), nvjpegStatus_t (*)(nvjpegJpegStream_t)>);
static_assert(
    std::is_same_v<decltype(&nvjpegJpegStreamParseHeader),
                   nvjpegStatus_t (*)(nvjpegHandle_t, const unsigned char*, size_t, nvjpegJpegStream_t)>);
static_assert(std::is_same_v<decltype(&nvjpegDecodeBatchedSupported),
                             nvjpegStatus_t (*)(nvjpegHandle_t, nvjpegJpegStream_t, int*)>);
static_assert(std::is_same_v<decltype(&nvjpegJpegStreamGetFrameDimensions),
                             nvjpegStatus_t (*)(nvjpegJpegStream_t, unsigned int*, unsigned int*)>);
static_assert(std::is_same_v<decltype(&nvjpegJpegStreamGetComponentsNum),
                             nvjpegStatus_t (*)(nvjpegJpegStream_t, unsigned int*)>);
#endif

namespace {

constexpr const char* sonames[] = {"libnvjpeg.so.13", "libnvjpeg.so.12"};

// Whether `file` (a name without folders) is an nvJPEG: libnvjpeg.so.13, or a copy renamed by auditwheel
// (torchvision.libs/libnvjpeg-<hash>.so.12); libnvjpeg2k (JPEG 2000) is another library.
bool is_nvjpeg_file(std::string_view file) {
  return (file.starts_with("libnvjpeg.") || file.starts_with("libnvjpeg-")) &&
         file.find(".so") != std::string_view::npos;
}

// What the libraries of this process say: the site-packages (or dist-packages) folders they were loaded
// from (where a Python process keeps the nvidia-* wheels, torch's CUDA libraries among them), and an nvJPEG
// already loaded (torchvision's copy).
struct loaded_objects {
  std::vector<std::string> sites;
  std::vector<std::string> nvjpegs;
};

int note_loaded(dl_phdr_info* info, std::size_t /*size*/, void* data) {
  auto& out = *static_cast<loaded_objects*>(data);
  if (info->dlpi_name == nullptr || info->dlpi_name[0] == '\0') return 0;
  const std::string_view name(info->dlpi_name);
  const std::size_t slash = name.rfind('/');
  if (slash != std::string_view::npos && is_nvjpeg_file(name.substr(slash + 1)))
    out.nvjpegs.emplace_back(name);
  for (const std::string_view marker :
       {std::string_view("/site-packages/"), std::string_view("/dist-packages/")}) {
    const std::size_t at = name.find(marker);
    if (at == std::string_view::npos) continue;
    std::string folder(name.substr(0, at + marker.size() - 1));
    if (std::find(out.sites.begin(), out.sites.end(), folder) == out.sites.end())
      out.sites.push_back(std::move(folder));
  }
  return 0;
}

// A site's folders that may hold nvJPEG: nvidia/cu13/lib first (CUDA 13's wheels share it), every other
// nvidia/<package>/lib, sorted, then torchvision.libs (the copy a torchvision wheel bundles).
void add_site_dirs(const std::string& site, std::vector<std::string>& dirs) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path nvidia = fs::path(site) / "nvidia";
  std::vector<std::string> found;
  if (fs::is_directory(nvidia, ec)) {
    for (fs::directory_iterator it(nvidia, ec), end; !ec && it != end; it.increment(ec)) {
      const fs::path lib = it->path() / "lib";
      if (fs::is_directory(lib, ec)) found.push_back(lib.string());
    }
  }
  std::sort(found.begin(), found.end());
  const std::string cu13 = (nvidia / "cu13" / "lib").string();
  if (std::find(found.begin(), found.end(), cu13) != found.end()) dirs.push_back(cu13);
  for (std::string& d : found)
    if (d != cu13) dirs.push_back(std::move(d));
  const fs::path bundled = fs::path(site) / "torchvision.libs";
  if (fs::is_directory(bundled, ec)) dirs.push_back(bundled.string());
}

void add_name(std::vector<std::string>& names, std::string name) {
  if (std::find(names.begin(), names.end(), name) == names.end()) names.push_back(std::move(name));
}

// `dir`/libnvjpeg.so.13, .so.12, then any other nvJPEG file in it (sorted) that exists.
void add_dir(std::vector<std::string>& names, const std::string& dir) {
  namespace fs = std::filesystem;
  for (const char* soname : sonames) add_name(names, dir + "/" + soname);
  std::error_code ec;
  std::vector<std::string> others;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string file = it->path().filename().string();
    if (is_nvjpeg_file(file) && file != sonames[0] && file != sonames[1])
      others.push_back(it->path().string());
  }
  std::sort(others.begin(), others.end());
  for (std::string& o : others) add_name(names, std::move(o));
}

}  // namespace

const char* nvjpeg_install_hint() noexcept {
  return "install nvJPEG: the nvidia-nvjpeg-cu13 Python package (pip install nvidia-nvjpeg-cu13; or "
         "nvidia-nvjpeg-cu12 for CUDA 12) or the CUDA toolkit's libnvjpeg (libnvjpeg.so.13), put its folder "
         "on "
         "LD_LIBRARY_PATH, or point FERRY_NVJPEG_LIBRARY at a libnvjpeg.so";
}

std::string nvjpeg_api::error_string(nvjpeg_status s) {
  static constexpr const char* names[] = {"NVJPEG_STATUS_SUCCESS",
                                          "NVJPEG_STATUS_NOT_INITIALIZED",
                                          "NVJPEG_STATUS_INVALID_PARAMETER",
                                          "NVJPEG_STATUS_BAD_JPEG",
                                          "NVJPEG_STATUS_JPEG_NOT_SUPPORTED",
                                          "NVJPEG_STATUS_ALLOCATOR_FAILURE",
                                          "NVJPEG_STATUS_EXECUTION_FAILED",
                                          "NVJPEG_STATUS_ARCH_MISMATCH",
                                          "NVJPEG_STATUS_INTERNAL_ERROR",
                                          "NVJPEG_STATUS_IMPLEMENTATION_NOT_SUPPORTED",
                                          "NVJPEG_STATUS_INCOMPLETE_BITSTREAM"};
  const char* name = s >= 0 && s < static_cast<int>(std::size(names)) ? names[s] : "unknown status";
  return fmt::format("{} (nvJPEG {})", name, s);
}

std::string nvjpeg_api::version_string() const {
  if (!library.loaded() || get_property == nullptr) return "unknown";
  return fmt::format("{}.{}.{}", version[0], version[1], version[2]);
}

std::vector<std::string> nvjpeg_library_names(const std::vector<std::string>& extra_dirs) {
  // NOLINTNEXTLINE(concurrency-mt-unsafe): read when a decoder is made; nothing in ferry sets it
  const char* env = std::getenv(nvjpeg_library_env);
  if (env != nullptr && env[0] != '\0') return {std::string(env)};
  loaded_objects seen;
  dl_iterate_phdr(note_loaded, &seen);
  std::vector<std::string> names(std::begin(sonames), std::end(sonames));
  for (std::string& n : seen.nvjpegs) add_name(names, std::move(n));
  std::vector<std::string> dirs = extra_dirs;
  for (const std::string& site : seen.sites) add_site_dirs(site, dirs);
  for (std::string& d : dynamic_library::split_list(FERRY_NVJPEG_DIRS)) dirs.push_back(std::move(d));
  for (const std::string& dir : dirs) add_dir(names, dir);
  return names;
}

nvjpeg_api load_nvjpeg(const std::vector<std::string>& names) {
  nvjpeg_api api;
  api.tried = names;
  api.library = dynamic_library::open(names);
  if (!api.library.loaded()) {
    api.error =
        fmt::format("nvJPEG not available; {}. Tried: {}", nvjpeg_install_hint(), api.library.error());
    return api;
  }
  const dynamic_library& lib = api.library;
  std::string missing;
  lib.look_up("nvjpegGetProperty", api.get_property, missing);
  lib.look_up("nvjpegCreateEx", api.create_ex, missing);
  lib.look_up("nvjpegDestroy", api.destroy, missing);
  lib.look_up("nvjpegJpegStateCreate", api.jpeg_state_create, missing);
  lib.look_up("nvjpegJpegStateDestroy", api.jpeg_state_destroy, missing);
  lib.look_up("nvjpegDecode", api.decode, missing);
  lib.look_up("nvjpegDecodeBatchedInitialize", api.decode_batched_initialize, missing);
  lib.look_up("nvjpegDecodeBatched", api.decode_batched, missing);
  lib.look_up("nvjpegJpegStreamCreate", api.jpeg_stream_create, missing);
  lib.look_up("nvjpegJpegStreamDestroy", api.jpeg_stream_destroy, missing);
  lib.look_up("nvjpegJpegStreamParseHeader", api.jpeg_stream_parse_header, missing);
  lib.look_up("nvjpegDecodeBatchedSupported", api.decode_batched_supported, missing);
  lib.look_up("nvjpegJpegStreamGetFrameDimensions", api.jpeg_stream_get_frame_dimensions, missing);
  lib.look_up("nvjpegJpegStreamGetComponentsNum", api.jpeg_stream_get_components_num, missing);
  api.get_hardware_decoder_info =
      lib.optional_function<decltype(api.get_hardware_decoder_info)>("nvjpegGetHardwareDecoderInfo");
  if (!missing.empty()) {
    api.error = fmt::format("nvJPEG not available: {} ({}) lacks {}; ferry needs nvJPEG 11.0 or later; {}",
                            lib.name(), lib.path(), missing, nvjpeg_install_hint());
    return api;
  }
  constexpr library_property parts[] = {library_property::major_version, library_property::minor_version,
                                        library_property::patch_level};
  for (int i = 0; i < 3; ++i) {
    const nvjpeg_status s = api.get_property(parts[i], &api.version[i]);
    if (s != nvjpeg_success) {
      api.error = fmt::format("nvJPEG not available: nvjpegGetProperty of {} failed: {}", lib.path(),
                              nvjpeg_api::error_string(s));
      return api;
    }
  }
  return api;
}

std::shared_ptr<const nvjpeg_api> nvjpeg(const std::vector<std::string>& extra_dirs) {
  static std::mutex mu;
  static std::shared_ptr<const nvjpeg_api> loaded;
  const std::lock_guard lock(mu);
  if (loaded != nullptr) return loaded;
  auto api = std::make_shared<const nvjpeg_api>(load_nvjpeg(nvjpeg_library_names(extra_dirs)));
  if (api->ok()) loaded = api;
  return api;
}

}  // namespace ferry::shim
