// The accounting of a fixed set of buffer slots and the waits on it: back-pressure for producers, delivery
// in order or as completed for consumers, shutdown that wakes both. Every fixed slot pool of ferry's
// pipelines is one: egress's slots, the ingest loader's pinned batch slots (so the feeds' too) and the
// prefetcher's device slots. A queue that is not a fixed set of slots is not (ingest::feed's pushed
// batches: src/ingest/feed.cpp says why).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <mutex>
#include <optional>
#include <string_view>
#include <vector>

#include "ferry/core/clock.hpp"

namespace ferry {

/// Where a slot is in its cycle free -> in_flight -> ready -> in_use -> free.
enum class slot_state {
  free,       ///< Available to acquire().
  in_flight,  ///< Acquired by a producer; its data is being produced (e.g. a copy is queued).
  ready,      ///< Its data is complete; waiting to be delivered by take_ready().
  in_use,     ///< Delivered to a consumer, which will release() it.
};

/// The order in which take_ready() hands out ready slots.
enum class delivery {
  in_order,      ///< In the order the slots were acquired (submission order).
  as_completed,  ///< In the order they were marked ready.
};

/// Which free slot an acquisition takes.
enum class placement {
  first_freed,  ///< The slot that became free first (0, 1, ..., N-1 at first).
  rotating,     ///< Acquisition n takes slot n % N and waits for that one even when others are free, so the
                ///< slot of item n follows from n alone (as when a writer elsewhere computes where n goes).
};

/// "free", "in_flight", "ready" or "in_use".
[[nodiscard]] std::string_view to_string(slot_state state) noexcept;

/// "in_order" or "as_completed".
[[nodiscard]] std::string_view to_string(delivery order) noexcept;

/// "first_freed" or "rotating".
[[nodiscard]] std::string_view to_string(placement place) noexcept;

/// N slots (indices 0..N-1) and their states; it owns no buffers, only their bookkeeping.
///
/// A producer `acquire()`s a free slot (blocking while none is free: back-pressure), fills the buffer it
/// stands for and calls `mark_ready()`; a consumer `take_ready()`s it, uses it and `release()`s it. A
/// producer that gives up before its data was queued returns its slot with `cancel()`. Free slots are
/// handed out as `placement` says: in the order they became free (0, 1, ..., N-1 at first), or in
/// rotation. Every wrong transition throws logic_error naming the slot, its state and the state expected.
///
/// Numbered acquisitions. Acquisitions are numbered 0, 1, 2, ... in the order they are made, and
/// `sequence(slot)` tells the number of a slot's acquisition, so a consumer learns which item it took.
/// Where several producers share one slot (each writes its part of the buffer, the last one to finish
/// marks it ready) and each knows only the number of its item, `acquire_nth(n)` is their one call: the
/// first makes acquisition n (and any before it that nobody made yet, in order, as slots come free), the
/// later ones find it made and get the same slot. With placement::rotating the slot is n % N. Mixing
/// acquire() with acquire_nth() on one ring is allowed but rarely meaningful: an acquire() takes the
/// next number, which an acquire_nth() caller may have meant for itself.
///
/// Shutdown: after `stop()`, acquire throws stopped_error and take_ready keeps delivering the slots that
/// are deliverable now, then throws stopped_error instead of waiting for more; it never waits for an
/// in-flight slot to become ready, so shutdown cannot hang on a producer that will not finish. To drain
/// everything, wait until count(slot_state::in_flight) == 0 (or for the producer's completions) before
/// stop(). After `fail(e)` (which also stops), acquire and take_ready rethrow `e` even when slots are
/// ready. In both cases mark_ready, release and cancel keep working, so an owner can return every slot
/// to free and wait_all_free() for it.
///
/// All members are thread-safe; none allocates after construction. Neither copyable nor movable.
class slot_ring {
 public:
  /// A ring of `slots` free slots delivered in `order` and acquired as `place` says. Throws logic_error
  /// when `slots` is 0.
  explicit slot_ring(std::size_t slots, delivery order = delivery::in_order,
                     placement place = placement::first_freed);

  slot_ring(const slot_ring&) = delete;
  slot_ring& operator=(const slot_ring&) = delete;
  slot_ring(slot_ring&&) = delete;
  slot_ring& operator=(slot_ring&&) = delete;
  ~slot_ring() = default;

  /// Takes a free slot, blocking while none is free, moves it to in_flight and returns its index.
  /// Throws stopped_error after stop() and rethrows the failure after fail(), also while blocked.
  [[nodiscard]] std::size_t acquire();

