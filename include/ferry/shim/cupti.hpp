// CUPTI (libcupti, shipped with the CUDA toolkit and in the nvidia-cuda-cupti Python package), opened at
// run time: ferry links no CUPTI, so a machine without it runs everything but tracing on the cuda backend.
// The entry points' types come from <cupti.h>, so this header needs the toolkit's headers (never its
// library); it is built only with the cuda backend.
#pragma once

#include <cupti.h>

#include <string>
#include <vector>

#include "ferry/shim/dynamic_library.hpp"

namespace ferry::shim {

/// The CUPTI entry points ferry's tracer uses, each with the exact type <cupti.h> declares for it, and
/// the library they come from. Move-only; the entry points are valid while `library` is open.
struct cupti_api {
  decltype(&::cuptiGetVersion) get_version = nullptr;
  decltype(&::cuptiGetResultString) get_result_string = nullptr;
  decltype(&::cuptiGetTimestamp) get_timestamp = nullptr;
  decltype(&::cuptiGetCallbackName) get_callback_name = nullptr;
  decltype(&::cuptiSetThreadIdType) set_thread_id_type = nullptr;
  decltype(&::cuptiActivityRegisterCallbacks) activity_register_callbacks = nullptr;
  decltype(&::cuptiActivityRegisterTimestampCallback) activity_register_timestamp_callback = nullptr;
  decltype(&::cuptiActivityEnable) activity_enable = nullptr;
  /// Optional (CUPTI 12.5 and later): nullptr when the library lacks it.
  decltype(&::cuptiActivityEnableRuntimeApi) activity_enable_runtime_api = nullptr;
  decltype(&::cuptiActivityDisable) activity_disable = nullptr;
  decltype(&::cuptiActivityFlushAll) activity_flush_all = nullptr;
  decltype(&::cuptiActivityGetNextRecord) activity_get_next_record = nullptr;
  decltype(&::cuptiActivityGetNumDroppedRecords) activity_get_num_dropped_records = nullptr;

  /// The library the entry points come from.
  dynamic_library library;
  /// The file the loader opened for it (a full path), for NVTX_INJECTION64_PATH.
  std::string path;
};

/// The libraries tried for CUPTI, in order: the versioned sonames of the toolkit ferry was built with
/// (libcupti.so.13, ...; what a linked build would have needed), libcupti.so, then the same names in
/// the toolkit's library folders (the build's, /usr/local/cuda/lib64, /usr/local/cuda/extras/CUPTI/lib64).
/// Bare names follow the dynamic loader's search (LD_LIBRARY_PATH, ld.so.cache, /lib, /usr/lib).
[[nodiscard]] const std::vector<std::string>& cupti_library_names();

/// Opens the first of `names` that loads and looks up every entry point of cupti_api. Throws cuda_error
/// (code CUPTI_ERROR_NOT_INITIALIZED) naming every library tried and what dlopen said, or the library
/// and the entry point it lacks. cupti() calls it once with cupti_library_names().
[[nodiscard]] cupti_api load_cupti(const std::vector<std::string>& names);

/// CUPTI's entry points, loaded on the first call (thread-safe) and kept until the process exits: CUPTI's
/// threads and the NVTX injection hold pointers into the library, so it is never closed.
/// Throws cuda_error (code CUPTI_ERROR_NOT_INITIALIZED) naming every library tried and what dlopen said,
/// or the library and the entry point it lacks; every later call throws the same.
[[nodiscard]] const cupti_api& cupti();

}  // namespace ferry::shim
