// The GPU part of ferry probe --topology on the cuda backend: the GPUs the CUDA runtime sees, their peer
// attributes and measured peer bandwidth, and NVML (through ferry::shim, so ferry runs where the driver's
// NVML is missing) for PCIe link state, NVLink and the PCI topology between GPUs. Without NVML the PCIe
// figures and the GPU-to-GPU path come from sysfs.
#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "ferry/core/error.hpp"
#include "ferry/core/pattern.hpp"
#include "ferry/core/stats.hpp"
#include "ferry/core/units.hpp"
#include "ferry/cuda/detail/cuda_try.hpp"
#include "ferry/cuda/detail/handles.hpp"
#include "ferry/cuda/detail/kernels.cuh"
#include "ferry/device/device.hpp"
#include "ferry/probe/topology.hpp"
#include "ferry/shim/nvml.hpp"

namespace ferry::probe::detail {
namespace {

using shim::nvml_device;
using shim::nvml_library;
using shim::nvml_pci_info;
using shim::nvml_return;
using shim::nvml_success;

gpu_link from_nvml_level(int level) noexcept {
  switch (level) {
    case shim::nvml_topology_internal:
    case shim::nvml_topology_single: return gpu_link::pix;
    case shim::nvml_topology_multiple: return gpu_link::pxb;
    case shim::nvml_topology_hostbridge: return gpu_link::phb;
    case shim::nvml_topology_node: return gpu_link::node;
    case shim::nvml_topology_system: return gpu_link::sys;
    default: return gpu_link::unknown;
  }
}

// Active NVLinks of one GPU and where each goes.
struct nvlinks {
  std::vector<std::string> remote_bus_ids;  // per active link; empty string when unknown
  int to_switch = 0;                        // active links that end at an NVSwitch
};

nvlinks read_nvlinks(const nvml_library& nvml, nvml_device dev) {
  nvlinks out;
  if (nvml.nvlink_state == nullptr) return out;
  for (unsigned link = 0; link < 64; ++link) {
    int active = 0;
    const nvml_return status = nvml.nvlink_state(dev, link, &active);
    if (status == shim::nvml_error_invalid_argument) break;  // past the last link
    if (status != nvml_success) {
      if (link == 0) break;  // no NVLink on this GPU (NOT_SUPPORTED)
      continue;
    }
    if (active == 0) continue;
    std::string remote;
    nvml_pci_info pci{};
    if (nvml.nvlink_remote_pci != nullptr && nvml.nvlink_remote_pci(dev, link, &pci) == nvml_success) {
      pci.bus_id[sizeof pci.bus_id - 1] = '\0';
      remote = normalize_bus_id(pci.bus_id);
    }
    int type = -1;
    if (nvml.nvlink_remote_type != nullptr && nvml.nvlink_remote_type(dev, link, &type) == nvml_success &&
        type == shim::nvml_nvlink_device_type_switch)
      ++out.to_switch;
    out.remote_bus_ids.push_back(std::move(remote));
  }
  return out;
}

// Device memory, streams and events of the P2P measurement on one GPU; freed on that GPU.
struct gpu_buffers {
  int ordinal = 0;
  // Declared in the order they are made, so they are freed in reverse, with `ordinal` current (below).
  cuda_handles::unique_memory src;
  cuda_handles::unique_memory dst;
  cuda_handles::unique_memory result_memory;
  cuda_handles::unique_stream stream;
  cuda_handles::unique_event start;
  cuda_handles::unique_event stop;

  gpu_buffers() = default;
  gpu_buffers(const gpu_buffers&) = delete;
  gpu_buffers& operator=(const gpu_buffers&) = delete;
  ~gpu_buffers() { static_cast<void>(cudaSetDevice(ordinal)); }

  [[nodiscard]] std::uint64_t* result() const { return static_cast<std::uint64_t*>(result_memory.get()); }

