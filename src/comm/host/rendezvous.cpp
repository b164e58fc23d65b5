#include "rendezvous.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <span>
#include <thread>
#include <utility>

#include "elementwise.hpp"
#include "ferry/core/units.hpp"

namespace ferry::comm::host {

rendezvous::rendezvous(int size, const comm_options& options) : size_(size), options_(options), slots_(ring) {
  for (std::size_t i = 0; i < ring; ++i) {
    slot& s = slots_[i];
    s.seq = i;
    s.here.assign(static_cast<std::size_t>(size), 0);
    s.sends.assign(static_cast<std::size_t>(size), nullptr);
    s.recvs.assign(static_cast<std::size_t>(size), nullptr);
  }
}

std::string rendezvous::reason() const {
  const std::lock_guard lock(mu_);
  return reason_;
}

void rendezvous::abort(const std::string& why) noexcept {
  try {
    const std::lock_guard lock(mu_);
    abort_locked(why);
  } catch (...) {
    // Copying the reason failed (no memory): abort without it rather than not at all.
    const std::lock_guard lock(mu_);
    abort_locked({});
  }
  cv_.notify_all();
}

void rendezvous::abort_locked(std::string why) noexcept {
  if (aborted_.load(std::memory_order_relaxed)) return;
  reason_ = std::move(why);
  aborted_.store(true, std::memory_order_release);
}

std::string describe(const request& r) {
  switch (r.op) {
    case collective::all_reduce:
      return fmt::format("all_reduce {} of {} {}", to_string(r.reduction), r.count, to_string(r.type));
    case collective::all_gather: return fmt::format("all_gather of {} {}", r.count, to_string(r.type));
    case collective::broadcast:
      return fmt::format("broadcast of {} {} from root {}", r.count, to_string(r.type), r.root);
    case collective::barrier: return "barrier";
  }
  return "unknown collective";
}

std::string rendezvous::missing(const slot& s, int except) const {
  std::string ranks;
  int n = 0;
  for (int r = 0; r < size_; ++r) {
    if (r == except || s.here[static_cast<std::size_t>(r)] != 0) continue;
    ranks += fmt::format("{}{}", n == 0 ? "" : ", ", r);
    ++n;
  }
  if (n == 0) return "no rank";
  return fmt::format("{} {}", n == 1 ? "rank" : "ranks", ranks);
}

void rendezvous::fail_aborted(int rank, std::uint64_t seq, const request& r, const slot& s) const {
  // A slot still serving an earlier collective says nothing about who reached this one.
  const std::string absent = s.seq == seq ? fmt::format("; {} had not arrived", missing(s, rank)) : "";
  throw comm_error(
      fmt::format("{} #{} on rank {} of {} failed: the group was aborted ({}){}", to_string(r.op), seq, rank,
                  size_, reason_.empty() ? "no reason given" : reason_, absent),
      r.op, rank);
}

void rendezvous::run(int rank, std::uint64_t seq, const request& r) {
  const auto deadline = clock::now() + options_.timeout;
  slot& s = slots_[seq % ring];
  const auto me = static_cast<std::size_t>(rank);
  std::unique_lock lock(mu_);

  // 1. Arrive: the slot must serve this collective (a rank far ahead waits for the slowest to leave it).
  if (!cv_.wait_until(lock, deadline, [&] { return aborted() || s.seq == seq; })) {
    const std::string why = fmt::format(
        "{} #{} on rank {} of {} timed out after {} ms: collective #{} (the same slot of {}) had not ended; "
        "{} had not arrived at it",
        to_string(r.op), seq, rank, size_, options_.timeout.count(), s.seq, ring, missing(s, -1));
    abort_locked(why);
    lock.unlock();
    cv_.notify_all();
    throw comm_error(why + "; the group is aborted", r.op, rank);
  }
  if (aborted()) fail_aborted(rank, seq, r, s);
  if (s.first < 0) {
    s.asked = r;
    s.first = rank;
  } else {
    const request& a = s.asked;
    const bool same = a.op == r.op && a.count == r.count && a.type == r.type &&
                      (r.op != collective::all_reduce || a.reduction == r.reduction) &&
                      (r.op != collective::broadcast || a.root == r.root);
    if (!same) {
      const std::string why = fmt::format(
          "collective #{} differs between ranks: rank {} issued {}, rank {} issued {}; every rank must "
          "issue the same collectives in the same order",
          seq, s.first, describe(a), rank, describe(r));
      abort_locked(why);
      lock.unlock();
      cv_.notify_all();
      throw comm_error(fmt::format("{} #{} on rank {} of {} failed: {}; the group is aborted",
                                   to_string(r.op), seq, rank, size_, why),
                       r.op, rank);
    }
  }
  s.here[me] = 1;
  s.sends[me] = r.send;
  s.recvs[me] = r.recv;
  if (++s.arrived == size_) {
    s.all_arrived = clock::now();
    cv_.notify_all();
  } else if (!cv_.wait_until(lock, deadline, [&] { return s.arrived == size_ || aborted(); })) {
    const std::string why =
        fmt::format("{} #{} on rank {} of {} timed out after {} ms waiting for {}", to_string(r.op), seq,
                    rank, size_, options_.timeout.count(), missing(s, rank));
    abort_locked(why);
    lock.unlock();
    cv_.notify_all();
    throw comm_error(why + "; the group is aborted", r.op, rank);
  }
  // Committed once every rank arrived: every rank's buffers are in use until all have left, so no rank may
  // fail out of it early.
  if (s.arrived != size_) fail_aborted(rank, seq, r, s);
  lock.unlock();

  // 2. Work: this rank's share, then wait for the other shares.
  work(rank, s);
  lock.lock();
  if (++s.worked == size_) cv_.notify_all();
  cv_.wait(lock, [&] { return s.worked == size_; });
  const clock::time_point all_arrived = s.all_arrived;
  lock.unlock();

  // 3. The link model: the collective lasts at least its modelled time from the last arrival.
  if (options_.link.model) {
    const std::size_t bytes =
        r.count * size_of(r.type) * (r.op == collective::all_gather ? static_cast<std::size_t>(size_) : 1);
    std::this_thread::sleep_until(all_arrived + options_.link.modelled_time(r.op, bytes, size_));
  }

  // 4. Leave; the last one frees the slot.
  lock.lock();
  if (++s.left == size_) {
    s.seq += ring;
    s.first = -1;
    s.arrived = s.worked = s.left = 0;
    std::fill(s.here.begin(), s.here.end(), std::uint8_t{0});
    lock.unlock();
    cv_.notify_all();
  }
}

void rendezvous::work(int rank, const slot& s) const noexcept {
  const request& a = s.asked;
  const std::span<const void* const> sends(s.sends);
  const std::span<void* const> recvs(s.recvs);
  switch (a.op) {
    case collective::all_reduce: {
      const range mine = share_of(rank, size_, a.count);
      reduce_range(a.type, a.reduction, sends, recvs, mine.begin, mine.end);
      break;
    }
    case collective::all_gather:
      gather_part(rank, s.sends[static_cast<std::size_t>(rank)], recvs, a.count * size_of(a.type));
      break;
    case collective::broadcast: {
      // Each rank copies root's send into its own recv (root's own is in place when send is recv).
      const void* src = s.sends[static_cast<std::size_t>(a.root)];
      void* dst = s.recvs[static_cast<std::size_t>(rank)];
      if (dst != src) std::memcpy(dst, src, a.count * size_of(a.type));
      break;
    }
    case collective::barrier: break;
  }
}

}  // namespace ferry::comm::host
