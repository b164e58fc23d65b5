// ferry probe: what this machine's link between host and device can do. Its figures are the ceilings
// the benches and the analyzer compare to.
//
// Bandwidths are decimal GB/s (1e9 bytes/s) of payload: bytes copied / time, time from events recorded
// around each copy on its stream; the figure reported is the median over the timed iterations. Copies of
// pinned memory are queued behind a host function that holds the stream until all are queued, so they
// run back to back and a slow host does not lower the figure; a pageable copy returns only once done,
// so its figure also holds the host's time between two copies. On the host backend events measure the
// emulated device's modelled time (make_host_device).
// Device-to-device is reported the same way (bytes copied once); the device memory traffic is twice that.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "ferry/core/memlock.hpp"
#include "ferry/core/progress.hpp"
#include "ferry/device/device.hpp"

namespace ferry::probe {

/// What to measure and how hard.
struct options {
  std::size_t copy_bytes = 256 * (std::size_t{1} << 20);  // per copy
  int warmup = 2;                                         // untimed copies per link
  int iterations = 10;                                    // timed copies per link
  std::size_t pin_bytes = std::size_t{1} << 30;           // pinned allocation timed for the pinning cost
  bool measure_pin_cost = true;
  bool check = true;  // verify every link's bytes once
};

/// Defaults sized for the backend: the host backend copies with memcpy, so it gets smaller sizes.
[[nodiscard]] options default_options(backend b);

/// One measured link.
struct link_result {
  std::string name;  // "pinned H2D", "pageable D2H", ...
  copy_direction direction{};
  memory_kind host_memory{};  // pinned or pageable (device for D2D)
  std::uint64_t bytes = 0;    // per copy
  int iterations = 0;
  double median_gbps = 0;
  double min_gbps = 0;
  double max_gbps = 0;
  bool checked = false;  // bytes verified after the copy
};

/// Both directions at once: one H2D and one D2H stream running together.
struct duplex_result {
  std::uint64_t bytes_each_way = 0;  // per copy
  int iterations = 0;                // copies per direction
  double total_gbps = 0;             // (H2D bytes + D2H bytes) / the window, timed with events
  double h2d_gbps = 0;
  double d2h_gbps = 0;
};

/// Cost of pinning host memory up front.
struct pin_cost_result {
  std::uint64_t bytes = 0;
  double alloc_seconds = 0;
  double free_seconds = 0;
  [[nodiscard]] double seconds_per_gib() const noexcept;
};

/// Everything a probe found.
struct result {
  device_info device;
  memlock_info memlock;
  std::vector<link_result> links;
  duplex_result duplex;
  pin_cost_result pin_cost;
  options used;
  /// The link named `name`, or nullptr.
  [[nodiscard]] const link_result* find(const std::string& name) const noexcept;
};

/// Runs the probe on `dev`. Throws logic_error for a copy size of 0 or iterations < 1, out_of_memory
/// when the buffers cannot be had, and logic_error naming the link when a check finds wrong bytes.
/// `progress` (may be empty) receives one line per step, for stderr.
[[nodiscard]] result run(device& dev, const options& opts, progress_fn progress = {});

/// Measures one link alone (buffers allocated for it, bytes checked): pinned or pageable host memory,
/// host to device or device to host. For benches that need one ceiling without a whole probe.
[[nodiscard]] link_result measure_link(device& dev, copy_direction dir, memory_kind host_memory,
                                       std::size_t bytes, int warmup, int iterations);

/// The pinned bandwidth of `dir` a bench compares its rows with: `given` when positive, else measured now
/// (measure_link with copies of min(bytes, 256 MiB), 2 warm-up and 5 timed, the median). `progress` (may
/// be null) hears when it measures.
[[nodiscard]] double pinned_ceiling(device& dev, copy_direction dir, std::uint64_t bytes, double given,
                                    progress_fn progress = {});

/// The text table `ferry probe` prints.
[[nodiscard]] std::string format_table(const result& r);

/// `r` as JSON, the one shape of a probe result: `ferry probe --json` adds its run stamp (tool, date,
/// command, version) and the C ABI's ferry_probe_run the table. Keys: device (as to_json(device_info)),
/// memlock, options, links, both_directions, pin_cost (null when the pinning cost was not measured).
[[nodiscard]] std::string to_json(const result& r, int indent = 2);

}  // namespace ferry::probe
