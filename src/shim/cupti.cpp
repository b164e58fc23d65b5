#include "ferry/shim/cupti.hpp"

#include <fmt/format.h>

#include <exception>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ferry/core/error.hpp"
#include "ferry/shim/dynamic_library.hpp"

// Set by src/shim/CMakeLists.txt from the toolkit found at configure time, ':'-separated.
#ifndef FERRY_CUPTI_SONAMES
#define FERRY_CUPTI_SONAMES ""
#endif
#ifndef FERRY_CUPTI_DIRS
#define FERRY_CUPTI_DIRS "/usr/local/cuda/lib64:/usr/local/cuda/extras/CUPTI/lib64"
#endif

namespace ferry::shim {
namespace {

void add_once(std::vector<std::string>& names, std::string name) {
  for (const std::string& n : names)
    if (n == name) return;
  names.push_back(std::move(name));
}

void load_entry_points(const dynamic_library& lib, cupti_api& api) {
  api.get_version = lib.function<decltype(api.get_version)>("cuptiGetVersion");
  api.get_result_string = lib.function<decltype(api.get_result_string)>("cuptiGetResultString");
  api.get_timestamp = lib.function<decltype(api.get_timestamp)>("cuptiGetTimestamp");
  api.get_callback_name = lib.function<decltype(api.get_callback_name)>("cuptiGetCallbackName");
  api.set_thread_id_type = lib.function<decltype(api.set_thread_id_type)>("cuptiSetThreadIdType");
  api.activity_register_callbacks =
      lib.function<decltype(api.activity_register_callbacks)>("cuptiActivityRegisterCallbacks");
  api.activity_register_timestamp_callback = lib.function<decltype(api.activity_register_timestamp_callback)>(
      "cuptiActivityRegisterTimestampCallback");
  api.activity_enable = lib.function<decltype(api.activity_enable)>("cuptiActivityEnable");
  api.activity_disable = lib.function<decltype(api.activity_disable)>("cuptiActivityDisable");
  api.activity_enable_runtime_api =
      lib.optional_function<decltype(api.activity_enable_runtime_api)>("cuptiActivityEnableRuntimeApi");
  api.activity_flush_all = lib.function<decltype(api.activity_flush_all)>("cuptiActivityFlushAll");
  api.activity_get_next_record =
      lib.function<decltype(api.activity_get_next_record)>("cuptiActivityGetNextRecord");
  api.activity_get_num_dropped_records =
      lib.function<decltype(api.activity_get_num_dropped_records)>("cuptiActivityGetNumDroppedRecords");
}

// What the first cupti() call found: the table (never deleted), or why there is none.
struct cupti_state {
  const cupti_api* api = nullptr;
  std::string error;
};

}  // namespace

const std::vector<std::string>& cupti_library_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> sonames = dynamic_library::split_list(FERRY_CUPTI_SONAMES);
    add_once(sonames, "libcupti.so");
    std::vector<std::string> out = sonames;
    for (const std::string& dir : dynamic_library::split_list(FERRY_CUPTI_DIRS))
      for (const std::string& soname : sonames) add_once(out, dir + "/" + soname);
    return out;
  }();
  return names;
}

cupti_api load_cupti(const std::vector<std::string>& names) {
  cupti_api api;
  api.library = dynamic_library::open(names);
  if (!api.library.loaded())
    throw cuda_error(static_cast<int>(CUPTI_ERROR_NOT_INITIALIZED),
                     fmt::format("CUPTI not available: none of the {} libraries tried opens ({}); install "
                                 "the CUDA toolkit's CUPTI or the nvidia-cuda-cupti Python package and put "
                                 "the folder holding libcupti on LD_LIBRARY_PATH",
                                 names.size(), api.library.error()));
  api.path = api.library.path();
  try {
    load_entry_points(api.library, api);
  } catch (const std::exception& e) {
    throw cuda_error(static_cast<int>(CUPTI_ERROR_NOT_INITIALIZED),
                     fmt::format("CUPTI not available: {} (opened as {})", e.what(), api.path));
  }
  return api;
}

const cupti_api& cupti() {
  static const cupti_state state = [] {
    cupti_state s;
    try {
      // Never deleted: CUPTI's worker threads, its registered callbacks and NVTX (through
      // NVTX_INJECTION64_PATH) use the library until the process exits, after static destructors run.
      s.api = new cupti_api(load_cupti(cupti_library_names()));
    } catch (const std::exception& e) {
      s.error = e.what();
    }
    return s;
  }();
  if (state.api == nullptr) throw cuda_error(static_cast<int>(CUPTI_ERROR_NOT_INITIALIZED), state.error);
  return *state.api;
}

}  // namespace ferry::shim
