#include "part_pool.hpp"

#include <fmt/format.h>

#include <utility>

#include "ferry/core/error.hpp"

namespace ferry::image {

part_pool::part_pool(std::size_t threads) : threads_(threads) {
  FERRY_EXPECTS(threads >= 1, "part_pool of 0 threads; it needs at least the caller's");
  if (threads > 1) {
    workers_ = std::make_unique<worker_pool>(
        threads - 1, [this](const std::stop_token& stop, std::size_t worker) { serve(stop, worker); });
  }
}

part_pool::~part_pool() = default;  // workers_ first: stops them (wake_ sees the stop) and joins them

std::vector<std::exception_ptr> part_pool::run(std::size_t parts, const part_fn& fn) {
  FERRY_EXPECTS(parts >= 1 && parts <= threads_,
                fmt::format("part_pool::run: {} parts; this pool runs 1..{}", parts, threads_));
  std::vector<std::exception_ptr> errors(parts);
  if (parts > 1) {
    {
      const std::lock_guard lock(mu_);
      fn_ = &fn;
      parts_ = parts;
      pending_ = parts - 1;
      errors_.assign(parts, nullptr);
      ++generation_;
    }
    wake_.notify_all();
  }
  try {
    fn(0);
  } catch (...) {
    errors[0] = std::current_exception();
  }
  if (parts > 1) {
    std::unique_lock lock(mu_);
    done_.wait(lock, [&] { return pending_ == 0; });
    for (std::size_t k = 1; k < parts; ++k) errors[k] = std::move(errors_[k]);
    fn_ = nullptr;
  }
  return errors;
}

void part_pool::serve(const std::stop_token& stop, std::size_t worker) {
  const std::size_t part = worker + 1;
  std::uint64_t seen = 0;
  for (;;) {
    const part_fn* fn = nullptr;
    {
      std::unique_lock lock(mu_);
      if (!wake_.wait(lock, stop, [&] { return generation_ != seen; })) return;
      seen = generation_;
      // A call of fewer parts than workers leaves this one idle; run() does not wait for it.
      if (part >= parts_) continue;
      fn = fn_;
    }
    std::exception_ptr error;
    try {
      (*fn)(part);
    } catch (...) {
      error = std::current_exception();
    }
    {
      const std::lock_guard lock(mu_);
      errors_[part] = std::move(error);
      --pending_;
    }
    done_.notify_one();
  }
}

}  // namespace ferry::image
