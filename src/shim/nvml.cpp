#include "ferry/shim/nvml.hpp"

#include <fmt/format.h>

namespace ferry::shim {

nvml_library::nvml_library() : library_(dynamic_library::open({nvml_library_name})) {
  if (!library_.loaded()) {
    error_ = "NVML not available: " + library_.error();
    return;
  }
  const auto init = library_.optional_function<nvml_return (*)()>("nvmlInit_v2");
  const auto shutdown = library_.optional_function<nvml_return (*)()>("nvmlShutdown");
  error_string_ = library_.optional_function<const char* (*)(nvml_return)>("nvmlErrorString");
  by_bus_id = library_.optional_function<decltype(by_bus_id)>("nvmlDeviceGetHandleByPciBusId_v2");
  curr_gen = library_.optional_function<decltype(curr_gen)>("nvmlDeviceGetCurrPcieLinkGeneration");
  curr_width = library_.optional_function<decltype(curr_width)>("nvmlDeviceGetCurrPcieLinkWidth");
  max_gen = library_.optional_function<decltype(max_gen)>("nvmlDeviceGetMaxPcieLinkGeneration");
  max_width = library_.optional_function<decltype(max_width)>("nvmlDeviceGetMaxPcieLinkWidth");
  common_ancestor =
      library_.optional_function<decltype(common_ancestor)>("nvmlDeviceGetTopologyCommonAncestor");
  nvlink_state = library_.optional_function<decltype(nvlink_state)>("nvmlDeviceGetNvLinkState");
  nvlink_remote_pci =
      library_.optional_function<decltype(nvlink_remote_pci)>("nvmlDeviceGetNvLinkRemotePciInfo_v2");
  nvlink_remote_type =
      library_.optional_function<decltype(nvlink_remote_type)>("nvmlDeviceGetNvLinkRemoteDeviceType");
  cpu_affinity = library_.optional_function<decltype(cpu_affinity)>("nvmlDeviceGetCpuAffinity");
  numa_node_id = library_.optional_function<decltype(numa_node_id)>("nvmlDeviceGetNumaNodeId");
  if (init == nullptr || shutdown == nullptr || by_bus_id == nullptr) {
    error_ = fmt::format(
        "NVML not available: {} lacks nvmlInit_v2, nvmlShutdown or "
        "nvmlDeviceGetHandleByPciBusId_v2",
        nvml_library_name);
    return;
  }
  const nvml_return status = init();
  if (status != nvml_success) {
    error_ = fmt::format("NVML not available: nvmlInit_v2 failed: {}", error_string(status));
    return;
  }
  session_.reset(shutdown);
}

std::string nvml_library::error_string(nvml_return status) const {
  const char* text = error_string_ != nullptr ? error_string_(status) : nullptr;
  return fmt::format("{} (NVML {})", text != nullptr ? text : "unknown error", status);
}

}  // namespace ferry::shim
