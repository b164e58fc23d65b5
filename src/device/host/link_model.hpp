// The host backend's link model (private to src/device/host).
//
// Copies really copy. With host_device_options::model_link, a copy takes at least latency + bytes /
// bandwidth. H2D and D2H each have one copy engine shared by every stream (same-direction copies take
// turns, as on a GPU), and while both engines are busy each runs at min(its bandwidth, duplex_gbps / 2).
#pragma once

#include <atomic>
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

  /// Copies `bytes` from `src` to `dst` and, with the link modelled, takes at least latency + bytes /
  /// gbps, sharing the direction's copy engine. Runs on a stream thread.
  void copy(void* dst, const void* src, std::size_t bytes, copy_direction dir, double gbps);

 private:
  // A DMA engine of one direction: streams take turns on it, so two copies in the same direction share
  // the link's bandwidth instead of each getting all of it.
  struct copy_engine {
    std::mutex mu;
    std::atomic<bool> busy{false};  // read by the other direction's engine for the duplex limit
  };

  const host_device_options opt_;
  copy_engine h2d_engine_;
  copy_engine d2h_engine_;
};

}  // namespace ferry::host_backend
