// A capture window: starts an external profiler's capture after some warm-up steps and stops it after a
// few steady-state steps, so a trace holds what matters and stays small.
#pragma once

#include <cstdint>
#include <functional>

namespace ferry {
class device;
}

namespace ferry::trace {

/// Call step() once at the start of every step. After `warmup` steps the window calls `start` (by
/// default the device's profiler_start, i.e. cudaProfilerStart); after `steps` more it calls `stop`.
/// Destroying an open window calls `stop`. Use with `nsys profile --capture-range=cudaProfilerApi` or
/// `ncu --profile-from-start off`. Not thread-safe: one owner steps it.
class capture_window {
 public:
  /// Throws logic_error when `steps` is 0.
  capture_window(device& dev, std::uint64_t warmup, std::uint64_t steps);
  capture_window(std::function<void()> start, std::function<void()> stop, std::uint64_t warmup,
                 std::uint64_t steps);
  capture_window(const capture_window&) = delete;
  capture_window& operator=(const capture_window&) = delete;
  ~capture_window();

  /// Advances one step, opening or closing the window at its boundaries.
  void step();
  /// True while the capture is running.
  [[nodiscard]] bool capturing() const noexcept { return open_; }
  /// True once the window has opened and closed.
  [[nodiscard]] bool done() const noexcept { return closed_; }
  [[nodiscard]] std::uint64_t steps_seen() const noexcept { return seen_; }

 private:
  std::function<void()> start_;
  std::function<void()> stop_;
  std::uint64_t warmup_;
  std::uint64_t steps_;
  std::uint64_t seen_ = 0;
  bool open_ = false;
  bool closed_ = false;
};

}  // namespace ferry::trace
