// The NCCL communicators of one group in this process, and the watchdog that keeps them from hanging (private
// to src/comm/nccl).
//
// The communicators are made nonblocking (ncclConfig_t::blocking = 0): no NCCL call of the making waits for
// another rank, so a rank that never arrives cannot trap a thread inside NCCL. A call that answers
// ncclInProgress is polled with ncclCommGetAsyncError until it is done, at most comm_options::timeout. NCCL
// calls on one communicator are serialized by that rank's mutex (NCCL is not thread-safe per communicator),
// which is also what lets abort() free the communicators safely from any thread.
//
// Collectives, though, go through blocking communicators: on a nonblocking one NCCL starts a thread for
// every collective to enqueue it (ncclGroupEnd's nonblocking path), about 100 us a call where a blocking
// one enqueues on the calling thread in 10-20 us. So once the nonblocking communicators exist, each is split
// (ncclCommSplit, every rank in one color; nonblocking too, polled the same way) into a blocking one that
// replaces it, and every connection the collectives use (ring and tree, small and large) is made at once by
// warm-up collectives (all-reduces of 4 B to 32 MiB, an all-gather, a broadcast), while every rank is known
// to be there. A blocking enqueue waits for another rank only when it makes a connection; after the warm-up
// the collectives' usual algorithms have theirs, so a rank that never calls leaves the others' threads
// free, and the watchdog below aborts them at the timeout. What the timeout does not cover: a blocking
// enqueue that still has a connection to make (an algorithm or size the warm-up did not take) while a rank
// is gone waits inside NCCL, holding its rank's call mutex, and the watchdog's abort then waits for it too;
// so does the warm-up itself when a rank dies between the split and its end.
// FERRY_NCCL_NONBLOCKING=1 (or an NCCL without ncclCommSplit) keeps the nonblocking communicators.
//
// Every collective is followed on the GPU by two events of the rank's device, recorded before and after it.
// One watchdog thread per group polls them (every poll_interval while a collective is in flight, and sleeps
// on a condition variable while none is) together with ncclCommGetAsyncError; a collective still running
// comm_options::timeout after it started, or an asynchronous NCCL error, aborts the group: ncclCommAbort on
// every communicator, which ends the collectives stuck on the GPUs, and every later call throws comm_error.
// A rank keeps records_per_rank such records; when the host runs that far ahead of its GPU, the issuing
// thread retires the finished ones itself (so the GPU never waits for a watchdog poll to be fed).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "ferry/comm/communicator.hpp"
#include "ferry/device/device.hpp"
#include "ferry/shim/nccl.hpp"

namespace ferry::comm::nccl_backend {

/// One collective as a rank issues it.
struct call {
  collective op = collective::barrier;
  const void* send = nullptr;
  void* recv = nullptr;
  std::size_t count = 0;
  dtype type = dtype::f32;
  reduce_op reduction = reduce_op::sum;
  int root = 0;
};

class nccl_group {
 public:
  /// Collectives a rank may have in flight on its GPU before the next one waits for one to finish.
  static constexpr std::size_t records_per_rank = 64;
  static constexpr std::chrono::milliseconds poll_interval{1};

  /// Creates one nonblocking communicator per device (ordinals[i] is devices[i]'s GPU) from this thread:
  /// ranks first_rank .. first_rank + devices.size() - 1 of a group of `world` ranks named by `id`, whose
  /// other ranks belong to other processes (every process passes the same id and world). Throws comm_error
  /// naming the NCCL error, or the timeout, when NCCL cannot create them.
  nccl_group(const shim::nccl_api& api, const std::vector<device*>& devices, const std::vector<int>& ordinals,
             const comm_options& options, const shim::nccl_unique_id& id, int first_rank, int world);
  nccl_group(const nccl_group&) = delete;
  nccl_group& operator=(const nccl_group&) = delete;
  /// Stops the watchdog, then finalizes and destroys the communicators (aborts them when the group was
  /// aborted or a collective is still in flight, so this never waits on another rank).
  ~nccl_group();

  /// The group's ranks, over every process.
  [[nodiscard]] int size() const noexcept { return world_; }
  /// The ranks of this process: first_rank() .. first_rank() + size_here() - 1.
  [[nodiscard]] int size_here() const noexcept { return static_cast<int>(ranks_.size()); }
  [[nodiscard]] int first_rank() const noexcept { return first_rank_; }

  // Below, `rank` is the index of one of this process's ranks (0 .. size_here() - 1); messages and
  // comm_error name its rank in the group, first_rank() + rank.

  /// Issues rank `rank`'s collective on `s` (its native handle is the cudaStream_t). Throws comm_error when
  /// the group is or gets aborted, NCCL refuses the call, or enqueueing it outlasts the timeout.
  void run(int rank, const call& c, stream_view s);

