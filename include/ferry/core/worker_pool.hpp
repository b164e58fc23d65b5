// A fixed set of worker threads that share one stop signal and report their first failure to the owner.
#pragma once

#include <atomic>
#include <cstddef>
#include <exception>
#include <functional>
#include <mutex>
#include <stop_token>
#include <thread>
#include <vector>

namespace ferry {

/// N std::jthread workers, each running `body(stop_token, worker_index)` once.
///
/// Bodies loop until their stop_token is stopped (or their input is closed) and then return. When a body
/// throws, the pool keeps the first exception, calls `on_error` with it from that worker's thread (so the
/// owner can fail or close its queues and rings, which wakes workers blocked there), and requests stop for
/// every worker. The owner rethrows the failure at its next call with rethrow_if_failed() or at join().
/// A body that throws ferry::stopped_error after stop was requested has merely noticed the shutdown and
/// does not count as a failure. Neither copyable nor movable: workers hold a pointer to the pool. An owner
/// declares the pool after the queues and rings its bodies and on_error use, so the pool is destroyed
/// (and its workers joined) first.
class worker_pool {
 public:
  /// The body each worker runs; the index is 0..workers-1.
  using body_fn = std::function<void(std::stop_token, std::size_t)>;
  /// Called once, from the failing worker's thread, with the first exception a body throws.
  using error_fn = std::function<void(std::exception_ptr)>;

  /// Starts `workers` threads running `body`. Throws logic_error when `workers` is 0 or `body` is empty,
  /// and std::system_error when a thread cannot be started (the ones started are stopped and joined).
  worker_pool(std::size_t workers, body_fn body, error_fn on_error = {});

  worker_pool(const worker_pool&) = delete;
  worker_pool& operator=(const worker_pool&) = delete;
  worker_pool(worker_pool&&) = delete;
  worker_pool& operator=(worker_pool&&) = delete;

  /// Requests stop and joins every worker (blocks until their bodies return). Never throws: a captured
  /// failure the owner never collected is reported on stderr. Must not run on one of the pool's workers.
  ~worker_pool();

  /// Rethrows the first exception a body threw, if any. Does not block. Thread-safe.
  void rethrow_if_failed() const;

  /// Asks every body to return by stopping the token it was given. Does not block.
  void request_stop() noexcept;

  /// Blocks until every worker has returned (it does not request stop itself), then rethrows the first
  /// exception a body threw, if any. Calling it again rethrows again. Throws logic_error when called from
  /// one of the pool's own workers.
  void join();

  /// True once a body has thrown (other than stopped_error after stop).
  [[nodiscard]] bool failed() const noexcept { return failed_.load(std::memory_order_acquire); }

  /// True once stop was requested, by the owner or because a body threw.
  [[nodiscard]] bool stop_requested() const noexcept { return stop_.stop_requested(); }

  /// The number of workers, fixed at construction.
  [[nodiscard]] std::size_t size() const noexcept { return size_; }

 private:
  void run(std::size_t index) noexcept;
  // Keeps the first failure, stops every worker and tells the owner through on_error_.
  void capture(std::exception_ptr error) noexcept;

  body_fn body_;
  error_fn on_error_;
  std::stop_source stop_;
  mutable std::mutex error_mu_;
  std::exception_ptr error_;
  std::atomic<bool> failed_{false};
  mutable bool error_collected_ = false;  // guarded by error_mu_; true once the owner has seen error_
  std::size_t size_;
  std::mutex join_mu_;
  std::vector<std::jthread> threads_;  // last: the threads use every member above
};

}  // namespace ferry
