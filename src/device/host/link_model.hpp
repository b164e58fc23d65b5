// The host backend's link model (private to src/device/host).
//
// Copies really copy. With host_device_options::model_link, a copy takes at least latency + bytes /
// bandwidth. H2D and D2H each have one copy engine shared by every stream (same-direction copies take
// turns, as on a GPU), and while both engines are busy each runs at min(its bandwidth, duplex_gbps / 2).
// Times are modelled (host_stream::clock): a copy starts at its stream's modelled time or when its engine
// is free, whichever is later, and its modelled length does not depend on how fast memcpy ran.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <mutex>

#include "ferry/device/device.hpp"

namespace ferry::host_backend {

/// The modelled host link: bandwidths per direction and memory kind, latency, one copy engine per
/// direction and the duplex limit.
class link_model {
 public:
  /// Throws logic_error naming the option when model_link is on and a bandwidth is not a positive
  /// finite number or the latency is negative.
  explicit link_model(const host_device_options& options);
  link_model(const link_model&) = delete;
  link_model& operator=(const link_model&) = delete;

  /// The modelled GB/s of a copy in direction `dir`, through a staging buffer when `pageable`; 0 for a
  /// host-to-host copy, which is not modelled.
  [[nodiscard]] double bandwidth(copy_direction dir, bool pageable) const noexcept;

  using time_point = std::chrono::steady_clock::time_point;

  /// Copies `bytes` from `src` to `dst`, the stream being at modelled time `start`, and returns the copy's
  /// modelled end. With the link modelled the copy lasts latency + bytes / gbps of modelled time (less
  /// when the other direction's engine is busy: the duplex limit), starting once the direction's copy
  /// engine is free, and does not return before its modelled end in wall time; unmodelled, it lasts as
  /// long as the memcpy did. Runs on a stream thread.
  time_point copy(void* dst, const void* src, std::size_t bytes, copy_direction dir, double gbps,
                  time_point start);
  /// The modelled end of device work (a kernel, a memset) touching `bytes` bytes that starts at `start`:
  /// bytes at d2d_gbps with the link modelled. Unmodelled it is `start`; the caller adds the wall time
  /// the work took.
  [[nodiscard]] time_point device_work_end(std::size_t bytes, time_point start) const noexcept;
  /// Whether copies and device work are paced to the model (host_device_options::model_link).
  [[nodiscard]] bool modelled() const noexcept { return opt_.model_link; }

 private:
  // A DMA engine of one direction: streams take turns on it, so two copies in the same direction share
  // the link's bandwidth instead of each getting all of it.
  struct copy_engine {
    std::mutex mu;
    std::atomic<bool> busy{false};  // read by the other direction's engine for the duplex limit
    time_point free_at{};           // modelled end of the engine's last copy; guarded by mu
  };

  const host_device_options opt_;
  copy_engine h2d_engine_;
  copy_engine d2h_engine_;
};

}  // namespace ferry::host_backend