  /// Aborts the group from any thread: ncclCommAbort on every communicator; the first cause is kept.
  void abort(const std::string& why) noexcept;
  [[nodiscard]] bool aborted() const noexcept { return aborted_.load(std::memory_order_acquire); }
  [[nodiscard]] std::string reason() const;

  /// Rank `rank`'s communicator object is being destroyed: the group refuses later collectives, and when
  /// a collective is still in flight anywhere it is aborted now, so no rank waits for this one.
  void close(int rank) noexcept;

 private:
  using clock = std::chrono::steady_clock;

  // A collective in flight on a rank's GPU, as the watchdog follows it.
  struct record {
    event start;
    event end;
    bool busy = false;
    bool started = false;
    clock::time_point started_at{};
    collective op = collective::barrier;
    std::uint64_t seq = 0;
  };

  struct rank_state {
    device* dev = nullptr;
    int ordinal = 0;
    std::mutex call_mu;              // serializes NCCL calls on comm
    shim::nccl_comm comm = nullptr;  // guarded by call_mu; null once aborted or destroyed
    std::vector<record> records;     // guarded by mu_
    std::uint64_t issued = 0;        // collectives issued so far; guarded by mu_
    buffer scratch;                  // one float: a barrier is an all-reduce of it
  };

  // The comm_error of rank `rank`'s collective `seq` in an aborted group.
  [[noreturn]] void fail_aborted(int rank, collective op, std::uint64_t seq) const;
  // Aborts the group with `why` and throws it as rank `rank`'s comm_error.
  [[noreturn]] void fail(int rank, collective op, const std::string& why);
  shim::nccl_result issue(rank_state& rs, const call& c, void* stream) const;
  // True while a CUDA graph captures `s` (Note [Collectives in a CUDA graph] in nccl_group.cpp).
  static bool capturing(stream_view s);
  // Issues a collective into the capture of `s`: no completion record, nothing for the watchdog.
  void run_captured(int rank, rank_state& rs, const call& c, stream_view s, std::uint64_t seq);
  // Polls ncclCommGetAsyncError of every rank's communicator that is not null until none answers
  // ncclInProgress, at most until `deadline`; the first error (or "") as text.
  std::string settle_all(const char* what, clock::time_point deadline) noexcept;
  std::string check_async_errors() noexcept;
  // Replaces every rank's nonblocking communicator by a blocking one split from it, and warms the new ones
  // up (see the header's comment); the failure as text, or "".
  std::string make_blocking(clock::time_point deadline);
  std::string warm_up(clock::time_point deadline);
  // Polls ncclCommGetAsyncError of `comms` (null ones skipped) until none answers ncclInProgress.
  std::string settle_comms(const char* what, const std::vector<shim::nccl_comm>& comms,
                           clock::time_point deadline) noexcept;
  // Under mu_: the ranks that have not issued collective `seq` ("rank 1", "ranks 0, 2" or "none").
  [[nodiscard]] std::string not_issued(std::uint64_t seq) const;
  // Under mu_: a free record of `rank`, waiting (bounded by the timeout) for the watchdog to retire one.
  record& acquire(int rank, collective op, std::uint64_t seq, std::unique_lock<std::mutex>& lock);
  // Under mu_: marks `rank`'s busy records whose collective completed free, oldest first, stopping at the
  // first still running; true when it freed one. A failed query leaves its words in `problem`.
  bool retire_finished(int rank, std::string& problem);
  // Polls ncclCommGetAsyncError on `rank`'s communicator until it leaves ncclInProgress; returns the
  // final state, or throws comm_error on timeout or abort.
  shim::nccl_result settle(int rank, collective op, std::uint64_t seq, clock::time_point deadline);
  void abort_communicators() noexcept;
  void watch() noexcept;
  // Under mu_: retires the completed records; returns a problem that aborts the group, or "".
  std::string check_records(clock::time_point now);

  [[nodiscard]] int global(int rank) const noexcept { return first_rank_ + rank; }

  const shim::nccl_api& api_;
  const comm_options options_;
  const int first_rank_;
  const int world_;
  std::vector<std::unique_ptr<rank_state>> ranks_;

  mutable std::mutex mu_;
  std::condition_variable cv_;        // the watchdog's wake-up
  std::size_t in_flight_ = 0;         // busy records; guarded by mu_
  std::atomic<bool> aborted_{false};  // set under mu_
  std::string reason_;                // guarded by mu_
  bool stop_ = false;                 // guarded by mu_
  std::thread watchdog_;
};

}  // namespace ferry::comm::nccl_backend
