// `ferry bench egress`: the device-to-host ladder of README.md ("The ladders: L0..L4") re-created on the
// device interface, next to the compute-only ceiling ("ideal") and ferry's own egress pipeline.
//
// The workload is a synthetic segmentation model: every step occupies the compute stream for the
// configured compute time (a spin kernel standing in for the network), then writes the step's output
// (batch x classes x height x width fp32, 1.41 GB at the reference shape) with the verification pattern
// of the step's seed. Host processing, at every level, is the check of every delivered byte against that
// pattern (or, with check off, a checksum over every byte), so each row does the same host work.
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include "ferry/bench/ladder.hpp"
#include "ferry/bench/start_line.hpp"
#include "ferry/core/units.hpp"
#include "ferry/device/device.hpp"

namespace ferry::bench {

/// The egress bench's workload; the settings every ladder shares are in ladder_options.
struct egress_options : ladder_options {
  std::size_t batch = 64;
  std::size_t input_channels = 3;
  std::size_t classes = 21;
  std::size_t height = 512;
  std::size_t width = 512;
  std::size_t pool_buffers = 4;       // whole-output host buffers of the L2..L4 pools
  std::size_t slot_bytes = 64 * MiB;  // ferry's pinned slot
  std::size_t slots = 32;             // ferry's pinned slots: above an output's chunk count
  // Modelled extra processing time (the processing thread sleeps) per MiB of output, on top of checking
  // it: a stand-in for a heavier post-processing step. 0 on cuda.
  double process_ms_per_mib = 0;
  // A self-test of the check: each level flips one byte of the first output chunk it processes before
  // checking it, so a run that checks must count one wrong chunk per level that delivers outputs.
  bool inject_wrong_byte = false;

  /// The reference workload's rate (compute per step), every level, 8 host processing threads (L1..L4
  /// and ferry's sink workers). With check off, every delivered byte is checksummed instead of verified.
  egress_options();

  [[nodiscard]] std::uint64_t output_bytes() const noexcept {
    return std::uint64_t{batch} * classes * height * width * sizeof(float);
  }
  [[nodiscard]] std::uint64_t input_bytes() const noexcept {
    return std::uint64_t{batch} * input_channels * height * width * sizeof(float);
  }
  /// The output as {batch, classes, height, width}.
  [[nodiscard]] std::array<std::size_t, 4> shape() const noexcept { return {batch, classes, height, width}; }
  void set_shape(const std::array<std::size_t, 4>& s) noexcept {
    std::tie(batch, classes, height, width) = std::tuple_cat(s);
  }
};

/// The reference workload on cuda; on the host backend a small shape, so the demo ends in seconds.
[[nodiscard]] egress_options default_egress_options(backend b);

/// Pure copy's settings. Pure copy is bound by how fast the host checks what arrives: on cuda, small
/// slots keep each chunk in the CPU's last-level cache between the copy that writes it and the check that
/// reads it, and every core but one checks (docs/PERFORMANCE.md). Elsewhere the ladder's settings.
[[nodiscard]] egress_options default_pure_copy_options(backend b);

/// Both ways' egress side: pure copy's slots, and every core but two checking (the ingest side only
/// rewrites labels, so most cores go to the egress checks).
[[nodiscard]] egress_options default_both_ways_egress_options(backend b);

/// The host device the ladders run on without a GPU: the reference link slowed down 24 times, so that
/// the host defaults' small batches and outputs keep the reference workloads' copy-to-compute
/// proportions (a memcpy could not emulate the reference link's speed anyway).
[[nodiscard]] host_device_options ladder_host_options();

/// The egress ladder: its levels, table columns and JSON names.
[[nodiscard]] const ladder_spec& egress_spec();

/// Every level the bench knows, with what it does and what bounds it.
[[nodiscard]] const std::vector<level_info>& egress_levels();

/// A full ladder run. Rows count checked bytes and wrong outputs (chunks for ferry); extra: pin_seconds
/// (pinning the level did before timing).
struct egress_result : ladder_result {
  egress_options config;
};

/// Runs the configured levels in order. Throws logic_error for an unknown level or a zero-sized shape,
/// out_of_memory when buffers cannot be had.
[[nodiscard]] egress_result run_egress(device& dev, const egress_options& cfg, progress_fn progress = {});

/// Pure copy: ferry's egress pipeline draining one device output again and again with no compute, every
/// byte checked; compared with the probed pinned D2H bandwidth.
struct pure_copy_result {
  device_info device;
  std::uint64_t output_bytes = 0;
  int outputs = 0;  // outputs timed (fewer than asked when a deadline stopped it)
  double seconds = 0;
  std::chrono::steady_clock::time_point window_start{}, window_end{};
  double gbps = 0;       // end to end: bytes delivered and checked / wall time
  double copy_gbps = 0;  // the pipeline's copies alone (event-timed)
  double probed_d2h_gbps = 0;
  double link_fraction = 0;  // gbps / probed_d2h_gbps
  std::uint64_t mismatches = 0;
};
/// `together` (may be null): the timed window starts when every run on that line has arrived, and stops
/// submitting at its deadline (the result counts the outputs submitted before it, at least one), so that
/// two modes running at once share one window.
[[nodiscard]] pure_copy_result run_egress_pure_copy(device& dev, const egress_options& cfg, int outputs,
                                                    progress_fn progress = {},
                                                    start_line* together = nullptr);

/// The pure copy's result as one line of text, and as JSON (with the config it ran).
[[nodiscard]] std::string format_text(const pure_copy_result& r);
[[nodiscard]] nlohmann::json to_json(const pure_copy_result& r, const egress_options& cfg,
                                     const run_stamp& stamp);

}  // namespace ferry::bench
