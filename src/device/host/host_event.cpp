// The host backend's event model: records numbered by generation, waits bound to one record.
#include "host_event.hpp"

#include <algorithm>

namespace ferry::host_backend {

std::uint64_t host_event::next_generation() {
  const std::lock_guard lock(mu_);
  const std::uint64_t generation = recorded_.load(std::memory_order_relaxed) + 1;
  pending_.push_back(generation);
  recorded_.store(generation, std::memory_order_release);
  return generation;
}

void host_event::complete(std::uint64_t generation, steady::time_point at) {
  {
    const std::lock_guard lock(mu_);
    std::erase(pending_, generation);
    if (generation > latest_completed_) {
      latest_completed_ = generation;
      completed_at_ = at;
    }
    if (recent_.size() == kept_completions) recent_.erase(recent_.begin());
    recent_.push_back({generation, at});
  }
  cv_.notify_all();
}

steady::time_point host_event::wait_for(std::uint64_t generation) {
  std::unique_lock lock(mu_);
  cv_.wait(lock, [&] { return done_locked(generation); });
  return time_of_locked(generation);
}

bool host_event::reached(std::uint64_t generation) {
  const std::lock_guard lock(mu_);
  return done_locked(generation);
}

std::optional<steady::time_point> host_event::completion_time() {
  const std::uint64_t target = recorded();
  const std::lock_guard lock(mu_);
  if (!done_locked(target)) return std::nullopt;
  return time_of_locked(target);
}

steady::time_point host_event::time_of_locked(std::uint64_t generation) const {
  for (auto it = recent_.rbegin(); it != recent_.rend(); ++it) {
    if (it->generation == generation) return it->at;
  }
  return completed_at_;
}

bool host_event::done_locked(std::uint64_t generation) const {
  return std::find(pending_.begin(), pending_.end(), generation) == pending_.end();
}

}  // namespace ferry::host_backend
