// libjpeg-turbo through its libjpeg API (libjpeg.so.62, Debian's libjpeg62-turbo), opened at run time, so
// ferry builds and runs where it is missing and names the package when a decode needs it. The entry points
// are declared with jpeglib.h's own types, forward-declared here, so this header needs no <jpeglib.h>;
// src/shim/jpeg.cpp checks every signature against <jpeglib.h> where the build has one, and the callers
// that fill libjpeg's structs (src/image/jpeg_decode.cpp) include <jpeglib.h> themselves.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "ferry/shim/dynamic_library.hpp"

// jpeglib.h's structs (JPEG_LIB_VERSION 62), opaque here.
struct jpeg_decompress_struct;
struct jpeg_error_mgr;

namespace ferry::shim {

/// The soname libjpeg-turbo is opened by when $FERRY_JPEG_LIBRARY is not set.
inline constexpr const char* jpeg_library_name = "libjpeg.so.62";
/// The environment variable naming the libjpeg.so.62 to open instead (a path or a soname).
inline constexpr const char* jpeg_library_env = "FERRY_JPEG_LIBRARY";

/// libjpeg's entry points, each with the signature jpeglib.h declares (j_decompress_ptr as
/// jpeg_decompress_struct*, JDIMENSION as unsigned, boolean as int, JSAMPARRAY as unsigned char**), and the
/// library they come from. Move-only; valid while `library` is open. Every one is required: ferry's decode
/// needs jpeg_crop_scanline and jpeg_skip_scanlines, which libjpeg-turbo has since 1.5.
struct jpeg_api {
  jpeg_error_mgr* (*std_error)(jpeg_error_mgr*) = nullptr;
  void (*create_decompress)(jpeg_decompress_struct*, int, std::size_t) = nullptr;
  void (*destroy_decompress)(jpeg_decompress_struct*) = nullptr;
  void (*mem_src)(jpeg_decompress_struct*, const unsigned char*,
                  unsigned long) = nullptr;  // NOLINT(google-runtime-int)
  int (*read_header)(jpeg_decompress_struct*, int) = nullptr;
  void (*calc_output_dimensions)(jpeg_decompress_struct*) = nullptr;
  int (*start_decompress)(jpeg_decompress_struct*) = nullptr;
  void (*crop_scanline)(jpeg_decompress_struct*, unsigned*, unsigned*) = nullptr;
  unsigned (*skip_scanlines)(jpeg_decompress_struct*, unsigned) = nullptr;
  unsigned (*read_scanlines)(jpeg_decompress_struct*, unsigned char**, unsigned) = nullptr;
  int (*finish_decompress)(jpeg_decompress_struct*) = nullptr;
  void (*abort_decompress)(jpeg_decompress_struct*) = nullptr;

  dynamic_library library;
  /// Why libjpeg is not usable (empty when ok()): what dlopen said for every name tried, or the entry points
  /// it lacks, and what to install.
  std::string error;

  [[nodiscard]] bool ok() const noexcept { return error.empty() && library.loaded(); }
};

/// The libraries tried for libjpeg: $FERRY_JPEG_LIBRARY alone when it is set and not empty, else
/// libjpeg.so.62 by the loader's search, then in the build's multiarch library folder by absolute path.
[[nodiscard]] std::vector<std::string> jpeg_library_names();

/// Opens the first of `names` that loads and looks up every entry point. Never throws for a missing or
/// unusable library: ok() is false and `error` says why and what to install.
[[nodiscard]] jpeg_api load_jpeg(const std::vector<std::string>& names);

/// libjpeg, loaded on the first call with jpeg_library_names() (thread-safe) and kept until the process
/// exits. Check ok().
[[nodiscard]] const jpeg_api& jpeg();

/// jpeg(), or logic_error with its `error` when it is not usable.
[[nodiscard]] const jpeg_api& require_jpeg();

}  // namespace ferry::shim
