#include "ferry/core/worker_pool.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "ferry/core/bounded_queue.hpp"
#include "ferry/core/error.hpp"

namespace {

using namespace std::chrono_literals;

// Runs until asked to stop; condition_variable_any returns as soon as the token is stopped.
void wait_for_stop(std::stop_token st) {
  std::mutex m;
  std::condition_variable_any cv;
  std::unique_lock lock(m);
  cv.wait(lock, st, [] { return false; });
}

TEST(worker_pool, zero_workers_or_no_body_is_misuse) {
  EXPECT_THROW(ferry::worker_pool(0, [](std::stop_token, std::size_t) {}), ferry::logic_error);
  EXPECT_THROW(ferry::worker_pool(2, nullptr), ferry::logic_error);
}

TEST(worker_pool, each_worker_runs_once_with_its_index) {
  constexpr std::size_t n = 5;
  std::vector<std::atomic<int>> runs(n);
  std::mutex m;
  std::vector<std::thread::id> ids;
  ferry::worker_pool pool(n, [&](std::stop_token, std::size_t i) {
    runs[i].fetch_add(1);
    const std::lock_guard lock(m);
    ids.push_back(std::this_thread::get_id());
  });
  EXPECT_EQ(pool.size(), n);
  pool.join();
  for (auto& r : runs) EXPECT_EQ(r.load(), 1);
  std::sort(ids.begin(), ids.end());
  EXPECT_EQ(std::unique(ids.begin(), ids.end()), ids.end()) << "two workers shared a thread";
  EXPECT_FALSE(pool.failed());
  EXPECT_NO_THROW(pool.rethrow_if_failed());
  EXPECT_NO_THROW(pool.join());  // joining again is harmless
}

TEST(worker_pool, destructor_stops_and_joins) {
  std::atomic<int> returned{0};
  {
    ferry::worker_pool pool(3, [&](std::stop_token st, std::size_t) {
      wait_for_stop(st);
      returned.fetch_add(1);
    });
  }
  EXPECT_EQ(returned.load(), 3);
}

TEST(worker_pool, request_stop_reaches_every_worker) {
  std::atomic<int> returned{0};
  ferry::worker_pool pool(4, [&](std::stop_token st, std::size_t) {
    wait_for_stop(st);
    returned.fetch_add(1);
  });
  EXPECT_FALSE(pool.stop_requested());
  pool.request_stop();
  EXPECT_TRUE(pool.stop_requested());
  pool.join();
  EXPECT_EQ(returned.load(), 4);
}

TEST(worker_pool, exception_reaches_owner_and_stops_the_others) {
  std::atomic<int> on_error_calls{0};
  std::atomic<bool> on_error_on_worker_thread{false};
  std::atomic<int> stopped_workers{0};
  const auto owner = std::this_thread::get_id();
  std::string seen_message;
  ferry::worker_pool pool(
      4,
      [&](std::stop_token st, std::size_t i) {
        if (i == 2) throw std::runtime_error("worker 2 failed");
        wait_for_stop(st);
        stopped_workers.fetch_add(1);
      },
      [&](std::exception_ptr e) {
        on_error_calls.fetch_add(1);
        on_error_on_worker_thread = std::this_thread::get_id() != owner;
        try {
          std::rethrow_exception(e);
        } catch (const std::exception& ex) {
          seen_message = ex.what();
        }
      });
  try {
    pool.join();
    FAIL() << "join did not rethrow";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "worker 2 failed");
  }
  EXPECT_EQ(stopped_workers.load(), 3) << "the other workers were not stopped";
  EXPECT_EQ(on_error_calls.load(), 1);
  EXPECT_TRUE(on_error_on_worker_thread.load());
  EXPECT_EQ(seen_message, "worker 2 failed");
  EXPECT_TRUE(pool.failed());
  EXPECT_TRUE(pool.stop_requested());
  EXPECT_THROW(pool.rethrow_if_failed(), std::runtime_error);
  EXPECT_THROW(pool.join(), std::runtime_error);
}

TEST(worker_pool, rethrow_if_failed_at_the_owners_next_call) {
  ferry::worker_pool pool(1, [](std::stop_token, std::size_t) { throw std::out_of_range("bad index"); });
  // The owner polls between its own calls; failed() becomes true once the worker has thrown.
  while (!pool.failed()) std::this_thread::yield();
  EXPECT_THROW(pool.rethrow_if_failed(), std::out_of_range);
}