  void allocate(int gpu, std::size_t bytes, std::uint64_t seed) {
    ordinal = gpu;
    FERRY_CUDA_TRY(cudaSetDevice(gpu));
    void* p = nullptr;
    const cudaError_t status = cudaMalloc(&p, bytes);
    if (status == cudaErrorMemoryAllocation) {
      static_cast<void>(cudaGetLastError());
      throw out_of_memory(fmt::format("P2P probe: 2 buffers of {} do not fit on GPU {}; lower the copy size",
                                      format_bytes(bytes), gpu));
    }
    FERRY_CUDA_TRY(status);
    src.reset(p);
    FERRY_CUDA_TRY(cudaMalloc(&p, bytes));
    dst.reset(p);
    FERRY_CUDA_TRY(cudaMalloc(&p, sizeof(std::uint64_t)));
    result_memory.reset(p);
    cudaStream_t s = nullptr;
    FERRY_CUDA_TRY(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    stream.reset(s);
    cudaEvent_t e = nullptr;
    FERRY_CUDA_TRY(cudaEventCreate(&e));
    start.reset(e);
    FERRY_CUDA_TRY(cudaEventCreate(&e));
    stop.reset(e);
    FERRY_CUDA_TRY(cuda_kernels::launch_fill_pattern(src.get(), bytes, seed, stream.get()));
    FERRY_CUDA_TRY(cudaStreamSynchronize(stream.get()));
  }
};

// Copies from GPU `from` to GPU `to` and returns the median GB/s; verifies the bytes once.
double measure_pair(gpu_buffers& from, gpu_buffers& to, std::size_t bytes, std::uint64_t seed,
                    const topology_options& opts, bool& checked) {
  FERRY_CUDA_TRY(cudaSetDevice(from.ordinal));
  for (int i = 0; i < opts.p2p_warmup; ++i)
    FERRY_CUDA_TRY(cudaMemcpyPeerAsync(to.dst.get(), to.ordinal, from.src.get(), from.ordinal, bytes,
                                       from.stream.get()));
  std::vector<double> gbps;
  for (int i = 0; i < opts.p2p_iterations; ++i) {
    FERRY_CUDA_TRY(cudaEventRecord(from.start.get(), from.stream.get()));
    FERRY_CUDA_TRY(cudaMemcpyPeerAsync(to.dst.get(), to.ordinal, from.src.get(), from.ordinal, bytes,
                                       from.stream.get()));
    FERRY_CUDA_TRY(cudaEventRecord(from.stop.get(), from.stream.get()));
    FERRY_CUDA_TRY(cudaEventSynchronize(from.stop.get()));
    float ms = 0;
    FERRY_CUDA_TRY(cudaEventElapsedTime(&ms, from.start.get(), from.stop.get()));
    if (ms > 0) gbps.push_back(gb_per_s(bytes, static_cast<double>(ms) * 1e-3));
  }
  // What arrived on `to` must be the pattern `from` holds.
  FERRY_CUDA_TRY(cudaSetDevice(to.ordinal));
  FERRY_CUDA_TRY(cudaMemsetAsync(to.result(), 0, sizeof(std::uint64_t), to.stream.get()));
  FERRY_CUDA_TRY(cuda_kernels::launch_checksum(to.dst.get(), bytes, to.result(), to.stream.get()));
  std::uint64_t sum = 0;
  FERRY_CUDA_TRY(cudaMemcpyAsync(&sum, to.result(), sizeof sum, cudaMemcpyDeviceToHost, to.stream.get()));
  FERRY_CUDA_TRY(cudaStreamSynchronize(to.stream.get()));
  const std::uint64_t expected = pattern_checksum(seed, bytes);
  FERRY_EXPECTS(sum == expected, fmt::format("P2P probe: the {} copied from GPU {} to GPU {} arrived wrong "
                                             "(checksum {:#x}, expected {:#x})",
                                             format_bytes(bytes), from.ordinal, to.ordinal, sum, expected));
  checked = true;
  return median(std::move(gbps));
}

std::uint64_t seed_of(int gpu) noexcept { return 0x70706f6c6f6779ULL + static_cast<std::uint64_t>(gpu); }

void measure_p2p(topology& t, const topology_options& opts, const progress_fn& progress) {
  const int n = static_cast<int>(t.gpus.size());
  std::vector<gpu_buffers> buffers(static_cast<std::size_t>(n));
  for (int g = 0; g < n; ++g)
    buffers[static_cast<std::size_t>(g)].allocate(t.gpus[static_cast<std::size_t>(g)].ordinal, opts.p2p_bytes,
                                                  seed_of(g));
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j < n; ++j) {
      if (i == j) continue;
      gpu_pair& p = t.pairs[static_cast<std::size_t>(i)][static_cast<std::size_t>(j)];
      gpu_buffers& from = buffers[static_cast<std::size_t>(i)];
      gpu_buffers& to = buffers[static_cast<std::size_t>(j)];
      if (progress)
        progress(fmt::format("P2P GPU{} -> GPU{} ({}, {} per copy)", from.ordinal, to.ordinal,
                             p.access_supported ? "peer access" : "no peer access: staged",
                             format_bytes(opts.p2p_bytes)));
      bool enabled_here = false;
      if (p.access_supported) {
        FERRY_CUDA_TRY(cudaSetDevice(from.ordinal));
        const cudaError_t status = cudaDeviceEnablePeerAccess(to.ordinal, 0);
        if (status == cudaSuccess) {
          enabled_here = true;
        } else if (status == cudaErrorPeerAccessAlreadyEnabled) {
          static_cast<void>(cudaGetLastError());
        } else {
          FERRY_CUDA_TRY(status);
        }
      } else {
        t.notes.push_back(fmt::format("GPU{} -> GPU{}: no peer access; the copy is staged through the host",
                                      from.ordinal, to.ordinal));
      }
      p.gbps = measure_pair(from, to, opts.p2p_bytes, seed_of(i), opts, p.checked);
      if (enabled_here) {
        FERRY_CUDA_TRY(cudaSetDevice(from.ordinal));
        FERRY_CUDA_TRY(cudaDeviceDisablePeerAccess(to.ordinal));
      }
    }
  }
  t.p2p_bytes = opts.p2p_bytes;
  t.p2p_iterations = opts.p2p_iterations;
}

}  // namespace

