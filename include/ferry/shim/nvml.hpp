// NVML (the driver's libnvidia-ml.so.1), opened at run time so that ferry builds without an NVML header
// and runs where the driver's NVML is missing. Only the part of nvml.h ferry uses is declared here.
#pragma once

#include <string>

#include "ferry/core/unique_handle.hpp"
#include "ferry/shim/dynamic_library.hpp"

namespace ferry::shim {

/// The library NVML is opened from (the driver installs it under this soname).
inline constexpr const char* nvml_library_name = "libnvidia-ml.so.1";

/// nvmlReturn_t.
using nvml_return = int;
inline constexpr nvml_return nvml_success = 0;
inline constexpr nvml_return nvml_error_invalid_argument = 2;

struct nvml_device_st;
/// nvmlDevice_t.
using nvml_device = nvml_device_st*;

/// nvmlGpuTopologyLevel_t, as nvmlDeviceGetTopologyCommonAncestor reports it.
enum nvml_topology_level : int {
  nvml_topology_internal = 0,
  nvml_topology_single = 10,
  nvml_topology_multiple = 20,
  nvml_topology_hostbridge = 30,
  nvml_topology_node = 40,
  nvml_topology_system = 50,
};

/// NVML_NVLINK_DEVICE_TYPE_SWITCH: an NVLink that ends at an NVSwitch.
inline constexpr int nvml_nvlink_device_type_switch = 2;

/// nvmlPciInfo_t (v2 and later).
struct nvml_pci_info {
  char bus_id_legacy[16];
  unsigned int domain;
  unsigned int bus;
  unsigned int device;
  unsigned int pci_device_id;
  unsigned int pci_subsystem_id;
  char bus_id[32];
  char slack[64];  // room in case a later NVML grows the struct
};

/// The NVML session: holds nvmlShutdown once nvmlInit_v2 succeeded, and calls it when closed.
struct nvml_session_traits {
  using handle_type = nvml_return (*)();
  static constexpr handle_type null() noexcept { return nullptr; }
  static bool is_null(handle_type shutdown) noexcept { return shutdown == nullptr; }
  static void close(handle_type shutdown) noexcept { static_cast<void>(shutdown()); }
};

/// NVML opened and initialized for the life of the object: nvmlInit_v2 at construction, nvmlShutdown
/// (before the library is closed) at destruction. Move-only; a moved-from object is not ok().
///
/// Every entry point but nvmlInit_v2, nvmlShutdown and nvmlDeviceGetHandleByPciBusId_v2 is optional:
/// a null pointer means this NVML lacks it, and the caller does without.
class nvml_library {
 public:
  /// Opens libnvidia-ml.so.1 and initializes NVML. Never throws for a missing or failing NVML: ok() is
  /// false and error() says why ("NVML not available: ..." with what dlopen or nvmlInit_v2 said).
  nvml_library();

  /// True when NVML is open and initialized: by_bus_id may be called.
  [[nodiscard]] bool ok() const noexcept { return !session_.empty(); }
  /// Why NVML is not available (empty when ok()).
  [[nodiscard]] const std::string& error() const noexcept { return error_; }
  /// `status` in words with its number: "Not Supported (NVML 3)".
  [[nodiscard]] std::string error_string(nvml_return status) const;

  nvml_return (*by_bus_id)(const char*, nvml_device*) = nullptr;
  nvml_return (*curr_gen)(nvml_device, unsigned*) = nullptr;
  nvml_return (*curr_width)(nvml_device, unsigned*) = nullptr;
  nvml_return (*max_gen)(nvml_device, unsigned*) = nullptr;
  nvml_return (*max_width)(nvml_device, unsigned*) = nullptr;
  nvml_return (*common_ancestor)(nvml_device, nvml_device, int*) = nullptr;
  nvml_return (*nvlink_state)(nvml_device, unsigned, int*) = nullptr;
  nvml_return (*nvlink_remote_pci)(nvml_device, unsigned, nvml_pci_info*) = nullptr;
  nvml_return (*nvlink_remote_type)(nvml_device, unsigned, int*) = nullptr;
  nvml_return (*cpu_affinity)(nvml_device, unsigned, unsigned long*) = nullptr;
  nvml_return (*numa_node_id)(nvml_device, unsigned*) = nullptr;

 private:
  // Declared before session_, so nvmlShutdown runs before the library is closed.
  dynamic_library library_;
  unique_handle<nvml_session_traits> session_;
  std::string error_;
  const char* (*error_string_)(nvml_return) = nullptr;
};

}  // namespace ferry::shim
