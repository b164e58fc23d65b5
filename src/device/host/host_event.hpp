// The host backend's event model (private to src/device/host).
//
// An event numbers its records (generations, bumped when record() is called) and keeps the set still
// pending; a stream thread removes a generation when it reaches that record. A stream wait or a host
// synchronize captures the generation current at the time of the call and blocks until that record is
// reached: CUDA's "most recent record at the time of the call", including re-recording an event that is
// still pending, and a record on another stream that completes first does not satisfy it.
//
// A completed record keeps the modelled time its stream reached it at (host_stream::clock), which
// elapsed_ms reports and a stream waiting on it inherits.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

namespace ferry::host_backend {

using steady = std::chrono::steady_clock;

/// One emulated event. Shared (through shared_from_this) by the operations that record or wait on it, so
/// destroying an event whose record or wait is still queued is safe, as it is with cudaEventDestroy.
/// A wait is bound to one record (generation), as in CUDA: when an event is recorded on two streams, a
/// wait on the first record is not satisfied by the second completing first. So the event keeps the set
/// of records still pending rather than a single "completed up to" mark.
class host_event : public std::enable_shared_from_this<host_event> {
 public:
  /// The generation the record being enqueued will complete; called on the recording thread.
  std::uint64_t next_generation();
  /// The generation of the most recent record (0 before the first).
  [[nodiscard]] std::uint64_t recorded() const noexcept { return recorded_.load(std::memory_order_acquire); }

  /// Called by a stream thread when it reaches the record of `generation`, at modelled time `at`.
  void complete(std::uint64_t generation, steady::time_point at);
  /// Blocks until the record of `generation` has been reached; returns the modelled time it was reached.
  steady::time_point wait_for(std::uint64_t generation);
  /// True once the record of `generation` has been reached.
  [[nodiscard]] bool reached(std::uint64_t generation);
  /// The modelled time the most recent record completed at, or nothing while it is pending.
  [[nodiscard]] std::optional<steady::time_point> completion_time();

 private:
  [[nodiscard]] bool done_locked(std::uint64_t generation) const;
  // The modelled time of a completed record: exact for the last few completions, else the time of the
  // latest one (a record so old that a wait still names it is rare; the later time only delays it).
  [[nodiscard]] steady::time_point time_of_locked(std::uint64_t generation) const;

  struct completion {
    std::uint64_t generation = 0;
    steady::time_point at{};
  };
  static constexpr std::size_t kept_completions = 16;

  std::atomic<std::uint64_t> recorded_{0};
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::uint64_t> pending_;  // records queued but not reached; guarded by mu_
  std::uint64_t latest_completed_ = 0;  // guarded by mu_
  steady::time_point completed_at_{};   // modelled time of latest_completed_; guarded by mu_
  std::vector<completion> recent_;      // the last kept_completions completions; guarded by mu_
};

}  // namespace ferry::host_backend