  /// acquire() when a slot is free now; std::nullopt otherwise. Never blocks (beyond the lock).
  /// Throws as acquire().
  [[nodiscard]] std::optional<std::size_t> try_acquire();

  /// acquire(), waiting at most `timeout`; std::nullopt on timeout. Throws as acquire().
  template <class Rep, class Period>
  [[nodiscard]] std::optional<std::size_t> acquire_for(std::chrono::duration<Rep, Period> timeout) {
    return acquire_within(clamp_timeout(timeout));
  }

  /// Takes part in acquisition `n`: returns its slot at once when acquisition n was made and its slot is
  /// still in_flight (another producer of the same slot made it); otherwise makes the acquisitions up to
  /// n in order, each once its slot is free, blocking while one is not, and returns acquisition n's slot.
  /// Throws as acquire(), also when acquisition n was made already; logic_error when acquisition n was
  /// made and its slot is no longer in_flight (marked ready, cancelled, or taken since by a later one).
  [[nodiscard]] std::size_t acquire_nth(std::uint64_t n);

  /// acquire_nth() without blocking: std::nullopt when acquisition n cannot be made now (the
  /// acquisitions before it that could be made now were). Throws as acquire_nth().
  [[nodiscard]] std::optional<std::size_t> try_acquire_nth(std::uint64_t n);

  /// acquire_nth(), waiting at most `timeout`; std::nullopt on timeout (the acquisitions before n made
  /// meanwhile stay made). Throws as acquire_nth().
  template <class Rep, class Period>
  [[nodiscard]] std::optional<std::size_t> acquire_nth_for(std::uint64_t n,
                                                           std::chrono::duration<Rep, Period> timeout) {
    return acquire_nth_within(n, clamp_timeout(timeout));
  }

  /// Moves `slot` from in_flight to ready (its data is complete), waking a consumer that can now take
  /// it. Works after stop()/fail(). Throws logic_error when `slot` is out of range or not in_flight.
  void mark_ready(std::size_t slot);

  /// Delivers the next slot, blocking until it is ready, moves it to in_use and returns its index. With
  /// delivery::in_order the next slot is the oldest acquired slot not yet delivered or cancelled, so it
  /// waits for that one even when younger slots are ready; with delivery::as_completed it is the slot
  /// marked ready first. After stop() it returns the next slot if that is ready now and throws
  /// stopped_error otherwise (no more waiting); after fail() it rethrows the failure.
  [[nodiscard]] std::size_t take_ready();

  /// take_ready() when the next slot is ready now; std::nullopt when it is not and the ring runs.
  /// Never blocks (beyond the lock). Throws as take_ready().
  [[nodiscard]] std::optional<std::size_t> try_take_ready();

  /// take_ready(), waiting at most `timeout`; std::nullopt on timeout. Throws as take_ready().
  template <class Rep, class Period>
  [[nodiscard]] std::optional<std::size_t> take_ready_for(std::chrono::duration<Rep, Period> timeout) {
    return take_ready_within(clamp_timeout(timeout));
  }

  /// Moves `slot` from in_use back to free, waking a blocked acquire(). Works after stop()/fail().
  /// Throws logic_error when `slot` is out of range or not in_use.
  void release(std::size_t slot);

  /// Returns a slot that will never be delivered to free: in_flight (its submit failed before any work
  /// that writes the buffer was queued, or that work has completed) or ready (shutdown discards it).
  /// The caller must know nothing still writes the slot's buffer. Works after stop()/fail().
  /// Throws logic_error when `slot` is out of range or neither in_flight nor ready.
  void cancel(std::size_t slot);

  /// Stops the ring: wakes every blocked acquire() and take_ready() (see the class comment for what each
  /// does then). Idempotent; does not throw.
  void stop() noexcept;

  /// Stops the ring with `error`: every blocked and later acquire() and take_ready() rethrows it. Only
  /// the first failure is kept. Throws logic_error when `error` is null.
  void fail(std::exception_ptr error);

  /// The state of `slot` now. Throws logic_error when `slot` is out of range.
  [[nodiscard]] slot_state state(std::size_t slot) const;

  /// The number of the acquisition that took `slot` last (it holds the slot unless the slot is free).
  /// Throws logic_error when `slot` is out of range or was never acquired.
  [[nodiscard]] std::uint64_t sequence(std::size_t slot) const;

  /// The number of acquisitions made so far: the number the next one will get.
  [[nodiscard]] std::uint64_t acquisitions() const;

