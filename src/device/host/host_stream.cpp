// The host backend's stream thread: a FIFO of operations run in order, with seeded jitter.
#include "host_stream.hpp"

#include <fmt/format.h>
#include <pthread.h>

#include <string>
#include <utility>

namespace ferry::host_backend {

host_stream::host_stream(std::uint64_t number, const host_device_options& options, error_sink on_error)
    : number_(number),
      jitter_probability_(options.jitter_probability),
      jitter_max_(options.jitter_max),
      on_error_(std::move(on_error)) {
  // Seeded from the device's seed and the stream's number, so a run that fails under jitter replays the
  // same delays when the streams are made in the same order.
  std::seed_seq seq{static_cast<std::uint32_t>(options.seed), static_cast<std::uint32_t>(options.seed >> 32),
                    static_cast<std::uint32_t>(number), static_cast<std::uint32_t>(number >> 32)};
  rng_.seed(seq);
  thread_ = std::thread([this] { run(); });
}

std::uint64_t host_stream::enqueue(operation op) {
  std::uint64_t ticket = 0;
  {
    const std::lock_guard lock(mu_);
    queue_.push_back({std::move(op), std::chrono::steady_clock::now()});
    ticket = ++enqueued_;
  }
  work_cv_.notify_one();
  return ticket;
}

void host_stream::wait_done(std::uint64_t ticket) {
  std::unique_lock lock(mu_);
  done_cv_.wait(lock, [&] { return done_ >= ticket; });
}

void host_stream::synchronize() {
  std::unique_lock lock(mu_);
  const std::uint64_t target = enqueued_;
  done_cv_.wait(lock, [&] { return done_ >= target; });
}

void host_stream::stop() noexcept {
  {
    const std::lock_guard lock(mu_);
    stopping_ = true;
  }
  work_cv_.notify_one();
  if (thread_.joinable()) thread_.join();
}

void host_stream::run() noexcept {
  const std::string name = fmt::format("ferry-host-{}", number_ % 10000);
  static_cast<void>(::pthread_setname_np(::pthread_self(), name.c_str()));
  for (;;) {
    operation op;
    {
      std::unique_lock lock(mu_);
      work_cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;
      op = std::move(queue_.front().op);
      advance_to(queue_.front().submitted);  // an idle device starts work when the host queues it
      queue_.pop_front();
    }
    maybe_delay();
    try {
      op();
    } catch (...) {
      // Only host callbacks throw; as on CUDA, the stream goes on and the error surfaces at the next
      // synchronize.
      on_error_(std::current_exception());
    }
    // Release what the operation captured before anyone waiting on it is told it is done.
    op = nullptr;
    {
      const std::lock_guard lock(mu_);
      ++done_;
    }
    done_cv_.notify_all();
  }
}

void host_stream::maybe_delay() {
  if (jitter_probability_ <= 0 || jitter_max_.count() <= 0) return;
  if (!std::bernoulli_distribution(jitter_probability_)(rng_)) return;
  std::uniform_int_distribution<std::int64_t> delay(0, jitter_max_.count());
  std::this_thread::sleep_for(std::chrono::nanoseconds(delay(rng_)));
}

}  // namespace ferry::host_backend
