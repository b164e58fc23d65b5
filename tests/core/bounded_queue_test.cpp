#include "ferry/core/bounded_queue.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "ferry/core/error.hpp"

namespace {

using namespace std::chrono_literals;

// Long enough that a thread which could proceed would have; used only to check that one stays blocked.
constexpr auto blocked_for = 50ms;

template <class T>
bool still_running(const std::future<T>& f) {
  return f.wait_for(blocked_for) == std::future_status::timeout;
}

TEST(bounded_queue, zero_capacity_is_misuse) {
  try {
    ferry::bounded_queue<int> q(0);
    FAIL() << "no throw";
  } catch (const ferry::logic_error& e) {
    EXPECT_NE(std::string(e.what()).find("capacity is 0"), std::string::npos) << e.what();
  }
}

TEST(bounded_queue, fifo_order_size_and_capacity) {
  ferry::bounded_queue<int> q(3);
  EXPECT_EQ(q.capacity(), 3U);
  for (int i = 0; i < 3; ++i) q.push(i);
  EXPECT_EQ(q.size(), 3U);
  // Wrap around the ring a few times.
  for (int i = 3; i < 20; ++i) {
    EXPECT_EQ(q.pop(), i - 3);
    q.push(i);
  }
  for (int i = 17; i < 20; ++i) EXPECT_EQ(q.pop(), i);
  EXPECT_EQ(q.size(), 0U);
  EXPECT_EQ(q.try_pop(), std::nullopt);
  EXPECT_FALSE(q.closed());
}

TEST(bounded_queue, moves_move_only_items) {
  ferry::bounded_queue<std::unique_ptr<int>> q(1);
  auto item = std::make_unique<int>(7);
  q.push(std::move(item));
  EXPECT_EQ(item, nullptr);  // NOLINT(bugprone-use-after-move): moved-from must be empty

  auto extra = std::make_unique<int>(8);
  EXPECT_FALSE(q.try_push(std::move(extra)));
  ASSERT_NE(extra, nullptr) << "a refused try_push must leave the item with the caller";
  EXPECT_FALSE(q.push_for(std::move(extra), 1ms));
  ASSERT_NE(extra, nullptr) << "a timed-out push_for must leave the item with the caller";

  auto out = q.pop();
  ASSERT_TRUE(out.has_value());
  EXPECT_EQ(**out, 7);
  EXPECT_TRUE(q.try_push(std::move(extra)));
  EXPECT_EQ(extra, nullptr);
  EXPECT_EQ(**q.try_pop(), 8);
}

// No default constructor and no copy: the queue must construct items only from pushes.
struct ticket {
  explicit ticket(int v) : value(v) {}
  ticket(const ticket&) = delete;
  ticket& operator=(const ticket&) = delete;
  ticket(ticket&&) noexcept = default;
  ticket& operator=(ticket&&) noexcept = default;
  ~ticket() = default;
  int value;
};

TEST(bounded_queue, holds_types_without_default_constructor) {
  ferry::bounded_queue<ticket> q(2);
  q.push(ticket(1));
  q.push(ticket(2));
  EXPECT_EQ(q.pop()->value, 1);
  q.push(ticket(3));
  EXPECT_EQ(q.pop()->value, 2);
  EXPECT_EQ(q.pop()->value, 3);
}

TEST(bounded_queue, producer_blocks_while_full_until_a_pop) {
  ferry::bounded_queue<int> q(2);
  q.push(1);
  q.push(2);
  auto producer = std::async(std::launch::async, [&] { q.push(3); });
  EXPECT_TRUE(still_running(producer)) << "push into a full queue returned";
  EXPECT_EQ(q.size(), 2U);
  EXPECT_EQ(q.pop(), 1);
  producer.get();
  EXPECT_EQ(q.pop(), 2);
  EXPECT_EQ(q.pop(), 3);
}

TEST(bounded_queue, consumer_blocks_while_empty_until_a_push) {
  ferry::bounded_queue<int> q(2);
  auto consumer = std::async(std::launch::async, [&] { return q.pop(); });
  EXPECT_TRUE(still_running(consumer));
  q.push(42);
  EXPECT_EQ(consumer.get(), 42);
}

TEST(bounded_queue, close_wakes_blocked_producers_with_stopped_error) {
  ferry::bounded_queue<int> q(1);
  q.push(0);
  std::vector<std::future<void>> producers;
  for (int i = 0; i < 3; ++i) producers.push_back(std::async(std::launch::async, [&q, i] { q.push(i + 1); }));
  EXPECT_TRUE(still_running(producers[0]));
  q.close();
  for (auto& p : producers) EXPECT_THROW(p.get(), ferry::stopped_error);
  EXPECT_THROW(q.push(9), ferry::stopped_error);
  int refused = 9;
  EXPECT_THROW((void)q.try_push(std::move(refused)), ferry::stopped_error);
  EXPECT_THROW((void)q.push_for(std::move(refused), 1ms), ferry::stopped_error);
  // What was queued before close is still delivered.
  EXPECT_EQ(q.pop(), 0);
  EXPECT_EQ(q.pop(), std::nullopt);
}

TEST(bounded_queue, close_wakes_blocked_consumers_and_pops_drain) {
  ferry::bounded_queue<int> q(4);
  std::vector<std::future<std::optional<int>>> consumers;
  for (int i = 0; i < 3; ++i) consumers.push_back(std::async(std::launch::async, [&] { return q.pop(); }));
  EXPECT_TRUE(still_running(consumers[0]));
  q.close();
  q.close();  // idempotent
  for (auto& c : consumers) EXPECT_EQ(c.get(), std::nullopt);
  EXPECT_TRUE(q.closed());
  EXPECT_FALSE(q.failed());

  ferry::bounded_queue<int> r(4);
  r.push(1);
  r.push(2);
  r.close();
  EXPECT_EQ(r.pop(), 1);
  EXPECT_EQ(r.pop_for(1s), 2);
  EXPECT_EQ(r.try_pop(), std::nullopt);
  EXPECT_EQ(r.pop_for(1s), std::nullopt);  // returns at once: closed and drained
  EXPECT_TRUE(r.closed());
}

TEST(bounded_queue, fail_wakes_everyone_with_the_failure) {
  ferry::bounded_queue<int> empty(1);
  ferry::bounded_queue<int> full(1);
  full.push(0);
  auto consumer = std::async(std::launch::async, [&] { return empty.pop(); });
  auto timed_consumer = std::async(std::launch::async, [&] { return empty.pop_for(1h); });
  auto producer = std::async(std::launch::async, [&] { full.push(1); });
  auto timed_producer = std::async(std::launch::async, [&] { return full.push_for(2, 1h); });
  EXPECT_TRUE(still_running(consumer));
  EXPECT_TRUE(still_running(producer));

  const auto error = std::make_exception_ptr(std::runtime_error("disk on fire"));
  empty.fail(error);
  full.fail(error);
  full.fail(std::make_exception_ptr(std::runtime_error("second failure")));  // ignored: first wins

  auto expect_failure = [](auto& f) {
    try {
      (void)f.get();
      ADD_FAILURE() << "no exception";
    } catch (const std::runtime_error& e) {
      EXPECT_STREQ(e.what(), "disk on fire");
    }
  };
  expect_failure(consumer);
  expect_failure(timed_consumer);
  expect_failure(producer);
  expect_failure(timed_producer);
  EXPECT_TRUE(full.failed());
  EXPECT_FALSE(full.closed());
}

TEST(bounded_queue, failure_wins_over_remaining_items_and_close) {
  ferry::bounded_queue<int> q(4);
  q.push(1);
  q.push(2);
  q.close();
  q.fail(std::make_exception_ptr(std::runtime_error("late failure")));
  EXPECT_THROW((void)q.pop(), std::runtime_error);
  EXPECT_THROW((void)q.try_pop(), std::runtime_error);
  EXPECT_THROW((void)q.pop_for(1ms), std::runtime_error);
  EXPECT_THROW(q.push(3), std::runtime_error);
  EXPECT_EQ(q.size(), 2U);
  EXPECT_THROW(q.fail(nullptr), ferry::logic_error);
}

TEST(bounded_queue, timed_operations_time_out) {
  ferry::bounded_queue<int> q(1);
  EXPECT_EQ(q.pop_for(5ms), std::nullopt);
  EXPECT_FALSE(q.closed()) << "a timeout is not a close";
  EXPECT_TRUE(q.push_for(1, 5ms));
  EXPECT_FALSE(q.push_for(2, 5ms));
  EXPECT_FALSE(q.push_for(2, -5ms));
  EXPECT_EQ(q.pop_for(0ms), 1);
  // Absurdly long timeouts must not overflow the deadline into the past.
  EXPECT_TRUE(q.push_for(3, std::chrono::hours::max()));
  EXPECT_EQ(q.pop_for(std::chrono::nanoseconds::max()), 3);
}

TEST(bounded_queue, push_for_succeeds_when_room_appears) {
  ferry::bounded_queue<int> q(1);
  q.push(1);
  auto producer = std::async(std::launch::async, [&] { return q.push_for(2, 1h); });
  EXPECT_TRUE(still_running(producer));
  EXPECT_EQ(q.pop(), 1);
  EXPECT_TRUE(producer.get());
  EXPECT_EQ(q.pop(), 2);
}

TEST(bounded_queue, multi_producer_multi_consumer_sees_every_item_once) {
  constexpr int producers = 4;
  constexpr int consumers = 4;
  constexpr int per_producer = 20'000;
  constexpr int total = producers * per_producer;
  ferry::bounded_queue<int> q(8);
  std::vector<std::atomic<int>> seen(total);
  std::atomic<long long> sum{0};
  std::atomic<int> popped{0};

  std::vector<std::thread> threads;
  for (int c = 0; c < consumers; ++c) {
    threads.emplace_back([&] {
      // Each producer's items must come out in the order it pushed them.
      std::vector<int> last(producers, -1);
      while (auto item = q.pop()) {
        const int v = *item;
        seen[v].fetch_add(1, std::memory_order_relaxed);
        sum.fetch_add(v, std::memory_order_relaxed);
        popped.fetch_add(1, std::memory_order_relaxed);
        const int p = v / per_producer;
        EXPECT_GT(v, last[p]);
        last[p] = v;
      }
    });
  }
  std::vector<std::thread> writers;
  for (int p = 0; p < producers; ++p) {
    writers.emplace_back([&q, p] {
      for (int i = 0; i < per_producer; ++i) {
        const int v = p * per_producer + i;
        // Mix the three ways in.
        if (i % 3 == 0) {
          q.push(v);
        } else if (i % 3 == 1) {
          int item = v;
          while (!q.try_push(std::move(item))) std::this_thread::yield();
        } else {
          int item = v;
          while (!q.push_for(std::move(item), 1ms)) {
          }
        }
      }
    });
  }
  for (auto& w : writers) w.join();
  q.close();
  for (auto& t : threads) t.join();

  EXPECT_EQ(popped.load(), total);
  EXPECT_EQ(sum.load(), static_cast<long long>(total) * (total - 1) / 2);
  int wrong = 0;
  for (int i = 0; i < total; ++i) wrong += seen[i].load() != 1 ? 1 : 0;
  EXPECT_EQ(wrong, 0) << "items not seen exactly once";
}

TEST(bounded_queue, fail_under_load_wakes_every_thread) {
  ferry::bounded_queue<int> q(2);
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < 3; ++i) {
    threads.emplace_back([&] {
      try {
        for (int v = 0;; ++v) q.push(v);
      } catch (const std::runtime_error&) {
        failures.fetch_add(1);
      }
    });
    threads.emplace_back([&] {
      try {
        while (q.pop()) {
        }
      } catch (const std::runtime_error&) {
        failures.fetch_add(1);
      }
    });
  }
  std::this_thread::sleep_for(5ms);
  q.fail(std::make_exception_ptr(std::runtime_error("boom")));
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 6);
}

}  // namespace
