// The meeting point of a host group's ranks (private to src/comm/host).
//
// Each collective of a rank runs as a host function on the rank's stream and calls rendezvous::run with the
// collective's sequence number (the rank's count of collectives issued before it). The ranks' calls with the
// same number meet in one slot of a fixed ring, so no collective allocates:
//   1. arrive: wait (at most comm_options::timeout) until every rank has arrived; the collective is then
//      committed and completes whatever happens to the group afterwards;
//   2. work: each rank does its share of the bytes (elementwise.hpp) on its own stream thread, then waits
//      for the others' shares (bounded: they are memory work on threads that have all arrived);
//   3. wait out the link model: the collective ends no earlier than the last arrival plus the modelled
//      time of comm_link;
//   4. leave: the last rank to leave frees the slot for the collective `ring` numbers later.
// A timeout, ranks that disagree on what the collective is, or abort() abort the group: every rank waiting to
// arrive and every later collective throws comm_error, which the device rethrows at its next synchronize().
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "ferry/comm/communicator.hpp"

namespace ferry::comm::host {

/// What one rank asks of a collective. Every rank of a match asks the same op, count, type, reduction
/// (all-reduce) and root (broadcast); send and recv are the rank's own.
struct request {
  collective op = collective::barrier;
  std::size_t count = 0;
  dtype type = dtype::f32;
  reduce_op reduction = reduce_op::sum;
  int root = 0;
  const void* send = nullptr;
  void* recv = nullptr;
};

/// "all_reduce sum of 4 f32", "broadcast of 2 u64 from root 1": a collective, for messages.
[[nodiscard]] std::string describe(const request& r);

class rendezvous {
 public:
  /// Collectives a rank may run ahead of the slowest rank before it waits for a slot (in its timeout).
  static constexpr std::size_t ring = 64;

  rendezvous(int size, const comm_options& options);
  rendezvous(const rendezvous&) = delete;
  rendezvous& operator=(const rendezvous&) = delete;

  /// Rank `rank`'s collective number `seq`, on the rank's stream thread. Returns once the collective is
  /// done on every rank (its recv holds the result). Throws comm_error naming the collective, the rank, the
  /// sequence number and the ranks that had not arrived when the group is or gets aborted before every rank
  /// arrived, or when this rank's wait times out (which aborts the group).
  void run(int rank, std::uint64_t seq, const request& r);

  /// Aborts the group: every waiting and later collective fails. The first cause is kept. Never throws.
  void abort(const std::string& why) noexcept;
  [[nodiscard]] bool aborted() const noexcept { return aborted_.load(std::memory_order_acquire); }
  /// The first cause of the abort; empty while not aborted.
  [[nodiscard]] std::string reason() const;

 private:
  using clock = std::chrono::steady_clock;

  struct slot {
    std::uint64_t seq = 0;  // the collective this slot serves now
    request asked;          // what the first rank to arrive asked
    int first = -1;         // that rank
    int arrived = 0;
    int worked = 0;
    int left = 0;
    std::vector<std::uint8_t> here;  // per rank: arrived
    std::vector<const void*> sends;  // per rank
    std::vector<void*> recvs;        // per rank
    clock::time_point all_arrived{};
  };

  // Under mu_: records the abort and wakes every waiter.
  void abort_locked(std::string why) noexcept;
  // The comm_error of rank `rank` whose collective `seq` fails because the group is aborted.
  [[noreturn]] void fail_aborted(int rank, std::uint64_t seq, const request& r, const slot& s) const;
  // Rank `rank`'s share of the bytes of the committed collective in `s`.
  void work(int rank, const slot& s) const noexcept;
  // "rank 2" or "ranks 1, 3": the ranks of `s` that have not arrived (other than `except`).
  [[nodiscard]] std::string missing(const slot& s, int except) const;

  const int size_;
  const comm_options options_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<slot> slots_;  // ring of them; fixed at construction
  std::string reason_;       // guarded by mu_
  std::atomic<bool> aborted_{false};
};

}  // namespace ferry::comm::host
