// The host backend's stream thread (private to src/device/host).
//
// A stream is a thread draining a FIFO of operations; streams run concurrently. Every operation counts as
// done once it has returned, which is what synchronize and the blocking pageable copies wait for. Seeded
// random delays before operations (host_device_options::jitter_*) shake out races in tests.
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

 private:
  void run() noexcept;
  void maybe_delay();

  const std::uint64_t number_;
  const double jitter_probability_;
  const std::chrono::nanoseconds jitter_max_;
  const error_sink on_error_;
  std::mt19937_64 rng_;  // used by the stream thread only

  std::mutex mu_;
  std::condition_variable work_cv_;
  std::condition_variable done_cv_;
  std::deque<operation> queue_;  // guarded by mu_
  std::uint64_t enqueued_ = 0;   // guarded by mu_
  std::uint64_t done_ = 0;       // guarded by mu_
  bool stopping_ = false;        // guarded by mu_
  std::thread thread_;           // started in the constructor body, once every member above exists
};

}  // namespace ferry::host_backend
