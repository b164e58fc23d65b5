// The threads that share one decode() call's host work (Note [GPU decode: streams, events and buffers]):
// part 0 runs on the calling thread, parts 1..n-1 on a few persistent workers (a ferry::worker_pool), and
// run() returns once every part has returned.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <stop_token>
#include <vector>

#include "ferry/core/worker_pool.hpp"

namespace ferry::image {

/// Runs the parts of one call concurrently, one call at a time. Each part's exception is caught and
/// handed back by part, so a failing part never leaves run() waiting. Destroying the pool stops and joins
/// its workers (never while a run() is in progress: run() is the owner's).
class part_pool {
 public:
  /// One part of a call; `part` is 0..parts-1.
  using part_fn = std::function<void(std::size_t part)>;

  /// A pool for calls of up to `threads` parts: threads - 1 workers, none for 1. Throws logic_error for 0,
  /// std::system_error when a thread cannot be started.
  explicit part_pool(std::size_t threads);
  ~part_pool();
  part_pool(const part_pool&) = delete;
  part_pool& operator=(const part_pool&) = delete;
  part_pool(part_pool&&) = delete;
  part_pool& operator=(part_pool&&) = delete;

  /// Runs fn(0) on the calling thread and fn(1..parts-1) on the workers; returns once all returned, with
  /// the exception each part threw (null where it returned). logic_error for parts outside 1..threads().
  [[nodiscard]] std::vector<std::exception_ptr> run(std::size_t parts, const part_fn& fn);

  [[nodiscard]] std::size_t threads() const noexcept { return threads_; }

 private:
  void serve(const std::stop_token& stop, std::size_t worker);

  std::size_t threads_;
  std::mutex mu_;
  std::condition_variable_any wake_;  // a new call: generation_ moved
  std::condition_variable done_;      // pending_ reached 0
  const part_fn* fn_ = nullptr;       // guarded by mu_, with parts_, generation_, pending_ and errors_
  std::size_t parts_ = 0;
  std::uint64_t generation_ = 0;
  std::size_t pending_ = 0;
  std::vector<std::exception_ptr> errors_;
  std::unique_ptr<worker_pool> workers_;  // last: the workers use every member above
};

}  // namespace ferry::image
