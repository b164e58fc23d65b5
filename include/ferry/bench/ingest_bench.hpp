// `ferry bench ingest`: the host-to-device ladder of README.md ("The ladders: L0..L4") re-created on the
// device interface, next to the compute-only ceiling ("ideal") and ferry's loader + prefetcher.
//
// The workload is a synthetic training step: every step occupies the compute stream for the configured
// compute time (a spin kernel standing in for ResNet-18 forward + backward + Adam), then reads the whole
// batch with a checksum kernel. Samples are made on the CPU: each image is the verification pattern of the
// sample's seed (an add per 8 bytes: a fast generator), each label its dataset index. After the timed steps
// every device checksum is compared with the checksum the host expects for that batch.
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include "ferry/bench/egress_bench.hpp"
#include "ferry/bench/ladder.hpp"
#include "ferry/bench/start_line.hpp"
#include "ferry/device/device.hpp"

namespace ferry::bench {

/// The ingest bench's workload; the settings every ladder shares are in ladder_options.
struct ingest_options : ladder_options {
  std::size_t batch = 64;
  std::size_t channels = 3;
  std::size_t height = 512;
  std::size_t width = 512;
  std::size_t host_slots = 4;  // pinned batches the workers may fill ahead (L2..L4, ferry)
  std::size_t depth = 2;       // device batches copied ahead (L3, L4, ferry)
  // Modelled decode time (the making thread sleeps) per MiB of image, on top of writing the bytes: a
  // stand-in for decoding and augmentation. 0 on cuda, where making the reference batch already costs.
  double make_ms_per_mib = 0;

  /// The reference workload's rate (compute per step), every level, 8 sample-making threads (L1..L4 and
  /// ferry).
  ingest_options();

  [[nodiscard]] std::uint64_t image_bytes() const noexcept {
    return std::uint64_t{channels} * height * width * sizeof(float);
  }
  [[nodiscard]] std::uint64_t sample_bytes() const noexcept { return image_bytes() + sizeof(std::int64_t); }
  [[nodiscard]] std::uint64_t batch_bytes() const noexcept { return sample_bytes() * batch; }
  /// The image batch as {batch, channels, height, width}.
  [[nodiscard]] std::array<std::size_t, 4> shape() const noexcept { return {batch, channels, height, width}; }
  void set_shape(const std::array<std::size_t, 4>& s) noexcept {
    std::tie(batch, channels, height, width) = std::tuple_cat(s);
  }
};

/// The reference workload on cuda; on the host backend a small shape, so the demo ends in seconds.
[[nodiscard]] ingest_options default_ingest_options(backend b);

/// Both ways' ingest side: the ladder's workload with 2 sample-making threads (after the first pass it
/// only rewrites labels), leaving the cores to the egress side's checks.
[[nodiscard]] ingest_options default_both_ways_ingest_options(backend b);

/// The ingest ladder: its levels, table columns and JSON names.
[[nodiscard]] const ladder_spec& ingest_spec();

/// Every level the bench knows, with what it does and what bounds it.
[[nodiscard]] const std::vector<level_info>& ingest_levels();

/// A full ladder run. Rows count checked and wrong batches; extras: worker_threads (threads making
/// samples besides the main thread), cpu_ms_per_step (process CPU time over the timed steps / steps),
/// cpu_ms_per_batch_made (the same CPU time / batches made in the window, comparable between levels
/// that run different distances ahead), make_cpu_ms_per_batch (CPU time inside the sample maker),
/// cpu_ms_per_batch.<thread role>, user/system CPU, page faults and context switches per batch, and
/// ferry's copier_waits (prefetch_stats::copier_waits).
struct ingest_result : ladder_result {
  ingest_options config;
};

/// Runs the configured levels in order. Throws logic_error for an unknown level or a zero-sized shape.
[[nodiscard]] ingest_result run_ingest(device& dev, const ingest_options& cfg, progress_fn progress = {});

/// Pure copy: ferry's loader + prefetcher moving `batches` batches with no compute, every batch's device
/// checksum compared with the host's. The samples' images are made in full only on the first pass over
/// the loader's pinned slots; later passes rewrite each sample's label alone, so the figure is the copy
/// path's, not the CPU's sample making (which the ladder measures).
struct ingest_pure_copy_result {
  device_info device;
  std::uint64_t batch_bytes = 0;
  int batches = 0;  // batches timed (fewer than asked when a deadline stopped it)
  double seconds = 0;
  std::chrono::steady_clock::time_point window_start{}, window_end{};
  double gbps = 0;  // bytes delivered to the device and checked / wall time
  double probed_h2d_gbps = 0;
  double link_fraction = 0;
  std::uint64_t mismatches = 0;
};
/// `together` (may be null): the timed window starts, after the warm-up batch, when every run on that
/// line has arrived, and ends at its deadline with at least one batch timed.
[[nodiscard]] ingest_pure_copy_result run_ingest_pure_copy(device& dev, const ingest_options& cfg,
                                                           int batches, progress_fn progress = {},
                                                           start_line* together = nullptr);

/// Both ways at once in one process: ingest pure copy and egress pure copy on their own threads, their
/// timed windows started together once both are set up (a start_line) and stopped at one deadline
/// `duration` later, each with at least one item; compared with the probed both-directions total.
struct both_ways_result {
  ingest_pure_copy_result ingest;
  pure_copy_result egress;
  double overlap = 0;     // the two timed windows' common part over the longer window
  double total_gbps = 0;  // ingest GB/s + egress GB/s, each over its own (overlapping) window
  double probed_duplex_gbps = 0;
  double link_fraction = 0;
};
[[nodiscard]] both_ways_result run_both_ways(device& dev, const ingest_options& in_cfg,
                                             const egress_options& out_cfg,
                                             std::chrono::milliseconds duration, progress_fn progress = {});

/// The ingest pure copy's result as one line of text, and as JSON.
[[nodiscard]] std::string format_text(const ingest_pure_copy_result& r);
[[nodiscard]] nlohmann::json to_json(const ingest_pure_copy_result& r, const run_stamp& stamp);

/// Both ways' result as one line of text, and as JSON.
[[nodiscard]] std::string format_text(const both_ways_result& r);
[[nodiscard]] nlohmann::json to_json(const both_ways_result& r, const run_stamp& stamp);

}  // namespace ferry::bench
