#include "ferry/shim/nccl.hpp"

#include <fmt/format.h>

#include <climits>
#include <string>
#include <utility>
#include <vector>

// The toolkit's <nccl.h>, where the build has one, only to check that the declarations of ferry/shim/nccl.hpp
// match NCCL's: nothing here calls NCCL through it.
#if __has_include(<nccl.h>)
#include <nccl.h>

#include <cstddef>
#include <type_traits>
#define FERRY_SHIM_HAVE_NCCL_H 1
#endif

// Set by src/shim/CMakeLists.txt from the toolkit found at configure time, ':'-separated.
#ifndef FERRY_NCCL_DIRS
#define FERRY_NCCL_DIRS "/usr/local/cuda/lib64"
#endif

namespace ferry::shim {

#ifdef FERRY_SHIM_HAVE_NCCL_H
static_assert(sizeof(nccl_unique_id) == sizeof(ncclUniqueId));
static_assert(std::is_pointer_v<nccl_comm> && std::is_pointer_v<ncclComm_t>);
static_assert(sizeof(nccl_result) == sizeof(ncclResult_t));
static_assert(nccl_success == ncclSuccess && nccl_unhandled_cuda_error == ncclUnhandledCudaError &&
              nccl_system_error == ncclSystemError && nccl_internal_error == ncclInternalError &&
              nccl_invalid_argument == ncclInvalidArgument && nccl_invalid_usage == ncclInvalidUsage &&
              nccl_remote_error == ncclRemoteError && nccl_in_progress == ncclInProgress);
static_assert(sizeof(nccl_data_type) == sizeof(ncclDataType_t) && sizeof(nccl_red_op) == sizeof(ncclRedOp_t));
static_assert(static_cast<int>(nccl_data_type::float16) == ncclFloat16 &&
              static_cast<int>(nccl_data_type::float32) == ncclFloat32 &&
              static_cast<int>(nccl_data_type::bfloat16) == ncclBfloat16 &&
              static_cast<int>(nccl_data_type::int32) == ncclInt32 &&
              static_cast<int>(nccl_data_type::int64) == ncclInt64 &&
              static_cast<int>(nccl_data_type::uint64) == ncclUint64);
static_assert(static_cast<int>(nccl_red_op::sum) == ncclSum && static_cast<int>(nccl_red_op::avg) == ncclAvg);
#if NCCL_VERSION_CODE >= 22800
static_assert(sizeof(nccl_config) == sizeof(ncclConfig_t));
static_assert(offsetof(nccl_config, blocking) == offsetof(ncclConfig_t, blocking));
static_assert(offsetof(nccl_config, nvlink_centric_sched) == offsetof(ncclConfig_t, nvlinkCentricSched));
#endif
#endif

namespace {

constexpr int undefined_int = INT_MIN;  // NCCL_CONFIG_UNDEF_INT
constexpr unsigned config_magic = 0xcafebeefU;
constexpr unsigned config_version = 22809;  // NCCL_VERSION(2, 28, 9): the layout of nccl_config
// ferry needs nonblocking communicators (2.14) and ncclAvg (2.10).
constexpr int minimum_version = 21400;

// The version code in words: NCCL_VERSION(X, Y, Z) is X*1000+Y*100+Z before 2.9, X*10000+Y*100+Z since.
std::string version_text(int code) {
  if (code >= 10000) return fmt::format("{}.{}.{}", code / 10000, code / 100 % 100, code % 100);
  return fmt::format("{}.{}.{}", code / 1000, code / 100 % 10, code % 100);
}

}  // namespace

nccl_config nccl_config_initializer() noexcept {
  nccl_config c{};
  c.size = sizeof(nccl_config);
  c.magic = config_magic;
  c.version = config_version;
  c.blocking = c.cga_cluster_size = c.min_ctas = c.max_ctas = undefined_int;
  c.net_name = nullptr;
  c.split_share = c.traffic_class = undefined_int;
  c.comm_name = nullptr;
  c.collnet_enable = c.cta_policy = c.shrink_share = c.nvls_ctas = c.n_channels_per_net_peer =
      c.nvlink_centric_sched = undefined_int;
  return c;
}

std::string nccl_api::error_string(nccl_result r) const {
  const char* text = get_error_string != nullptr ? get_error_string(r) : nullptr;
  return fmt::format("{} (NCCL {})", text != nullptr ? text : "unknown error", r);
}

std::string nccl_api::version_string() const { return version == 0 ? "unknown" : version_text(version); }

const std::vector<std::string>& nccl_library_names() {
  static const std::vector<std::string> names =
      dynamic_library::candidates(nccl_library_name, FERRY_NCCL_DIRS);
  return names;
}

nccl_api load_nccl(const std::vector<std::string>& names) {
  nccl_api api;
  api.library = dynamic_library::open(names);
  if (!api.library.loaded()) {
    api.error = "NCCL not available: " + api.library.error();
    return api;
  }
  const dynamic_library& lib = api.library;
  std::string missing;
  lib.look_up("ncclGetVersion", api.get_version, missing);
  lib.look_up("ncclGetErrorString", api.get_error_string, missing);
  lib.look_up("ncclGetUniqueId", api.get_unique_id, missing);
  lib.look_up("ncclCommInitRankConfig", api.comm_init_rank_config, missing);
  lib.look_up("ncclCommInitRank", api.comm_init_rank, missing);
  lib.look_up("ncclCommInitAll", api.comm_init_all, missing);
  lib.look_up("ncclCommFinalize", api.comm_finalize, missing);
  lib.look_up("ncclCommAbort", api.comm_abort, missing);
  lib.look_up("ncclCommDestroy", api.comm_destroy, missing);
  lib.look_up("ncclCommGetAsyncError", api.comm_get_async_error, missing);
  lib.look_up("ncclCommCount", api.comm_count, missing);
  lib.look_up("ncclCommUserRank", api.comm_user_rank, missing);
  lib.look_up("ncclAllReduce", api.all_reduce, missing);
  lib.look_up("ncclAllGather", api.all_gather, missing);
  lib.look_up("ncclBroadcast", api.broadcast, missing);
  lib.look_up("ncclGroupStart", api.group_start, missing);
  lib.look_up("ncclGroupEnd", api.group_end, missing);
  api.get_last_error = lib.optional_function<decltype(api.get_last_error)>("ncclGetLastError");
  api.comm_split = lib.optional_function<decltype(api.comm_split)>("ncclCommSplit");
  if (!missing.empty()) {
    api.error = fmt::format("NCCL not available: {} ({}) lacks {}; ferry needs NCCL 2.14 or later",
                            lib.name(), lib.path(), missing);
    return api;
  }
  int version = 0;
  const nccl_result status = api.get_version(&version);
  if (status != nccl_success) {
    api.error = fmt::format("NCCL not available: ncclGetVersion of {} failed: {}", lib.path(),
                            api.error_string(status));
    return api;
  }
  api.version = version;
  if (version < minimum_version) {
    api.error = fmt::format("NCCL not available: {} is NCCL {}; ferry needs NCCL 2.14 or later", lib.path(),
                            version_text(version));
  }
  return api;
}

const nccl_api& nccl() {
  static const nccl_api api = load_nccl(nccl_library_names());
  return api;
}

}  // namespace ferry::shim
