// The host backend's link model: copies sliced and paced to the modelled bandwidth and latency.
#include "link_model.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <string_view>
#include <thread>

#include "ferry/core/error.hpp"
#include "ferry/core/units.hpp"

namespace ferry::host_backend {
namespace {

using steady = std::chrono::steady_clock;

// The link model sleeps after each slice of a copy and re-reads whether the other direction is busy, so
// a duplex slowdown takes effect within this much modelled time.
constexpr double copy_slice_ns = 250e3;
constexpr std::size_t min_copy_slice = 64 * KiB;

void expect_bandwidth(double gbps, std::string_view name) {
  FERRY_EXPECTS(gbps > 0 && std::isfinite(gbps),
                fmt::format("host_device_options::{} = {}: a modelled bandwidth must be a positive number of "
                            "GB/s (set model_link = false to copy at memcpy speed)",
                            name, gbps));
}

}  // namespace

link_model::link_model(const host_device_options& options) : opt_(options) {
  if (!opt_.model_link) return;
  expect_bandwidth(opt_.h2d_gbps, "h2d_gbps");
  expect_bandwidth(opt_.d2h_gbps, "d2h_gbps");
  expect_bandwidth(opt_.pageable_h2d_gbps, "pageable_h2d_gbps");
  expect_bandwidth(opt_.pageable_d2h_gbps, "pageable_d2h_gbps");
  expect_bandwidth(opt_.duplex_gbps, "duplex_gbps");
  expect_bandwidth(opt_.d2d_gbps, "d2d_gbps");
  FERRY_EXPECTS(
      opt_.latency.count() >= 0,
      fmt::format("host_device_options::latency = {} ns: must not be negative", opt_.latency.count()));
}

double link_model::bandwidth(copy_direction dir, bool pageable) const noexcept {
  switch (dir) {
    case copy_direction::host_to_device: return pageable ? opt_.pageable_h2d_gbps : opt_.h2d_gbps;
    case copy_direction::device_to_host: return pageable ? opt_.pageable_d2h_gbps : opt_.d2h_gbps;
    case copy_direction::device_to_device: return opt_.d2d_gbps;
    case copy_direction::host_to_host: return 0;  // unmodelled: a host memcpy
  }
  return 0;
}

// The copy is done in slices; after each, the thread sleeps until the modelled time of the bytes copied
// so far, counted from the copy's modelled start (so oversleeping never accumulates, and a thread that
// started late catches up). A copy therefore never finishes before its modelled end, and takes memcpy's
// time when that is longer; its modelled length is latency + the sum of slice / rate either way.
link_model::time_point link_model::copy(void* dst, const void* src, std::size_t bytes, copy_direction dir,
                                        double gbps, time_point start) {
  auto* out = static_cast<std::byte*>(dst);
  const auto* in = static_cast<const std::byte*>(src);
  if (!opt_.model_link || dir == copy_direction::host_to_host) {
    const auto t0 = steady::now();
    std::memcpy(out, in, bytes);
    return start + (steady::now() - t0);
  }
  copy_engine* own = nullptr;
  copy_engine* other = nullptr;
  if (dir == copy_direction::host_to_device) {
    own = &h2d_engine_;
    other = &d2h_engine_;
  } else if (dir == copy_direction::device_to_host) {
    own = &d2h_engine_;
    other = &h2d_engine_;
  }
  std::unique_lock<std::mutex> engine_lock;
  if (own != nullptr) {
    engine_lock = std::unique_lock(own->mu);
    own->busy.store(true, std::memory_order_relaxed);
    start = std::max(start, own->free_at);
  }
  // GB/s are 1e9 bytes per second: one byte per nanosecond.
  double due_ns = static_cast<double>(opt_.latency.count());
  std::size_t done = 0;
  while (done < bytes) {
    double rate = gbps;
    if (other != nullptr && other->busy.load(std::memory_order_relaxed)) {
      rate = std::min(rate, opt_.duplex_gbps / 2);
    }
    const auto slice_target = static_cast<std::size_t>(rate * copy_slice_ns);
    const std::size_t slice = std::min(bytes - done, std::max(min_copy_slice, slice_target));
    std::memcpy(out + done, in + done, slice);
    done += slice;
    due_ns += static_cast<double>(slice) / rate;
    std::this_thread::sleep_until(start + std::chrono::nanoseconds(std::llround(due_ns)));
  }
  const time_point end = start + std::chrono::nanoseconds(std::llround(due_ns));
  if (own != nullptr) {
    own->free_at = end;
    own->busy.store(false, std::memory_order_relaxed);
  }
  return end;
}

link_model::time_point link_model::device_work_end(std::size_t bytes, time_point start) const noexcept {
  if (!opt_.model_link) return start;
  return start + std::chrono::nanoseconds(std::llround(static_cast<double>(bytes) / opt_.d2d_gbps));
}

}  // namespace ferry::host_backend
