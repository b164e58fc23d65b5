// The host backend's peer link (private to src/device/host): the modelled link between the devices of
// one make_host_devices group, shared by all of them.
//
// Peer copies really copy. With host_device_options::model_link, a copy from device i to device j lasts
// peer.latency + bytes / peer.gbps of modelled time. Every device has a send engine and a receive engine
// (one direction each of its link: full duplex); a copy holds the sender's send engine and the receiver's
// receive engine, so copies out of one device (or into one) take turns, as same-direction copies do on the
// host link (link_model), while copies between disjoint pairs, both directions of one pair and every hop
// of a ring run at once. A copy starts, in modelled time, when its stream reaches it or when both its
// engines are free, whichever is latest: so the modelled time of concurrent copies does not depend on how
// the machine schedules the emulator's threads.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <mutex>

#include "ferry/device/device.hpp"

namespace ferry::host_backend {

/// The link of one group of emulated devices, numbered 0..count-1 within the group.
class peer_link {
 public:
  using time_point = std::chrono::steady_clock::time_point;

  /// Throws logic_error naming the option when `modelled` and options.peer.gbps is not a positive finite
  /// number or options.peer.latency is negative.
  peer_link(const host_device_options& options, std::size_t count);
  peer_link(const peer_link&) = delete;
  peer_link& operator=(const peer_link&) = delete;

  [[nodiscard]] std::size_t size() const noexcept { return count_; }

  /// Copies `bytes` from `src` (memory of member `from`) to `dst` (memory of member `to`, another member),
  /// the stream being at modelled time `start`, and returns the copy's modelled end: with the link modelled,
  /// latency + bytes / gbps after both engines are free and the stream has reached it, and not before then
  /// in wall time; unmodelled, as long as the memcpy took. Runs on a stream thread of device `from`.
  time_point copy(void* dst, const void* src, std::size_t bytes, std::size_t from, std::size_t to,
                  time_point start);

 private:
  // One direction of one device's link: copies that need it take turns.
  struct engine {
    std::mutex mu;
    time_point free_at{};  // modelled end of the engine's last copy; guarded by mu
  };

  const peer_link_profile profile_;
  const bool modelled_;
  const std::size_t count_;
  std::unique_ptr<engine[]> send_;     // per member
  std::unique_ptr<engine[]> receive_;  // per member
};

}  // namespace ferry::host_backend
