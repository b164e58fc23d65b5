// A bounded multi-producer/multi-consumer queue: the back-pressure between pipeline stages.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <exception>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ferry/core/clock.hpp"
#include "ferry/core/error.hpp"

namespace ferry {

/// A FIFO of at most `capacity()` items shared by any number of producer and consumer threads.
///
/// Producers block while it is full and consumers while it is empty, so a slow stage slows the stages
/// before it instead of growing memory. Storage for every item is reserved at construction; push and pop
/// move items (T may be move-only) and never allocate.
///
/// Shutdown: `close()` ends the stream gracefully (producers get stopped_error, consumers drain what is
/// left, then get std::nullopt); `fail(e)` ends it with an error (every caller, producer or consumer,
/// rethrows `e`, even when items remain; the items stay in the queue until it is destroyed).
/// All members are thread-safe. The queue is neither copyable nor movable: threads hold references to it.
template <class T>
class bounded_queue {
 public:
  /// Reserves room for `capacity` items. Throws logic_error when `capacity` is 0.
  explicit bounded_queue(std::size_t capacity) : slots_(checked(capacity)) {}

  bounded_queue(const bounded_queue&) = delete;
  bounded_queue& operator=(const bounded_queue&) = delete;
  bounded_queue(bounded_queue&&) = delete;
  bounded_queue& operator=(bounded_queue&&) = delete;
  ~bounded_queue() = default;

  /// Appends `item`, blocking while the queue is full. Throws stopped_error once close() was called and
  /// rethrows the failure once fail() was called, including when either happens while it waits; the item
  /// is then dropped.
  void push(T item) {
    std::unique_lock lock(mu_);
    not_full_.wait(lock, [&] { return count_ < slots_.size() || closed_ || failure_; });
    put(std::move(item), lock);
  }

  /// Appends `item` when there is room now. Returns false, leaving `item` untouched, when the queue is
  /// full. Never blocks (beyond the lock). Throws as push() when closed or failed.
  [[nodiscard]] bool try_push(T&& item) {
    std::unique_lock lock(mu_);
    throw_if_ended();
    if (count_ == slots_.size()) return false;
    put(std::move(item), lock);
    return true;
  }

  /// Appends `item`, waiting at most `timeout` for room. Returns false, leaving `item` untouched, on
  /// timeout. Throws as push() when closed or failed, also while waiting.
  template <class Rep, class Period>
  [[nodiscard]] bool push_for(T&& item, std::chrono::duration<Rep, Period> timeout) {
    std::unique_lock lock(mu_);
    if (!not_full_.wait_for(lock, clamp_timeout(timeout),
                            [&] { return count_ < slots_.size() || closed_ || failure_; })) {
      return false;
    }
    put(std::move(item), lock);
    return true;
  }

  /// Removes and returns the oldest item, blocking while the queue is empty and open. Returns
  /// std::nullopt once the queue is closed and drained. Rethrows the failure once fail() was called,
  /// even when items remain (a failure wins over the data behind it).
  [[nodiscard]] std::optional<T> pop() {
    std::unique_lock lock(mu_);
    not_empty_.wait(lock, [&] { return count_ > 0 || closed_ || failure_; });
    return take(lock);
  }

  /// Removes and returns the oldest item when there is one now; std::nullopt when empty (closed or not:
  /// closed() tells which). Never blocks (beyond the lock). Rethrows the failure after fail().
  [[nodiscard]] std::optional<T> try_pop() {
    std::unique_lock lock(mu_);
    return take(lock);
  }

  /// Like pop(), waiting at most `timeout`. Returns std::nullopt on timeout or when closed and drained;
  /// closed() tells which. Rethrows the failure after fail(), also while waiting.
  template <class Rep, class Period>
  [[nodiscard]] std::optional<T> pop_for(std::chrono::duration<Rep, Period> timeout) {
    std::unique_lock lock(mu_);
    not_empty_.wait_for(lock, clamp_timeout(timeout), [&] { return count_ > 0 || closed_ || failure_; });
    return take(lock);
  }

  /// Ends the stream: wakes every blocked caller; later pushes throw stopped_error, pops drain the items
  /// left and then return std::nullopt. Idempotent; never blocks (beyond the lock); does not throw.
  void close() noexcept {
    {
      const std::lock_guard lock(mu_);
      closed_ = true;
    }
    not_full_.notify_all();
    not_empty_.notify_all();
  }

  /// Ends the stream with `error`: wakes every blocked caller, and every caller of push/pop (blocked now
  /// or calling later) rethrows it. Only the first failure is kept. Throws logic_error when `error` is
  /// null.
  void fail(std::exception_ptr error) {
    FERRY_EXPECTS(error != nullptr, "bounded_queue::fail needs a non-null exception_ptr");
    {
      const std::lock_guard lock(mu_);
      if (!failure_) failure_ = std::move(error);
    }
    not_full_.notify_all();
    not_empty_.notify_all();
  }

  /// Items in the queue now (a snapshot: other threads may change it at once).
  [[nodiscard]] std::size_t size() const {
    const std::lock_guard lock(mu_);
    return count_;
  }

  /// The most items the queue holds; fixed at construction.
  [[nodiscard]] std::size_t capacity() const noexcept { return slots_.size(); }

  /// True once close() was called.
  [[nodiscard]] bool closed() const {
    const std::lock_guard lock(mu_);
    return closed_;
  }

  /// True once fail() was called.
  [[nodiscard]] bool failed() const {
    const std::lock_guard lock(mu_);
    return failure_ != nullptr;
  }

 private:
  static std::size_t checked(std::size_t capacity) {
    FERRY_EXPECTS(capacity > 0, "bounded_queue capacity is 0; it must hold at least one item");
    return capacity;
  }

  void throw_if_ended() const {
    if (failure_) std::rethrow_exception(failure_);
    if (closed_) {
      throw stopped_error("push on a closed bounded_queue (capacity " + std::to_string(slots_.size()) + ")");
    }
  }

  // Called with the lock held and room known to exist unless the queue has ended.
  void put(T&& item, std::unique_lock<std::mutex>& lock) {
    throw_if_ended();
    slots_[(head_ + count_) % slots_.size()].emplace(std::move(item));
    ++count_;
    lock.unlock();
    not_empty_.notify_one();
  }

  // Called with the lock held.
  std::optional<T> take(std::unique_lock<std::mutex>& lock) {
    if (failure_) std::rethrow_exception(failure_);
    if (count_ == 0) return std::nullopt;
    std::optional<T> item(std::move(slots_[head_]));
    slots_[head_].reset();
    head_ = (head_ + 1) % slots_.size();
    --count_;
    lock.unlock();
    not_full_.notify_one();
    return item;
  }

  mutable std::mutex mu_;
  std::condition_variable not_full_;
  std::condition_variable not_empty_;
  std::vector<std::optional<T>> slots_;  // a ring: count_ items from head_
  std::size_t head_ = 0;
  std::size_t count_ = 0;
  bool closed_ = false;
  std::exception_ptr failure_;
};

}  // namespace ferry
