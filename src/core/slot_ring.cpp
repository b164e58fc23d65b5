#include "ferry/core/slot_ring.hpp"

#include <fmt/format.h>

#include <limits>

#include "ferry/core/error.hpp"

namespace ferry {

std::string_view to_string(slot_state state) noexcept {
  switch (state) {
    case slot_state::free: return "free";
    case slot_state::in_flight: return "in_flight";
    case slot_state::ready: return "ready";
    case slot_state::in_use: return "in_use";
  }
  return "invalid";
}

std::string_view to_string(delivery order) noexcept {
  switch (order) {
    case delivery::in_order: return "in_order";
    case delivery::as_completed: return "as_completed";
  }
  return "invalid";
}

std::string_view to_string(placement place) noexcept {
  switch (place) {
    case placement::first_freed: return "first_freed";
    case placement::rotating: return "rotating";
  }
  return "invalid";
}

void slot_ring::index_fifo::push_back(std::size_t v) noexcept {
  items_[(head_ + count_) % items_.size()] = v;
  ++count_;
}

std::size_t slot_ring::index_fifo::pop_front() noexcept {
  const std::size_t v = items_[head_];
  head_ = (head_ + 1) % items_.size();
  --count_;
  return v;
}

void slot_ring::index_fifo::erase(std::size_t v) noexcept {
  std::size_t kept = 0;
  for (std::size_t i = 0; i < count_; ++i) {
    const std::size_t item = items_[(head_ + i) % items_.size()];
    if (item != v) items_[(head_ + kept++) % items_.size()] = item;
  }
  count_ = kept;
}

namespace {
constexpr std::uint64_t never = std::numeric_limits<std::uint64_t>::max();  // a slot's sequence before use

std::size_t checked_size(std::size_t slots) {
  FERRY_EXPECTS(slots > 0, "slot_ring of 0 slots; it needs at least one");
  return slots;
}
}  // namespace

slot_ring::slot_ring(std::size_t slots, delivery order, placement place)
    : states_(checked_size(slots), slot_state::free),
      sequence_(slots, never),
      free_(slots),
      pending_(slots),
      free_count_(slots),
      order_(order),
      place_(place) {
  if (place_ == placement::first_freed) {
    for (std::size_t i = 0; i < slots; ++i) free_.push_back(i);
  }
}

std::size_t slot_ring::acquire() {
  std::unique_lock lock(mu_);
  slot_freed_.wait(lock, [&] { return can_acquire(); });
  return acquire_locked();
}

std::optional<std::size_t> slot_ring::try_acquire() {
  std::unique_lock lock(mu_);
  if (!can_acquire()) return std::nullopt;
  return acquire_locked();
}

std::optional<std::size_t> slot_ring::acquire_within(std::chrono::nanoseconds timeout) {
  std::unique_lock lock(mu_);
  if (!slot_freed_.wait_for(lock, timeout, [&] { return can_acquire(); })) return std::nullopt;
  return acquire_locked();
}

std::optional<std::size_t> slot_ring::next_free() const noexcept {
  if (place_ == placement::first_freed) {
    if (free_.empty()) return std::nullopt;
    return free_.front();
  }
  const auto slot = static_cast<std::size_t>(acquired_ % size());
  if (states_[slot] != slot_state::free) return std::nullopt;
  return slot;
}

void slot_ring::claim_locked(std::size_t slot) noexcept {
  if (place_ == placement::first_freed) free_.pop_front();  // `slot` is its front
  states_[slot] = slot_state::in_flight;
  sequence_[slot] = acquired_++;
  --free_count_;
  if (order_ == delivery::in_order) pending_.push_back(slot);
}

void slot_ring::notify_acquired() noexcept {
  // Pass the wake-up on: several slots may have been freed while this waiter was being woken.
  if (next_free()) slot_freed_.notify_one();
  // Each acquire_nth() waiter waits for its own number: wake them all to look.
  if (nth_waiters_ > 0) nth_.notify_all();
}

std::size_t slot_ring::acquire_locked() {
  if (failure_) std::rethrow_exception(failure_);
  if (stopped_) throw stopped_error(fmt::format("slot_ring of {} slots is stopped; cannot acquire", size()));
  const std::size_t slot = *next_free();
  claim_locked(slot);
  notify_acquired();
  return slot;
}

std::size_t slot_ring::acquire_nth(std::uint64_t n) {
  std::unique_lock lock(mu_);
  for (;;) {
    if (const auto slot = advance_to_locked(n)) return *slot;
    ++nth_waiters_;
    nth_.wait(lock);
    --nth_waiters_;
  }
}

std::optional<std::size_t> slot_ring::try_acquire_nth(std::uint64_t n) {
  std::unique_lock lock(mu_);
  return advance_to_locked(n);
}

std::optional<std::size_t> slot_ring::acquire_nth_within(std::uint64_t n, std::chrono::nanoseconds timeout) {
  const auto until = std::chrono::steady_clock::now() + timeout;
  std::unique_lock lock(mu_);
  for (;;) {
    if (const auto slot = advance_to_locked(n)) return slot;
    if (std::chrono::steady_clock::now() >= until) return std::nullopt;
    ++nth_waiters_;
    nth_.wait_until(lock, until);
    --nth_waiters_;
  }
}

std::optional<std::size_t> slot_ring::advance_to_locked(std::uint64_t n) {
  if (failure_) std::rethrow_exception(failure_);
  if (stopped_) {
    throw stopped_error(
        fmt::format("slot_ring of {} slots is stopped; cannot acquire (acquisition {})", size(), n));
  }
  bool made = false;
  while (acquired_ <= n) {
    const auto slot = next_free();
    if (!slot) break;
    claim_locked(*slot);
    made = true;
  }
  if (made) notify_acquired();
  if (acquired_ <= n) return std::nullopt;
  // Made: by this call or an earlier one. Its slot is the one whose last acquisition is n, if any still is.
  for (std::size_t slot = 0; slot < size(); ++slot) {
    if (sequence_[slot] != n) continue;
    FERRY_EXPECTS(
        states_[slot] == slot_state::in_flight,
        fmt::format("slot_ring::acquire_nth({}): acquisition {} holds slot {}, which is {}, expected "
                    "in_flight (a producer joined a slot after it was marked ready)",
                    n, n, slot, to_string(states_[slot])));
    return slot;
  }
  FERRY_EXPECTS(false,
                fmt::format("slot_ring::acquire_nth({}): acquisition {} is over (its slot was taken by "
                            "a later acquisition; {} were made)",
                            n, n, acquired_));
  return std::nullopt;  // not reached
}

void slot_ring::mark_ready(std::size_t slot) {
  bool wake = false;
  {
    const std::lock_guard lock(mu_);
    expect_state("mark_ready", slot, slot_state::in_flight);
    states_[slot] = slot_state::ready;
    if (order_ == delivery::as_completed) pending_.push_back(slot);
    wake = deliverable();
  }
  if (wake) slot_ready_.notify_one();
}

bool slot_ring::deliverable() const noexcept {
  return !pending_.empty() && states_[pending_.front()] == slot_state::ready;
}

std::size_t slot_ring::take_ready() {
  std::unique_lock lock(mu_);
  slot_ready_.wait(lock, [&] { return can_take() || failure_; });
  return take_locked();
}

std::optional<std::size_t> slot_ring::try_take_ready() {
  std::unique_lock lock(mu_);
  if (!can_take() && !failure_) return std::nullopt;
  return take_locked();
}

std::optional<std::size_t> slot_ring::take_ready_within(std::chrono::nanoseconds timeout) {
  std::unique_lock lock(mu_);
  if (!slot_ready_.wait_for(lock, timeout, [&] { return can_take() || failure_; })) return std::nullopt;
  return take_locked();
}

std::size_t slot_ring::take_locked() {
  if (failure_) std::rethrow_exception(failure_);
  if (!deliverable()) {
    throw stopped_error(fmt::format(
        "slot_ring of {} slots is stopped and has no ready slot to deliver ({} in flight, {} ready)", size(),
        count_locked(slot_state::in_flight), count_locked(slot_state::ready)));
  }
  const std::size_t slot = pending_.pop_front();
  states_[slot] = slot_state::in_use;
  // In order, taking the oldest may expose a younger slot that is already ready: wake another consumer.
  if (deliverable()) slot_ready_.notify_one();
  return slot;
}

void slot_ring::release(std::size_t slot) {
  std::unique_lock lock(mu_);
  expect_state("release", slot, slot_state::in_use);
  set_free(slot, lock);
}

void slot_ring::cancel(std::size_t slot) {
  std::unique_lock lock(mu_);
  if (slot < size() && states_[slot] == slot_state::ready) {
    pending_.erase(slot);
  } else {
    expect_state("cancel", slot, slot_state::in_flight);
    if (order_ == delivery::in_order) pending_.erase(slot);
  }
  // In order, the cancelled slot may have been the oldest, holding back younger ready ones.
  const bool wake = deliverable();
  set_free(slot, lock);
  if (wake) slot_ready_.notify_one();
}

void slot_ring::set_free(std::size_t slot, std::unique_lock<std::mutex>& lock) noexcept {
  states_[slot] = slot_state::free;
  if (place_ == placement::first_freed) free_.push_back(slot);
  ++free_count_;
  const bool all_free = free_count_ == size();
  const bool nth_waiting = nth_waiters_ > 0;
  lock.unlock();
  slot_freed_.notify_one();
  if (nth_waiting) nth_.notify_all();
  if (all_free) all_free_.notify_all();
}

void slot_ring::stop() noexcept {
  {
    const std::lock_guard lock(mu_);
    stopped_ = true;
  }
  slot_freed_.notify_all();
  nth_.notify_all();
  slot_ready_.notify_all();
}

void slot_ring::fail(std::exception_ptr error) {
  FERRY_EXPECTS(error != nullptr, "slot_ring::fail needs a non-null exception_ptr");
  {
    const std::lock_guard lock(mu_);
    if (!failure_) failure_ = std::move(error);
    stopped_ = true;
  }
  slot_freed_.notify_all();
  nth_.notify_all();
  slot_ready_.notify_all();
}

slot_state slot_ring::state(std::size_t slot) const {
  const std::lock_guard lock(mu_);
  FERRY_EXPECTS(slot < size(),
                fmt::format("slot_ring::state({}): slot {} is out of range for a ring of {} slots", slot,
                            slot, size()));
  return states_[slot];
}

std::uint64_t slot_ring::sequence(std::size_t slot) const {
  const std::lock_guard lock(mu_);
  FERRY_EXPECTS(slot < size(),
                fmt::format("slot_ring::sequence({}): slot {} is out of range for a ring of {} slots", slot,
                            slot, size()));
  FERRY_EXPECTS(sequence_[slot] != never,
                fmt::format("slot_ring::sequence({}): slot {} was never acquired", slot, slot));
  return sequence_[slot];
}

std::uint64_t slot_ring::acquisitions() const {
  const std::lock_guard lock(mu_);
  return acquired_;
}

std::size_t slot_ring::count(slot_state state) const {
  const std::lock_guard lock(mu_);
  return count_locked(state);
}

std::size_t slot_ring::count_locked(slot_state state) const noexcept {
  if (state == slot_state::free) return free_count_;
  std::size_t n = 0;
  for (const slot_state s : states_) n += s == state ? 1 : 0;
  return n;
}

bool slot_ring::full_free() const {
  const std::lock_guard lock(mu_);
  return free_count_ == size();
}

bool slot_ring::stopped() const {
  const std::lock_guard lock(mu_);
  return stopped_;
}

bool slot_ring::failed() const {
  const std::lock_guard lock(mu_);
  return failure_ != nullptr;
}

void slot_ring::wait_all_free() {
  std::unique_lock lock(mu_);
  all_free_.wait(lock, [&] { return free_count_ == size(); });
}

bool slot_ring::wait_all_free_within(std::chrono::nanoseconds timeout) {
  std::unique_lock lock(mu_);
  return all_free_.wait_for(lock, timeout, [&] { return free_count_ == size(); });
}

void slot_ring::expect_state(std::string_view op, std::size_t slot, slot_state expected) const {
  FERRY_EXPECTS(slot < size(),
                fmt::format("slot_ring::{}({}): slot {} is out of range for a ring of {} slots", op, slot,
                            slot, size()));
  const slot_state actual = states_[slot];
  if (actual == expected) return;
  // cancel() accepts ready too; name both so the message matches what the caller may do.
  const std::string_view wanted = op == "cancel" ? "in_flight or ready" : to_string(expected);
  FERRY_EXPECTS(false, fmt::format("slot_ring::{}({}): slot {} is {}, expected {}", op, slot, slot,
                                   to_string(actual), wanted));
}

}  // namespace ferry
