#include "ferry/shim/jpeg.hpp"

#include <fmt/format.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "ferry/core/error.hpp"

// Debian's <jpeglib.h> (libjpeg62-turbo-dev), where the build has one, only to check that the declarations
// of ferry/shim/jpeg.hpp match libjpeg's: nothing here calls libjpeg through it. It needs <cstdio> first.
#if __has_include(<jpeglib.h>)
#include <cstdio>
#include <type_traits>

#include <jpeglib.h>
#define FERRY_SHIM_HAVE_JPEGLIB_H 1
#endif

// The folders the dynamic loader's default search would look in for a multiarch Debian build, by absolute
// path (for a process whose LD_LIBRARY_PATH or ld.so.cache lacks them).
#ifndef FERRY_JPEG_DIRS
#define FERRY_JPEG_DIRS "/usr/lib/x86_64-linux-gnu:/usr/lib/aarch64-linux-gnu:/usr/lib64:/usr/lib"
#endif

namespace ferry::shim {

#ifdef FERRY_SHIM_HAVE_JPEGLIB_H
static_assert(JPEG_LIB_VERSION == 62, "ferry's libjpeg shim is for the libjpeg 6b API (libjpeg.so.62)");
static_assert(std::is_same_v<decltype(jpeg_api::std_error), decltype(&::jpeg_std_error)>);
static_assert(std::is_same_v<decltype(jpeg_api::create_decompress), decltype(&::jpeg_CreateDecompress)>);
static_assert(std::is_same_v<decltype(jpeg_api::destroy_decompress), decltype(&::jpeg_destroy_decompress)>);
static_assert(std::is_same_v<decltype(jpeg_api::mem_src), decltype(&::jpeg_mem_src)>);
static_assert(std::is_same_v<decltype(jpeg_api::read_header), decltype(&::jpeg_read_header)>);
static_assert(
    std::is_same_v<decltype(jpeg_api::calc_output_dimensions), decltype(&::jpeg_calc_output_dimensions)>);
static_assert(std::is_same_v<decltype(jpeg_api::start_decompress), decltype(&::jpeg_start_decompress)>);
static_assert(std::is_same_v<decltype(jpeg_api::crop_scanline), decltype(&::jpeg_crop_scanline)>);
static_assert(std::is_same_v<decltype(jpeg_api::skip_scanlines), decltype(&::jpeg_skip_scanlines)>);
static_assert(std::is_same_v<decltype(jpeg_api::read_scanlines), decltype(&::jpeg_read_scanlines)>);
static_assert(std::is_same_v<decltype(jpeg_api::finish_decompress), decltype(&::jpeg_finish_decompress)>);
static_assert(std::is_same_v<decltype(jpeg_api::abort_decompress), decltype(&::jpeg_abort_decompress)>);
#endif

namespace {

constexpr const char* install_hint =
    "install libjpeg-turbo's libjpeg.so.62 (Debian/Ubuntu: apt-get install libjpeg62-turbo; libjpeg-turbo "
    "1.5 "
    "or later) or point FERRY_JPEG_LIBRARY at a libjpeg.so.62";

}  // namespace

std::vector<std::string> jpeg_library_names() {
  // NOLINTNEXTLINE(concurrency-mt-unsafe): read once at load, nothing in ferry sets it
  const char* env = std::getenv(jpeg_library_env);
  if (env != nullptr && env[0] != '\0') return {std::string(env)};
  return dynamic_library::candidates(jpeg_library_name, FERRY_JPEG_DIRS);
}

jpeg_api load_jpeg(const std::vector<std::string>& names) {
  jpeg_api api;
  api.library = dynamic_library::open(names);
  if (!api.library.loaded()) {
    api.error = fmt::format("libjpeg not available: {}; {}", api.library.error(), install_hint);
    return api;
  }
  const dynamic_library& lib = api.library;
  std::string missing;
  lib.look_up("jpeg_std_error", api.std_error, missing);
  lib.look_up("jpeg_CreateDecompress", api.create_decompress, missing);
  lib.look_up("jpeg_destroy_decompress", api.destroy_decompress, missing);
  lib.look_up("jpeg_mem_src", api.mem_src, missing);
  lib.look_up("jpeg_read_header", api.read_header, missing);
  lib.look_up("jpeg_calc_output_dimensions", api.calc_output_dimensions, missing);
  lib.look_up("jpeg_start_decompress", api.start_decompress, missing);
  lib.look_up("jpeg_crop_scanline", api.crop_scanline, missing);
  lib.look_up("jpeg_skip_scanlines", api.skip_scanlines, missing);
  lib.look_up("jpeg_read_scanlines", api.read_scanlines, missing);
  lib.look_up("jpeg_finish_decompress", api.finish_decompress, missing);
  lib.look_up("jpeg_abort_decompress", api.abort_decompress, missing);
  if (!missing.empty()) {
    api.error = fmt::format("libjpeg not available: {} ({}) lacks {}; {}", lib.name(), lib.path(), missing,
                            install_hint);
  }
  return api;
}

const jpeg_api& jpeg() {
  static const jpeg_api api = load_jpeg(jpeg_library_names());
  return api;
}

const jpeg_api& require_jpeg() {
  const jpeg_api& api = jpeg();
  FERRY_EXPECTS(api.ok(), api.error);
  return api;
}

}  // namespace ferry::shim
