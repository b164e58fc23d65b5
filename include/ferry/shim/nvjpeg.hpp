// nvJPEG (libnvjpeg.so.13 of CUDA 13, libnvjpeg.so.12 of CUDA 12: in the CUDA toolkit's lib64 or the
// nvidia-nvjpeg-cu13 / nvidia-nvjpeg-cu12 Python packages), opened at run time, so ferry builds without
// linking nvJPEG and runs where it is missing. Only the part of nvjpeg.h that ferry::image's GPU decoder
// uses is declared here, with types of its own, so this header needs no CUDA header.
//
// Where the values come from: NVIDIA's nvjpeg.h of CUDA 12.6 (nvJPEG 12.3.3; the copy in the
// zspace/system.cuda-12.6 repository, include/nvjpeg.h), the same in the nvJPEG 11.6 header: nvjpegStatus_t
// 0..10, nvjpegChromaSubsampling_t (444 = 0 .. 410V = 7, UNKNOWN = -1), nvjpegOutputFormat_t (RGB = 3, Y =
// 2), nvjpegBackend_t (DEFAULT = 0 .. HARDWARE = 3 .. LOSSLESS_JPEG = 6), nvjpegImage_t {unsigned char*
// channel[4]; size_t pitch[4];}, the opaque handle types and every entry point's parameter list below.
// libraryPropertyType (MAJOR_VERSION = 0, MINOR_VERSION = 1, PATCH_LEVEL = 2) is library_types.h's.
// The jpeg-stream getters' parameter lists are the same in nvJPEG 13.0.1's header.
// src/shim/nvjpeg.cpp checks all of it against <nvjpeg.h> wherever a build has one.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "ferry/shim/dynamic_library.hpp"

namespace ferry::shim {

/// The environment variable naming the libnvjpeg to open instead of the search (a path or a soname).
inline constexpr const char* nvjpeg_library_env = "FERRY_NVJPEG_LIBRARY";

/// nvjpegStatus_t.
using nvjpeg_status = int;
inline constexpr nvjpeg_status nvjpeg_success = 0;
inline constexpr nvjpeg_status nvjpeg_not_initialized = 1;
inline constexpr nvjpeg_status nvjpeg_invalid_parameter = 2;
inline constexpr nvjpeg_status nvjpeg_bad_jpeg = 3;
inline constexpr nvjpeg_status nvjpeg_jpeg_not_supported = 4;
inline constexpr nvjpeg_status nvjpeg_allocator_failure = 5;
inline constexpr nvjpeg_status nvjpeg_execution_failed = 6;
inline constexpr nvjpeg_status nvjpeg_arch_mismatch = 7;
inline constexpr nvjpeg_status nvjpeg_internal_error = 8;
inline constexpr nvjpeg_status nvjpeg_implementation_not_supported = 9;
inline constexpr nvjpeg_status nvjpeg_incomplete_bitstream = 10;

/// nvjpegBackend_t.
enum class nvjpeg_backend : int {
  default_backend = 0,
  hybrid = 1,
  gpu_hybrid = 2,
  hardware = 3,  // the GPU's JPEG engines (A100, H100/H200): baseline, single-scan JPEGs, batched only
  gpu_hybrid_device = 4,
  hardware_device = 5,
  lossless_jpeg = 6
};

/// nvjpegOutputFormat_t: the formats ferry asks for.
enum class nvjpeg_output_format : int {
  unchanged = 0,
  yuv = 1,
  y = 2,    // the luma plane only, into channel[0]
  rgb = 3,  // three planes R, G, B into channel[0..2]
  bgr = 4,
  rgbi = 5,
  bgri = 6
};

/// nvjpegChromaSubsampling_t.
enum class nvjpeg_chroma_subsampling : int {
  css_444 = 0,
  css_422 = 1,
  css_420 = 2,
  css_440 = 3,
  css_411 = 4,
  css_410 = 5,
  gray = 6,
  css_410v = 7,
  unknown = -1
};

/// nvjpegImage_t: the output planes of one image (device pointers) and their pitches in bytes.
inline constexpr int nvjpeg_max_component = 4;
struct nvjpeg_image {
  unsigned char* channel[nvjpeg_max_component];
  std::size_t pitch[nvjpeg_max_component];
};

/// libraryPropertyType (library_types.h): what nvjpegGetProperty reports.
enum class library_property : int { major_version = 0, minor_version = 1, patch_level = 2 };

struct nvjpeg_handle_st;
struct nvjpeg_jpeg_state_st;
struct nvjpeg_jpeg_stream_st;
/// nvjpegHandle_t, nvjpegJpegState_t, nvjpegJpegStream_t: opaque.
using nvjpeg_handle = nvjpeg_handle_st*;
using nvjpeg_jpeg_state = nvjpeg_jpeg_state_st*;
using nvjpeg_jpeg_stream = nvjpeg_jpeg_stream_st*;

/// nvJPEG's entry points, each with the signature nvjpeg.h declares (cudaStream_t as void*, the allocator
/// structs as void*: ferry passes NULL, nvJPEG's cudaMalloc/cudaHostAlloc), and the library they come from.
/// Move-only; valid while `library` is open.
struct nvjpeg_api {
  nvjpeg_status (*get_property)(library_property, int*) = nullptr;
  nvjpeg_status (*create_ex)(nvjpeg_backend, void*, void*, unsigned, nvjpeg_handle*) = nullptr;
  nvjpeg_status (*destroy)(nvjpeg_handle) = nullptr;
  nvjpeg_status (*jpeg_state_create)(nvjpeg_handle, nvjpeg_jpeg_state*) = nullptr;
  nvjpeg_status (*jpeg_state_destroy)(nvjpeg_jpeg_state) = nullptr;
  nvjpeg_status (*decode)(nvjpeg_handle, nvjpeg_jpeg_state, const unsigned char*, std::size_t,
                          nvjpeg_output_format, nvjpeg_image*, void*) = nullptr;
  nvjpeg_status (*decode_batched_initialize)(nvjpeg_handle, nvjpeg_jpeg_state, int, int,
                                             nvjpeg_output_format) = nullptr;
  nvjpeg_status (*decode_batched)(nvjpeg_handle, nvjpeg_jpeg_state, const unsigned char* const*,
                                  const std::size_t*, nvjpeg_image*, void*) = nullptr;
  nvjpeg_status (*jpeg_stream_create)(nvjpeg_handle, nvjpeg_jpeg_stream*) = nullptr;
  nvjpeg_status (*jpeg_stream_destroy)(nvjpeg_jpeg_stream) = nullptr;
  nvjpeg_status (*jpeg_stream_parse_header)(nvjpeg_handle, const unsigned char*, std::size_t,
                                            nvjpeg_jpeg_stream) = nullptr;
  /// Sets *is_supported to 0 when the handle's batched decode (the hardware engine, for a hardware
  /// handle) takes the parsed stream.
  nvjpeg_status (*decode_batched_supported)(nvjpeg_handle, nvjpeg_jpeg_stream, int*) = nullptr;
  /// nvjpegJpegStreamGetFrameDimensions and nvjpegJpegStreamGetComponentsNum: what the last
  /// nvjpegJpegStreamParseHeader into the stream read (the frame's width and height, its components).
  nvjpeg_status (*jpeg_stream_get_frame_dimensions)(nvjpeg_jpeg_stream, unsigned*, unsigned*) = nullptr;
  nvjpeg_status (*jpeg_stream_get_components_num)(nvjpeg_jpeg_stream, unsigned*) = nullptr;
  /// nvjpegGetHardwareDecoderInfo (nvJPEG 11.4+): optional, nullptr when this nvJPEG lacks it.
  nvjpeg_status (*get_hardware_decoder_info)(nvjpeg_handle, unsigned*, unsigned*) = nullptr;