  /// How many slots are in `state` now.
  [[nodiscard]] std::size_t count(slot_state state) const;

  /// The number of slots, fixed at construction.
  [[nodiscard]] std::size_t size() const noexcept { return states_.size(); }

  /// The delivery order, fixed at construction.
  [[nodiscard]] delivery order() const noexcept { return order_; }

  /// The placement, fixed at construction.
  [[nodiscard]] placement slot_placement() const noexcept { return place_; }

  /// True when every slot is free: the pool has returned to full.
  [[nodiscard]] bool full_free() const;

  /// True once stop() or fail() was called.
  [[nodiscard]] bool stopped() const;

  /// True once fail() was called.
  [[nodiscard]] bool failed() const;

  /// Blocks until every slot is free; returns at once if they are. It keeps waiting after stop() and
  /// fail(), because flush and close must account for every slot: the owner must release or cancel
  /// every slot that is out. Does not throw.
  void wait_all_free();

  /// wait_all_free(), waiting at most `timeout`; returns whether every slot is free.
  template <class Rep, class Period>
  [[nodiscard]] bool wait_all_free_for(std::chrono::duration<Rep, Period> timeout) {
    return wait_all_free_within(clamp_timeout(timeout));
  }

 private:
  // A fixed-capacity FIFO of slot indices; it never allocates after construction.
  class index_fifo {
   public:
    explicit index_fifo(std::size_t capacity) : items_(capacity) {}
    [[nodiscard]] bool empty() const noexcept { return count_ == 0; }
    [[nodiscard]] std::size_t front() const noexcept { return items_[head_]; }
    void push_back(std::size_t v) noexcept;
    std::size_t pop_front() noexcept;
    void erase(std::size_t v) noexcept;  // removes `v` wherever it is, keeping the others' order

   private:
    std::vector<std::size_t> items_;
    std::size_t head_ = 0;
    std::size_t count_ = 0;
  };

  std::optional<std::size_t> acquire_within(std::chrono::nanoseconds timeout);
  std::optional<std::size_t> acquire_nth_within(std::uint64_t n, std::chrono::nanoseconds timeout);
  std::optional<std::size_t> take_ready_within(std::chrono::nanoseconds timeout);
  bool wait_all_free_within(std::chrono::nanoseconds timeout);

  // These run with mu_ held.
  // The slot the next acquisition would take now, if it is free.
  [[nodiscard]] std::optional<std::size_t> next_free() const noexcept;
  [[nodiscard]] bool can_acquire() const noexcept { return next_free().has_value() || stopped_; }
  [[nodiscard]] bool deliverable() const noexcept;
  [[nodiscard]] bool can_take() const noexcept { return deliverable() || stopped_; }
  std::size_t acquire_locked();
  // Makes the acquisitions up to `n` that can be made now; acquisition n's slot once it is made.
  std::optional<std::size_t> advance_to_locked(std::uint64_t n);
  // Moves the free `slot` to in_flight as the next acquisition.
  void claim_locked(std::size_t slot) noexcept;
  // Wakes the waiters that an acquisition made (a later number may be due, or made).
  void notify_acquired() noexcept;
  std::size_t take_locked();
  void expect_state(std::string_view op, std::size_t slot, slot_state expected) const;
  std::size_t count_locked(slot_state state) const noexcept;
  // Frees `slot`, then unlocks `lock` to wake the waiters without holding the mutex.
  void set_free(std::size_t slot, std::unique_lock<std::mutex>& lock) noexcept;

  mutable std::mutex mu_;
  std::condition_variable slot_freed_;  // acquire() waits on it
  std::condition_variable nth_;         // acquire_nth() waits on it (woken on a free or an acquisition)
  std::condition_variable slot_ready_;  // take_ready() waits on it
  std::condition_variable all_free_;    // wait_all_free() waits on it
  std::vector<slot_state> states_;
  std::vector<std::uint64_t> sequence_;  // per slot: the number of its last acquisition
  index_fifo free_;  // placement::first_freed: free slots, in the order they became free (unused otherwise)
  index_fifo pending_;  // in_order: acquired, undelivered slots by age; as_completed: ready slots
  std::size_t free_count_;
  std::uint64_t acquired_ = 0;   // acquisitions made
  std::size_t nth_waiters_ = 0;  // threads blocked in acquire_nth()
  delivery order_;
  placement place_;
  bool stopped_ = false;
  std::exception_ptr failure_;
};

}  // namespace ferry
