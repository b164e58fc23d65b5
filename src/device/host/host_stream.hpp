// The host backend's stream thread (private to src/device/host).
//
// A stream is a thread draining a FIFO of operations; streams run concurrently. Every operation counts as
// done once it has returned, which is what synchronize and the blocking pageable copies wait for. Seeded
// random delays before operations (host_device_options::jitter_*) shake out races in tests.
//
// Each stream also keeps the emulated GPU's modelled clock: an operation starts, in modelled time, when
// the one before it on the stream ended or when the host queued it, whichever is later, and lasts what the
// model says (a copy its latency and bytes / bandwidth, a spin its duration). Timing events read this
// clock, so elapsed_ms is the modelled time and does not grow when a busy machine runs the stream's
// thread late. The thread paces each operation so it never ends before its modelled end in wall time.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <random>
#include <thread>

#include "ferry/device/device.hpp"

namespace ferry::host_backend {

/// One emulated stream: a thread that runs queued operations in order.
class host_stream {
 public:
  using operation = std::function<void()>;
  using time_point = std::chrono::steady_clock::time_point;
  using error_sink = std::function<void(std::exception_ptr)>;

  /// Starts the thread. `number` names it and, with options.seed, seeds its jitter; `on_error` receives
  /// what a host callback throws.
  host_stream(std::uint64_t number, const host_device_options& options, error_sink on_error);
  host_stream(const host_stream&) = delete;
  host_stream& operator=(const host_stream&) = delete;
  ~host_stream() { stop(); }

  [[nodiscard]] std::uint64_t number() const noexcept { return number_; }

  /// Queues `op`; returns its ticket, which wait_done takes.
  std::uint64_t enqueue(operation op);
  /// Blocks until the operation with `ticket` (and so every earlier one) has run.
  void wait_done(std::uint64_t ticket);
  /// Blocks until everything queued before the call has run.
  void synchronize();
  /// Lets the thread drain the queue, then joins it. Idempotent.
  void stop() noexcept;

  /// The modelled time the running operation started at (steady_clock's epoch and units): the end of the
  /// operation before it on this stream or the time it was queued, whichever is later. Only operations
  /// running on this stream's thread may call it.
  [[nodiscard]] time_point clock() const noexcept { return clock_; }
  /// Moves the modelled clock to `t` when `t` is later: the running operation ends at `t`. Only
  /// operations running on this stream's thread may call it.
  void advance_to(time_point t) noexcept {
    if (t > clock_) clock_ = t;
  }

 private:
  void run() noexcept;
  void maybe_delay();

  const std::uint64_t number_;
  const double jitter_probability_;
  const std::chrono::nanoseconds jitter_max_;
  const error_sink on_error_;
  std::mt19937_64 rng_;  // used by the stream thread only
  time_point clock_{};   // the modelled clock; used by the stream thread only

  std::mutex mu_;
  std::condition_variable work_cv_;
  std::condition_variable done_cv_;
  // An operation and when the host queued it, the earliest modelled time it can start.
  struct queued {
    operation op;
    time_point submitted;
  };
  std::deque<queued> queue_;    // guarded by mu_
  std::uint64_t enqueued_ = 0;  // guarded by mu_
  std::uint64_t done_ = 0;      // guarded by mu_
  bool stopping_ = false;       // guarded by mu_
  std::thread thread_;          // started in the constructor body, once every member above exists
};

}  // namespace ferry::host_backend