void discover_gpus(topology& t, const topology_options& opts, const progress_fn& progress) {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    static_cast<void>(cudaGetLastError());
    t.gpu_note = fmt::format("no usable GPU: {} ({})", cudaGetErrorString(status), cudaGetErrorName(status));
    return;
  }
  if (count == 0) {
    t.gpu_note = "no GPU visible to the CUDA runtime";
    return;
  }
  int previous = 0;
  FERRY_CUDA_TRY(cudaGetDevice(&previous));

  std::vector<pci_device> pci;
  for (int g = 0; g < count; ++g) {
    gpu_info info;
    info.ordinal = g;
    cudaDeviceProp prop{};
    FERRY_CUDA_TRY(cudaGetDeviceProperties(&prop, g));
    info.name = prop.name;
    char bus[32] = {};
    FERRY_CUDA_TRY(cudaDeviceGetPCIBusId(bus, sizeof bus, g));
    info.pci_bus_id = normalize_bus_id(bus);
    pci_device d = read_pci_device(opts.sysfs_root, info.pci_bus_id);
    for (auto& note : d.notes) t.notes.push_back(fmt::format("GPU{}: {}", g, note));
    info.numa_node = d.numa_node;
    info.cpu_affinity = d.local_cpus;
    info.pcie = d.link;
    t.gpus.push_back(std::move(info));
    pci.push_back(std::move(d));
  }

  const auto n = static_cast<std::size_t>(count);
  t.pairs.assign(n, std::vector<gpu_pair>(n));
  for (std::size_t i = 0; i < n; ++i) {
    for (std::size_t j = 0; j < n; ++j) {
      gpu_pair& p = t.pairs[i][j];
      if (i == j) {
        p.link = gpu_link::self;
        continue;
      }
      int value = 0;
      const int a = static_cast<int>(i);
      const int b = static_cast<int>(j);
      FERRY_CUDA_TRY(cudaDeviceGetP2PAttribute(&value, cudaDevP2PAttrAccessSupported, a, b));
      p.access_supported = value != 0;
      FERRY_CUDA_TRY(cudaDeviceGetP2PAttribute(&value, cudaDevP2PAttrPerformanceRank, a, b));
      p.performance_rank = value;
      FERRY_CUDA_TRY(cudaDeviceGetP2PAttribute(&value, cudaDevP2PAttrNativeAtomicSupported, a, b));
      p.native_atomics = value != 0;
      p.link = link_from_pci_paths(pci[i], pci[j]);  // refined by NVML below
    }
  }

  if (progress) progress(fmt::format("opening NVML ({})", shim::nvml_library_name));
  nvml_library nvml;
  if (!nvml.ok()) {
    t.nvml_note = nvml.error() + "; PCIe links and GPU paths come from sysfs, NVLink is not reported";
  } else {
    std::vector<nvml_device> handles(n, nullptr);
    std::vector<nvlinks> links(n);
    for (std::size_t g = 0; g < n; ++g) {
      gpu_info& info = t.gpus[g];
      const nvml_return found = nvml.by_bus_id(info.pci_bus_id.c_str(), &handles[g]);
      if (found != nvml_success) {
        handles[g] = nullptr;
        t.notes.push_back(fmt::format("GPU{}: NVML does not know bus id {}: {}", g, info.pci_bus_id,
                                      nvml.error_string(found)));
        continue;
      }
      unsigned cg = 0, cw = 0, mg = 0, mw = 0;
      if (nvml.curr_gen != nullptr && nvml.curr_width != nullptr && nvml.max_gen != nullptr &&
          nvml.max_width != nullptr && nvml.curr_gen(handles[g], &cg) == nvml_success &&
          nvml.curr_width(handles[g], &cw) == nvml_success && nvml.max_gen(handles[g], &mg) == nvml_success &&
          nvml.max_width(handles[g], &mw) == nvml_success) {
        info.pcie = pcie_link{static_cast<int>(cg), static_cast<int>(cw), static_cast<int>(mg),
                              static_cast<int>(mw), "nvml"};
      }
      unsigned numa = 0;
      if (info.numa_node < 0 && nvml.numa_node_id != nullptr &&
          nvml.numa_node_id(handles[g], &numa) == nvml_success)
        info.numa_node = static_cast<int>(numa);
      if (info.cpu_affinity.empty() && nvml.cpu_affinity != nullptr) {
        constexpr unsigned words = 64;  // 4096 CPUs
        std::vector<unsigned long> mask(words, 0);
        if (nvml.cpu_affinity(handles[g], words, mask.data()) == nvml_success) {
          constexpr unsigned bits = sizeof(unsigned long) * 8;
          for (unsigned w = 0; w < words; ++w)
            for (unsigned bit = 0; bit < bits; ++bit)
              if ((mask[w] >> bit) & 1UL) info.cpu_affinity.push_back(static_cast<int>(w * bits + bit));
        }
      }
      links[g] = read_nvlinks(nvml, handles[g]);
      info.nvlinks = static_cast<int>(links[g].remote_bus_ids.size());
    }
    for (std::size_t i = 0; i < n; ++i) {
      for (std::size_t j = 0; j < n; ++j) {
        if (i == j || handles[i] == nullptr || handles[j] == nullptr) continue;
        gpu_pair& p = t.pairs[i][j];
        int level = -1;
        if (nvml.common_ancestor != nullptr &&
            nvml.common_ancestor(handles[i], handles[j], &level) == nvml_success)
          p.link = from_nvml_level(level);
        int direct = static_cast<int>(
            std::count(links[i].remote_bus_ids.begin(), links[i].remote_bus_ids.end(), t.gpus[j].pci_bus_id));
        // Behind NVSwitches every GPU reaches every other over all its switch links (nvidia-smi: NV18).
        if (direct == 0 && links[i].to_switch > 0 && links[j].to_switch > 0)
          direct = std::min(links[i].to_switch, links[j].to_switch);
        if (direct > 0) {
          p.link = gpu_link::nvlink;
          p.nvlinks = direct;
        }
      }
    }
  }
  for (const auto& g : t.gpus) {
    if (g.pcie.current_gen > 0 && g.pcie.max_gen > 0 &&
        (g.pcie.current_gen < g.pcie.max_gen || g.pcie.current_width < g.pcie.max_width))
      t.notes.push_back(
          fmt::format("GPU{}'s PCIe link runs at Gen{} x{} now, below its Gen{} x{}: GPUs slow the "
                      "link while idle; under load it should read the max",
                      g.ordinal, g.pcie.current_gen, g.pcie.current_width, g.pcie.max_gen, g.pcie.max_width));
  }

  if (opts.measure_p2p && n > 1) measure_p2p(t, opts, progress);
  FERRY_CUDA_TRY(cudaSetDevice(previous));
}

}  // namespace ferry::probe::detail