TEST(worker_pool, only_the_first_failure_is_kept) {
  std::atomic<int> on_error_calls{0};
  std::atomic<int> thrown{0};
  ferry::worker_pool pool(
      4,
      [&](std::stop_token, std::size_t i) {
        thrown.fetch_add(1);
        throw std::runtime_error("worker " + std::to_string(i));
      },
      [&](std::exception_ptr) { on_error_calls.fetch_add(1); });
  EXPECT_THROW(pool.join(), std::runtime_error);
  EXPECT_EQ(thrown.load(), 4);
  EXPECT_EQ(on_error_calls.load(), 1);
}

// The owner's on_error fails the queue the workers block in, which wakes them; stop tokens alone would not.
TEST(worker_pool, on_error_lets_the_owner_wake_workers_blocked_elsewhere) {
  ferry::bounded_queue<int> input(4);
  std::atomic<int> woken{0};
  ferry::worker_pool pool(
      3,
      [&](std::stop_token, std::size_t i) {
        if (i == 0) throw ferry::logic_error("bad sample");
        try {
          while (input.pop()) {
          }
        } catch (const ferry::logic_error&) {
          woken.fetch_add(1);
          throw;  // a consequence of the first failure: not kept, not reported again
        }
      },
      [&](std::exception_ptr e) { input.fail(e); });
  try {
    pool.join();
    FAIL() << "join did not rethrow";
  } catch (const ferry::logic_error& e) {
    EXPECT_STREQ(e.what(), "bad sample");
  }
  EXPECT_EQ(woken.load(), 2);
}

TEST(worker_pool, stopped_error_after_stop_request_is_a_shutdown_not_a_failure) {
  ferry::bounded_queue<int> output(1);
  std::atomic<int> on_error_calls{0};
  ferry::worker_pool pool(
      3,
      [&](std::stop_token, std::size_t i) {
        for (int v = 0;; ++v) output.push(static_cast<int>(i) * 1000 + v);  // blocks: nobody pops
      },
      [&](std::exception_ptr) { on_error_calls.fetch_add(1); });
  while (output.size() < 1) std::this_thread::yield();
  pool.request_stop();
  output.close();
  EXPECT_NO_THROW(pool.join());
  EXPECT_FALSE(pool.failed());
  EXPECT_EQ(on_error_calls.load(), 0);
}

TEST(worker_pool, stopped_error_without_stop_request_is_a_failure) {
  ferry::bounded_queue<int> output(1);
  output.close();
  std::atomic<int> on_error_calls{0};
  ferry::worker_pool pool(
      2, [&](std::stop_token, std::size_t) { output.push(1); },
      [&](std::exception_ptr) { on_error_calls.fetch_add(1); });
  EXPECT_THROW(pool.join(), ferry::stopped_error);
  EXPECT_EQ(on_error_calls.load(), 1);
}

TEST(worker_pool, join_from_a_worker_is_misuse) {
  std::atomic<ferry::worker_pool*> self{nullptr};
  ferry::worker_pool pool(1, [&](std::stop_token, std::size_t) {
    ferry::worker_pool* p = nullptr;
    while ((p = self.load()) == nullptr) std::this_thread::yield();
    p->join();
  });
  self.store(&pool);
  try {
    pool.join();
    FAIL() << "no throw";
  } catch (const ferry::logic_error& e) {
    EXPECT_NE(std::string(e.what()).find("deadlock"), std::string::npos) << e.what();
  }
}

TEST(worker_pool, throwing_on_error_is_contained) {
  ferry::detail::forget_reported_destructor_errors();
  ::testing::internal::CaptureStderr();
  {
    ferry::worker_pool pool(
        1, [](std::stop_token, std::size_t) { throw std::runtime_error("body"); },
        [](std::exception_ptr) { throw std::runtime_error("handler"); });
    EXPECT_THROW(pool.join(), std::runtime_error);
  }
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("on_error handler threw"), std::string::npos) << err;
}

TEST(worker_pool, producers_and_consumers_shut_down_cleanly_under_load) {
  ferry::bounded_queue<int> q(16);
  std::atomic<long long> produced{0};
  std::atomic<long long> consumed{0};
  ferry::worker_pool consumers(3, [&](std::stop_token, std::size_t) {
    while (auto v = q.pop()) consumed.fetch_add(*v);
  });
  ferry::worker_pool producers(3, [&](std::stop_token st, std::size_t i) {
    for (int v = 1; !st.stop_requested(); ++v) {
      q.push(static_cast<int>(i) + v);
      produced.fetch_add(static_cast<int>(i) + v);
    }
  });
  while (consumed.load() < 10'000) std::this_thread::yield();
  producers.request_stop();
  producers.join();
  q.close();
  consumers.join();
  EXPECT_EQ(produced.load(), consumed.load()) << "items were lost at shutdown";
}

}  // namespace
