// NCCL (libnccl.so.2: in the CUDA toolkit's lib64 or the nvidia-nccl Python package), opened at run time, so
// ferry builds without linking NCCL and runs where it is missing. Only the part of nccl.h that ferry::comm
// uses is declared here, with types of its own (src/shim/nccl.cpp checks them against the toolkit's
// <nccl.h> where one is found at build time), so this header needs no CUDA header.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "ferry/shim/dynamic_library.hpp"

namespace ferry::shim {

/// The soname NCCL is opened by first (the dynamic loader's search: LD_LIBRARY_PATH, ld.so.cache, ...).
inline constexpr const char* nccl_library_name = "libnccl.so.2";

/// ncclResult_t.
using nccl_result = int;
inline constexpr nccl_result nccl_success = 0;
inline constexpr nccl_result nccl_unhandled_cuda_error = 1;
inline constexpr nccl_result nccl_system_error = 2;
inline constexpr nccl_result nccl_internal_error = 3;
inline constexpr nccl_result nccl_invalid_argument = 4;
inline constexpr nccl_result nccl_invalid_usage = 5;
inline constexpr nccl_result nccl_remote_error = 6;
inline constexpr nccl_result nccl_in_progress = 7;

/// ncclDataType_t: the element types ferry reduces or moves (the integers carry host values between ranks).
enum class nccl_data_type : int { int32 = 2, int64 = 4, uint64 = 5, float16 = 6, float32 = 7, bfloat16 = 9 };
/// ncclRedOp_t: the reductions ferry uses (ncclAvg needs NCCL 2.10).
enum class nccl_red_op : int { sum = 0, avg = 4 };

struct nccl_comm_st;
/// ncclComm_t.
using nccl_comm = nccl_comm_st*;

/// ncclUniqueId: 128 opaque bytes, passed by value.
struct nccl_unique_id {
  char internal[128];
};

/// ncclConfig_t as NCCL 2.28 lays it out (the struct carries its size and version, so an NCCL of another
/// version reads the fields it knows). nccl_config_initializer() is NCCL_CONFIG_INITIALIZER.
struct nccl_config {
  std::size_t size;
  unsigned int magic;
  unsigned int version;
  int blocking;
  int cga_cluster_size;
  int min_ctas;
  int max_ctas;
  const char* net_name;
  int split_share;
  int traffic_class;
  const char* comm_name;
  int collnet_enable;
  int cta_policy;
  int shrink_share;
  int nvls_ctas;
  int n_channels_per_net_peer;
  int nvlink_centric_sched;
};
/// Every field "undefined" (NCCL's defaults), as NCCL_CONFIG_INITIALIZER of NCCL 2.28.
[[nodiscard]] nccl_config nccl_config_initializer() noexcept;

/// NCCL's entry points, each with the signature nccl.h declares (cudaStream_t as void*), and the library
/// they come from. Move-only; valid while `library` is open.
struct nccl_api {
  nccl_result (*get_version)(int*) = nullptr;
  const char* (*get_error_string)(nccl_result) = nullptr;
  nccl_result (*get_unique_id)(nccl_unique_id*) = nullptr;
  nccl_result (*comm_init_rank_config)(nccl_comm*, int, nccl_unique_id, int, nccl_config*) = nullptr;
  nccl_result (*comm_init_rank)(nccl_comm*, int, nccl_unique_id, int) = nullptr;
  nccl_result (*comm_init_all)(nccl_comm*, int, const int*) = nullptr;
  nccl_result (*comm_finalize)(nccl_comm) = nullptr;
  nccl_result (*comm_abort)(nccl_comm) = nullptr;
  nccl_result (*comm_destroy)(nccl_comm) = nullptr;
  nccl_result (*comm_get_async_error)(nccl_comm, nccl_result*) = nullptr;
  nccl_result (*comm_count)(nccl_comm, int*) = nullptr;
  nccl_result (*comm_user_rank)(nccl_comm, int*) = nullptr;
  nccl_result (*all_reduce)(const void*, void*, std::size_t, nccl_data_type, nccl_red_op, nccl_comm,
                            void*) = nullptr;
  nccl_result (*all_gather)(const void*, void*, std::size_t, nccl_data_type, nccl_comm, void*) = nullptr;
  nccl_result (*broadcast)(const void*, void*, std::size_t, nccl_data_type, int, nccl_comm, void*) = nullptr;
  nccl_result (*group_start)() = nullptr;
  nccl_result (*group_end)() = nullptr;
  /// ncclGetLastError (NCCL 2.13): optional, nullptr when this NCCL lacks it.
  const char* (*get_last_error)(nccl_comm) = nullptr;
  /// ncclCommSplit (NCCL 2.18): optional, nullptr when this NCCL lacks it.
  nccl_result (*comm_split)(nccl_comm, int, int, nccl_comm*, nccl_config*) = nullptr;

  dynamic_library library;
  /// ncclGetVersion's code (22809 for 2.28.9); 0 when not loaded.
  int version = 0;
  /// Why NCCL is not usable (empty when ok()): what dlopen said for every name tried, the entry point it
  /// lacks, or a version older than ferry needs.
  std::string error;

  [[nodiscard]] bool ok() const noexcept { return error.empty() && library.loaded(); }
  /// `r` in words with its number: "invalid usage (NCCL 5)".
  [[nodiscard]] std::string error_string(nccl_result r) const;
  /// "2.28.9".
  [[nodiscard]] std::string version_string() const;
};

/// The libraries tried for NCCL, in order: libnccl.so.2 by the loader's search, then libnccl.so.2 in the
/// build's toolkit library folder and /usr/local/cuda/lib64 by absolute path.
[[nodiscard]] const std::vector<std::string>& nccl_library_names();

/// Opens the first of `names` that loads, looks up every entry point and asks its version (ferry needs
/// NCCL 2.14 or later: nonblocking communicators and ncclAvg). Never throws for a missing or unusable NCCL:
/// ok() is false and `error` says why.
[[nodiscard]] nccl_api load_nccl(const std::vector<std::string>& names);

/// NCCL, loaded on the first call with nccl_library_names() (thread-safe) and kept until the process exits
/// (communicators' threads run in it). Check ok().
[[nodiscard]] const nccl_api& nccl();

}  // namespace ferry::shim