  dynamic_library library;
  /// nvjpegGetProperty's major, minor, patch; zeros when not loaded.
  int version[3] = {0, 0, 0};
  /// Every name tried, in order.
  std::vector<std::string> tried;
  /// Why nvJPEG is not usable (empty when ok()): what dlopen said for every name tried and what to
  /// install, or the entry point it lacks.
  std::string error;

  [[nodiscard]] bool ok() const noexcept { return error.empty() && library.loaded(); }
  /// `s` in words with its number: "NVJPEG_STATUS_BAD_JPEG (nvJPEG 3)".
  [[nodiscard]] static std::string error_string(nvjpeg_status s);
  /// "12.3.3"; "unknown" when not loaded.
  [[nodiscard]] std::string version_string() const;
};

/// What to install when nvJPEG is missing (one sentence, for error messages).
[[nodiscard]] const char* nvjpeg_install_hint() noexcept;

/// The libraries tried for nvJPEG, in order: $FERRY_NVJPEG_LIBRARY alone when it is set; else
/// libnvjpeg.so.13 and libnvjpeg.so.12 by the loader's search (LD_LIBRARY_PATH, ld.so.cache, a copy already
/// loaded under that name), an nvJPEG this process already loaded under another name (torchvision's bundled
/// copy), then, by absolute path, libnvjpeg.so.13, .so.12 and any other libnvjpeg file in each of
/// `extra_dirs`, in the nvidia/cu13/lib, nvidia/*/lib and torchvision.libs folders of every Python
/// site-packages (or dist-packages) folder a library of this process was loaded from, and in the build's
/// toolkit library folder and /usr/local/cuda/lib64.
[[nodiscard]] std::vector<std::string> nvjpeg_library_names(const std::vector<std::string>& extra_dirs = {});

/// Opens the first of `names` that loads, looks up every entry point and asks its version. Never throws
/// for a missing or unusable nvJPEG: ok() is false and `error` says why and what to install.
[[nodiscard]] nvjpeg_api load_nvjpeg(const std::vector<std::string>& names);

/// nvJPEG, loaded with nvjpeg_library_names(extra_dirs) and kept until the process exits once a load
/// succeeded (thread-safe; never unloaded: nvJPEG keeps threads and state); a failed load is tried again
/// by the next call, with that call's `extra_dirs`. Check ok().
[[nodiscard]] std::shared_ptr<const nvjpeg_api> nvjpeg(const std::vector<std::string>& extra_dirs = {});

}  // namespace ferry::shim
