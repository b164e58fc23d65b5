// `ferry bench egress`: the device-to-host ladder of BACKGROUND.md re-created on the device interface,
// next to the compute-only ceiling ("ideal") and ferry's own egress pipeline.
//
// The workload is a synthetic segmentation model: every step occupies the compute stream for the
// configured compute time (a spin kernel standing in for the network), then writes the step's output
// (batch x classes x height x width fp32, 1.41 GB at the reference shape) with the verification pattern
// of the step's seed. Host processing, at every level, is the check of every delivered byte against that
// pattern (or, with check off, a checksum over every byte), so each row does the same host work.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "ferry/bench/bench_trace.hpp"
#include "ferry/device/device.hpp"

namespace ferry::bench {

/// The egress bench's workload and levels.
struct egress_config {
  std::size_t batch = 64;
  std::size_t input_channels = 3;
  std::size_t classes = 21;
  std::size_t height = 512;
  std::size_t width = 512;
  std::chrono::nanoseconds compute{std::chrono::milliseconds(165)};  // per step: the reference's rate
  int warmup = 2;                          // untimed steps per level
  int steps = 10;                          // timed steps per level
  std::size_t workers = 8;                 // host processing threads (L1..L4 and ferry's sink workers)
  std::size_t pool_buffers = 4;            // whole-output host buffers of the L2..L4 pools
  std::size_t slot_bytes = 64 * (std::size_t{1} << 20);  // ferry's pinned slot
  std::size_t slots = 32;                  // ferry's pinned slots: above an output's chunk count
  bool check = true;                       // verify every delivered byte (else checksum them)
  std::vector<std::string> levels{"ideal", "L0", "L1", "L2", "L3", "L4", "L4-pinned", "ferry"};
  double probed_d2h_gbps = 0;              // 0: measure pinned D2H first
  trace_options trace;                     // record and analyze each level's timed steps
  // Modelled extra processing time (the processing thread sleeps) per MiB of output, on top of checking
  // it: a stand-in for a heavier post-processing step. 0 on cuda.
  double process_ms_per_mib = 0;

  [[nodiscard]] std::uint64_t output_bytes() const noexcept {
    return std::uint64_t{batch} * classes * height * width * sizeof(float);
  }
  [[nodiscard]] std::uint64_t input_bytes() const noexcept {
    return std::uint64_t{batch} * input_channels * height * width * sizeof(float);
  }
};

/// The reference workload on cuda; on the host backend a small shape, so the demo ends in seconds.
[[nodiscard]] egress_config default_egress_config(backend b);

/// The host device the ladders run on without a GPU: the reference link (53.6 / 54.8 GB/s pinned, 6.7 /
/// 11.8 pageable) slowed down 24 times, so that the host defaults' small batches and outputs keep the
/// reference workloads' copy-to-compute proportions (a memcpy could not emulate 55 GB/s anyway).
[[nodiscard]] host_device_options ladder_host_options();

/// Every level the bench knows, with what it does and what bounds it.
[[nodiscard]] const std::vector<level_info>& egress_levels();

/// One row of the ladder.
struct egress_row {
  std::string level;
  int steps = 0;
  double seconds = 0;            // wall time of the timed steps, until their last byte was processed
  double steps_per_s = 0;
  double ratio_to_ideal = 0;     // steps_per_s / ideal's (0 when ideal was not run)
  std::uint64_t bytes = 0;       // bytes moved device to host in the timed steps
  double d2h_gbps = 0;           // bytes / seconds / 1e9
  double link_fraction = 0;      // d2h_gbps / probed pinned D2H
  double gpu_idle = 0;           // 1 - (compute-stream busy time / wall time)
  std::uint64_t checked_bytes = 0;  // bytes compared against the pattern (or checksummed)
  std::uint64_t mismatches = 0;  // outputs (chunks for ferry) with a wrong byte
  double pin_seconds = 0;        // pinning done by the level before timing
  std::string bottleneck;        // with tracing: the analyzer's first finding (its rule id)
  std::string finding;           // and its title
};

/// A full ladder run.
struct egress_result {
  device_info device;
  egress_config config;
  double probed_d2h_gbps = 0;
  std::vector<egress_row> rows;
  std::vector<level_trace> traces;  // with tracing: one per level, in order
  [[nodiscard]] const egress_row* find(const std::string& level) const noexcept;
};

/// Progress lines, for stderr.
using progress_fn = void (*)(const std::string&);

/// Runs the configured levels in order. Throws logic_error for an unknown level or a zero-sized shape,
/// out_of_memory when buffers cannot be had.
[[nodiscard]] egress_result run_egress(device& dev, const egress_config& cfg, progress_fn progress = nullptr);

/// Pure copy: ferry's egress pipeline draining one device output again and again with no compute, every
/// byte checked; compared with the probed pinned D2H bandwidth.
struct pure_copy_result {
  device_info device;
  std::uint64_t output_bytes = 0;
  int outputs = 0;               // outputs timed (fewer than asked when a deadline stopped it)
  double seconds = 0;
  std::chrono::steady_clock::time_point window_start{}, window_end{};
  double gbps = 0;               // end to end: bytes delivered and checked / wall time
  double copy_gbps = 0;          // the pipeline's copies alone (event-timed)
  double probed_d2h_gbps = 0;
  double link_fraction = 0;      // gbps / probed_d2h_gbps
  std::uint64_t mismatches = 0;
};
/// `deadline`: stop submitting then (the result counts the outputs submitted before it), so that two
/// modes running at once can share one window.
[[nodiscard]] pure_copy_result run_egress_pure_copy(
    device& dev, const egress_config& cfg, int outputs, progress_fn progress = nullptr,
    std::chrono::steady_clock::time_point deadline = std::chrono::steady_clock::time_point::max());

/// The text table of a ladder run.
[[nodiscard]] std::string format_table(const egress_result& r);

}  // namespace ferry::bench
