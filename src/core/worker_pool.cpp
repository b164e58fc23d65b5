#include "ferry/core/worker_pool.hpp"

#include <fmt/format.h>

#include "ferry/core/error.hpp"

namespace ferry {

worker_pool::worker_pool(std::size_t workers, body_fn body, error_fn on_error)
    : body_(std::move(body)), on_error_(std::move(on_error)), size_(workers) {
  FERRY_EXPECTS(workers > 0, "worker_pool of 0 workers; it needs at least one");
  FERRY_EXPECTS(static_cast<bool>(body_), "worker_pool needs a body to run");
  threads_.reserve(workers);
  try {
    for (std::size_t i = 0; i < workers; ++i) threads_.emplace_back([this, i] { run(i); });
  } catch (...) {
    // The vector's destructor joins the workers already running; they must be told to return first.
    stop_.request_stop();
    throw;
  }
}

worker_pool::~worker_pool() {
  stop_.request_stop();
  {
    const std::lock_guard lock(join_mu_);
    for (auto& t : threads_) {
      if (t.joinable()) t.join();
    }
  }
  const std::lock_guard lock(error_mu_);
  if (error_ && !error_collected_) {
    try {
      std::rethrow_exception(error_);
    } catch (const std::exception& e) {
      FERRY_ASSERT_NOTHROW(false,
                           fmt::format("worker_pool destroyed with an uncollected failure: {}", e.what()));
    } catch (...) {
      FERRY_ASSERT_NOTHROW(false, "worker_pool destroyed with an uncollected failure of unknown type");
    }
  }
}

namespace {
// Lets join() refuse to be called from a worker, which would wait for itself.
thread_local const worker_pool* current_pool = nullptr;
}  // namespace

void worker_pool::run(std::size_t index) noexcept {
  current_pool = this;
  const std::stop_token token = stop_.get_token();
  try {
    body_(token, index);
  } catch (const stopped_error&) {
    // After a stop request this is how a body blocked in a closed queue or ring learns of the shutdown.
    if (!token.stop_requested()) capture(std::current_exception());
  } catch (...) {
    capture(std::current_exception());
  }
}

void worker_pool::capture(std::exception_ptr error) noexcept {
  {
    const std::lock_guard lock(error_mu_);
    if (error_) return;
    error_ = error;
  }
  failed_.store(true, std::memory_order_release);
  stop_.request_stop();
  if (!on_error_) return;
  try {
    on_error_(std::move(error));
  } catch (...) {
    FERRY_ASSERT_NOTHROW(false, "worker_pool's on_error handler threw; that exception was dropped");
  }
}

void worker_pool::rethrow_if_failed() const {
  if (!failed()) return;
  std::exception_ptr e;
  {
    const std::lock_guard lock(error_mu_);
    e = error_;
    error_collected_ = true;
  }
  std::rethrow_exception(e);
}

void worker_pool::request_stop() noexcept { stop_.request_stop(); }

void worker_pool::join() {
  FERRY_EXPECTS(current_pool != this,
                "worker_pool::join called from one of its own workers; it would deadlock");
  {
    const std::lock_guard lock(join_mu_);
    for (auto& t : threads_) {
      if (t.joinable()) t.join();
    }
  }
  std::exception_ptr e;
  {
    const std::lock_guard lock(error_mu_);
    e = error_;
    error_collected_ = true;
  }
  if (e) std::rethrow_exception(e);
}

}  // namespace ferry
