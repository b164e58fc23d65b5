// ferry probe --topology: how this machine's CPUs, NUMA nodes and GPUs connect, the way
// `nvidia-smi topo -m` shows it, plus each GPU's PCIe link and the measured GPU-to-GPU bandwidth.
//
// The host part reads Linux sysfs (a root directory given as a parameter, so tests can fake it). The GPU
// part (cuda builds, cuda backend) asks the CUDA runtime for the GPUs and their peer attributes, NVML
// (opened at run time from libnvidia-ml.so.1, never linked) for PCIe and NVLink state and the PCI
// topology between GPUs, and falls back to sysfs when NVML is missing.
//
// P2P bandwidth is decimal GB/s (1e9 bytes/s) of payload: bytes / time of one cudaMemcpyPeerAsync, timed
// with events on the source GPU's stream; the median over the timed iterations. Bytes are verified once
// per pair with ferry's checksum.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/core/progress.hpp"
#include "ferry/device/device.hpp"

namespace ferry::probe {

/// How two GPUs connect, in nvidia-smi's words: X (itself), NV# (NVLink), PIX (at most one PCIe bridge),
/// PXB (several PCIe bridges, no host bridge), PHB (a PCIe host bridge), NODE (host bridges within one
/// NUMA node), SYS (across NUMA nodes, over the CPU interconnect).
enum class gpu_link : std::uint8_t { self, nvlink, pix, pxb, phb, node, sys, unknown };

/// "X", "NV", "PIX", "PXB", "PHB", "NODE", "SYS" or "?" (the NVLink count is not part of it).
[[nodiscard]] std::string_view to_string(gpu_link l) noexcept;

/// A host NUMA node.
struct numa_node {
  int id = 0;
  std::vector<int> cpus;           // from node<id>/cpulist
  std::uint64_t memory_bytes = 0;  // MemTotal of node<id>/meminfo; 0 when unknown
};

/// A device's PCIe link; 0 means unknown.
struct pcie_link {
  int current_gen = 0;
  int current_width = 0;
  int max_gen = 0;
  int max_width = 0;
  std::string source;  // "nvml", "sysfs", or empty when nothing could be read
};

/// What sysfs says about one PCI device (/sys/bus/pci/devices/<bus id>/).
struct pci_device {
  std::string bus_id;              // normalised: "0000:3b:00.0"
  int numa_node = -1;              // -1: none or unknown
  std::vector<int> local_cpus;     // local_cpulist
  pcie_link link;                  // current/max link speed and width (source "sysfs" when read)
  std::string device_path;         // the resolved /sys/devices/... path, for the PCI tree; empty if missing
  std::vector<std::string> notes;  // files that were missing or unreadable
};

/// One GPU.
struct gpu_info {
  int ordinal = 0;
  std::string name;
  std::string pci_bus_id;  // normalised, as in pci_device
  int numa_node = -1;
  std::vector<int> cpu_affinity;  // CPUs local to the GPU
  pcie_link pcie;
  int nvlinks = 0;  // active NVLink links (0 without NVLink or NVML)
};

/// From one GPU to another.
struct gpu_pair {
  gpu_link link = gpu_link::unknown;
  int nvlinks = 0;                // NV# when link is nvlink
  bool access_supported = false;  // cudaDevP2PAttrAccessSupported
  int performance_rank = 0;       // cudaDevP2PAttrPerformanceRank (lower is better)
  bool native_atomics = false;    // cudaDevP2PAttrNativeAtomicSupported
  double gbps = 0;                // measured median; 0 when not measured
  bool checked = false;           // copied bytes verified
};

/// Everything --topology found.
struct topology {
  int cpu_count = 0;            // online CPUs
  std::vector<numa_node> numa;  // host NUMA nodes (empty when sysfs has none)
  std::vector<gpu_info> gpus;
  std::vector<std::vector<gpu_pair>> pairs;  // [from][to], gpus.size() squared; the diagonal is self
  std::string gpu_note;            // why gpus is empty ("host backend", "no GPU visible ..."), else empty
  std::string nvml_note;           // "NVML not available: <reason>" when NVML could not be used
  std::vector<std::string> notes;  // other findings: unreadable sysfs files, failed measurements
  std::uint64_t p2p_bytes = 0;     // per copy; 0 when P2P bandwidth was not measured
  int p2p_iterations = 0;
};

/// What to discover and how hard.
struct topology_options {
  std::string sysfs_root = "/sys";
  bool gpus = true;  // false: host part only (as for the host backend)
  bool measure_p2p = true;
  std::size_t p2p_bytes = 256 * (std::size_t{1} << 20);
  int p2p_warmup = 1;
  int p2p_iterations = 5;
};

/// Parses a Linux CPU list ("0-3,8-11", "5", "" or "\n") into sorted CPU numbers. Throws input_error
/// naming the text and the bad part.
[[nodiscard]] std::vector<int> parse_cpulist(std::string_view text);
/// The inverse: sorted CPU numbers as ranges, "0-3,8-11"; "" for none.
[[nodiscard]] std::string format_cpulist(const std::vector<int>& cpus);
/// PCIe generation of a sysfs link speed ("16.0 GT/s PCIe", "32 GT/s"): 1 to 6, 0 when unknown.
[[nodiscard]] int pcie_gen_from_speed(std::string_view text) noexcept;
/// "0000:3B:00.0" or "00000000:3b:00.0" -> "0000:3b:00.0" (sysfs's form).
[[nodiscard]] std::string normalize_bus_id(std::string_view bus_id);

/// The NUMA nodes under <sysfs_root>/devices/system/node. Empty when the folder is missing (no NUMA);
/// throws input_error naming the file when a file there cannot be parsed.
[[nodiscard]] std::vector<numa_node> read_numa_nodes(const std::string& sysfs_root);
/// Online CPUs from <sysfs_root>/devices/system/cpu/online; 0 when missing.
[[nodiscard]] int read_cpu_count(const std::string& sysfs_root);
/// sysfs's view of the PCI device `bus_id`. Missing files leave fields unknown and add a note; a file
/// that exists but cannot be parsed throws input_error naming it.
[[nodiscard]] pci_device read_pci_device(const std::string& sysfs_root, std::string_view bus_id);
/// The link between two PCI devices from their sysfs paths and NUMA nodes (the fallback without NVML).
[[nodiscard]] gpu_link link_from_pci_paths(const pci_device& a, const pci_device& b) noexcept;

/// Discovers the topology: the host part always, GPUs when `b` is cuda and ferry was built with CUDA.
/// `progress` (may be empty) receives one line per step. Throws input_error for unparseable sysfs files,
/// cuda_error when the CUDA runtime fails.
[[nodiscard]] topology discover_topology(backend b, const topology_options& opts, progress_fn progress = {});

/// The text `ferry probe --topology` prints: the GPU matrix with CPU and NUMA affinity, per-GPU PCIe
/// links, the P2P bandwidth matrix, and the host's NUMA nodes.
[[nodiscard]] std::string format_table(const topology& t);
/// The same as JSON (what `ferry probe --topology --json` prints).
[[nodiscard]] std::string to_json(const topology& t, int indent = 2);

namespace detail {
/// The GPU part of discover_topology: fills gpus, pairs, gpu_note, nvml_note, notes and the P2P fields.
/// Defined by the cuda backend, or by a stub in builds without CUDA.
void discover_gpus(topology& t, const topology_options& opts, const progress_fn& progress);
}  // namespace detail

}  // namespace ferry::probe
