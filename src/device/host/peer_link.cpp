// The host backend's peer link: peer copies paced to the group's profile, one send and one receive engine
// per device.
#include "peer_link.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <thread>

#include "ferry/core/error.hpp"
#include "ferry/core/units.hpp"

namespace ferry::host_backend {
namespace {

using steady = std::chrono::steady_clock;

// Copies are done in slices, each followed by a sleep until the modelled time of the bytes so far, so a
// copy's wall time follows its modelled time and memcpy's own time overlaps with it.
constexpr double copy_slice_ns = 250e3;
constexpr std::size_t min_copy_slice = 64 * KiB;

}  // namespace

peer_link::peer_link(const host_device_options& options, std::size_t count)
    : profile_(options.peer),
      modelled_(options.model_link),
      count_(count),
      send_(std::make_unique<engine[]>(count)),
      receive_(std::make_unique<engine[]>(count)) {
  if (!modelled_) return;
  FERRY_EXPECTS(profile_.gbps > 0 && std::isfinite(profile_.gbps),
                fmt::format("host_device_options::peer.gbps = {}: a modelled bandwidth must be a positive "
                            "number of GB/s (set model_link = false to copy at memcpy speed)",
                            profile_.gbps));
  FERRY_EXPECTS(profile_.latency.count() >= 0,
                fmt::format("host_device_options::peer.latency = {} ns: must not be negative",
                            profile_.latency.count()));
}

peer_link::time_point peer_link::copy(void* dst, const void* src, std::size_t bytes, std::size_t from,
                                      std::size_t to, time_point start) {
  auto* out = static_cast<std::byte*>(dst);
  const auto* in = static_cast<const std::byte*>(src);
  if (!modelled_) {
    const auto t0 = steady::now();
    std::memcpy(out, in, bytes);
    return start + (steady::now() - t0);
  }
  // A copy holds both of its engines for its whole length; scoped_lock takes the two without deadlock.
  engine& sender = send_[from];
  engine& receiver = receive_[to];
  const std::scoped_lock engines_lock(sender.mu, receiver.mu);
  start = std::max({start, sender.free_at, receiver.free_at});
  const time_point began = std::max(start, steady::now());
  // GB/s are 1e9 bytes per second: one byte per nanosecond.
  double due_ns = static_cast<double>(profile_.latency.count());
  const std::size_t slice = std::max(min_copy_slice, static_cast<std::size_t>(profile_.gbps * copy_slice_ns));
  for (std::size_t done = 0; done < bytes;) {
    const std::size_t n = std::min(bytes - done, slice);
    std::memcpy(out + done, in + done, n);
    done += n;
    due_ns += static_cast<double>(n) / profile_.gbps;
    std::this_thread::sleep_until(began + std::chrono::nanoseconds(std::llround(due_ns)));
  }
  const time_point end = start + std::chrono::nanoseconds(std::llround(due_ns));
  sender.free_at = end;
  receiver.free_at = end;
  return end;
}

}  // namespace ferry::host_backend
