// A start line for timed runs that must overlap (`ferry bench ingest --both-ways`): each run arrives once
// its set-up is done, and all leave together with one start and one deadline. So their windows share a
// start however long each set-up took on a busy machine, and a set-up that outlasts the others can no
// longer leave a run with an empty window.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>

#include "ferry/core/clock.hpp"

namespace ferry::bench {

class start_line {
 public:
  /// A line for `runners` runs, each timed for `duration` from the common start.
  start_line(int runners, std::chrono::nanoseconds duration) : runners_(runners), duration_(duration) {}
  start_line(const start_line&) = delete;
  start_line& operator=(const start_line&) = delete;

  /// Blocks until every run has arrived (or left); returns the common start: when the last one came.
  steady_clock::time_point arrive() {
    std::unique_lock lock(mu_);
    come_locked();
    cv_.wait(lock, [&] { return came_ >= runners_; });
    return start_;
  }
  /// A run that fails leaves, so the others do not wait for it; harmless after arrive().
  void leave() noexcept {
    {
      const std::lock_guard lock(mu_);
      come_locked();
    }
    cv_.notify_all();
  }
  /// When every run stops: the common start + the duration. Valid once arrive() has returned.
  [[nodiscard]] steady_clock::time_point deadline() const {
    const std::lock_guard lock(mu_);
    return start_ + duration_;
  }

 private:
  void come_locked() {
    if (++came_ == runners_) {
      start_ = steady_clock::now();
      cv_.notify_all();
    }
  }

  const int runners_;
  const std::chrono::nanoseconds duration_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  int came_ = 0;                      // guarded by mu_
  steady_clock::time_point start_{};  // guarded by mu_; set when the last run came
};

}  // namespace ferry::bench
