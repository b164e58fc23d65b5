#include "ferry/core/slot_ring.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <future>
#include <mutex>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "ferry/core/bounded_queue.hpp"
#include "ferry/core/error.hpp"

namespace {

using namespace std::chrono_literals;
using ferry::delivery;
using ferry::placement;
using ferry::slot_ring;
using ferry::slot_state;

constexpr auto blocked_for = 50ms;

template <class T>
bool still_running(const std::future<T>& f) {
  return f.wait_for(blocked_for) == std::future_status::timeout;
}

std::string misuse_message(const std::function<void()>& f) {
  try {
    f();
  } catch (const ferry::logic_error& e) {
    return e.what();
  }
  return "(no logic_error)";
}

TEST(slot_ring, zero_slots_is_misuse) { EXPECT_THROW(slot_ring(0), ferry::logic_error); }

TEST(slot_ring, full_cycle_and_counts) {
  slot_ring ring(3);
  EXPECT_EQ(ring.size(), 3U);
  EXPECT_TRUE(ring.full_free());
  EXPECT_EQ(ring.count(slot_state::free), 3U);

  const std::size_t s = ring.acquire();
  EXPECT_EQ(s, 0U);
  EXPECT_EQ(ring.state(s), slot_state::in_flight);
  EXPECT_FALSE(ring.full_free());
  ring.mark_ready(s);
  EXPECT_EQ(ring.state(s), slot_state::ready);
  EXPECT_EQ(ring.count(slot_state::ready), 1U);
  EXPECT_EQ(ring.take_ready(), s);
  EXPECT_EQ(ring.state(s), slot_state::in_use);
  EXPECT_EQ(ring.count(slot_state::in_use), 1U);
  ring.release(s);
  EXPECT_EQ(ring.state(s), slot_state::free);
  EXPECT_TRUE(ring.full_free());
}

TEST(slot_ring, free_slots_are_handed_out_in_the_order_they_were_freed) {
  slot_ring ring(3);
  EXPECT_EQ(ring.acquire(), 0U);
  EXPECT_EQ(ring.acquire(), 1U);
  ring.cancel(1);
  EXPECT_EQ(ring.acquire(), 2U);
  EXPECT_EQ(ring.acquire(), 1U);
  EXPECT_EQ(ring.try_acquire(), std::nullopt);
}

TEST(slot_ring, in_order_waits_for_the_oldest_slot) {
  slot_ring ring(4, delivery::in_order);
  for (int i = 0; i < 3; ++i) (void)ring.acquire();
  ring.mark_ready(2);
  ring.mark_ready(1);
  EXPECT_EQ(ring.try_take_ready(), std::nullopt) << "delivered a younger slot before the oldest";
  auto consumer = std::async(std::launch::async, [&] { return ring.take_ready(); });
  EXPECT_TRUE(still_running(consumer));
  ring.mark_ready(0);
  EXPECT_EQ(consumer.get(), 0U);
  EXPECT_EQ(ring.take_ready(), 1U);
  EXPECT_EQ(ring.take_ready_for(1s), 2U);
}

TEST(slot_ring, in_order_wakes_every_consumer_a_completion_unblocks) {
  slot_ring ring(3, delivery::in_order);
  for (int i = 0; i < 3; ++i) (void)ring.acquire();
  std::vector<std::future<std::size_t>> consumers;
  for (int i = 0; i < 3; ++i)
    consumers.push_back(std::async(std::launch::async, [&] { return ring.take_ready(); }));
  EXPECT_TRUE(still_running(consumers[0]));
  ring.mark_ready(2);
  ring.mark_ready(1);
  // One completion makes all three deliverable; each blocked consumer must get one.
  ring.mark_ready(0);
  std::vector<std::size_t> got;
  for (auto& c : consumers) got.push_back(c.get());
  std::sort(got.begin(), got.end());
  EXPECT_EQ(got, (std::vector<std::size_t>{0, 1, 2}));
}

TEST(slot_ring, as_completed_delivers_in_completion_order) {
  slot_ring ring(4, delivery::as_completed);
  EXPECT_EQ(ring.order(), delivery::as_completed);
  for (int i = 0; i < 4; ++i) (void)ring.acquire();
  ring.mark_ready(2);
  ring.mark_ready(0);
  EXPECT_EQ(ring.take_ready(), 2U);
  ring.mark_ready(3);
  EXPECT_EQ(ring.take_ready(), 0U);
  EXPECT_EQ(ring.take_ready(), 3U);
  EXPECT_EQ(ring.try_take_ready(), std::nullopt);
  ring.mark_ready(1);
  EXPECT_EQ(ring.try_take_ready(), 1U);
}

TEST(slot_ring, acquire_blocks_while_no_slot_is_free) {
  slot_ring ring(2);
  (void)ring.acquire();
  (void)ring.acquire();
  EXPECT_EQ(ring.try_acquire(), std::nullopt);
  EXPECT_EQ(ring.acquire_for(5ms), std::nullopt);
  auto producer = std::async(std::launch::async, [&] { return ring.acquire(); });
  EXPECT_TRUE(still_running(producer)) << "acquire returned with every slot in flight";
  ring.mark_ready(0);
  EXPECT_TRUE(still_running(producer)) << "a ready slot is not free";
  EXPECT_EQ(ring.take_ready(), 0U);
  EXPECT_TRUE(still_running(producer)) << "an in-use slot is not free";
  ring.release(0);
  EXPECT_EQ(producer.get(), 0U);
}

TEST(slot_ring, wrong_transitions_name_slot_state_and_expectation) {
  slot_ring ring(2);
  EXPECT_EQ(misuse_message([&] { ring.release(1); }),
            misuse_message([&] { ring.release(1); }));  // stable text
  std::string msg = misuse_message([&] { ring.release(1); });
  EXPECT_NE(msg.find("release(1): slot 1 is free, expected in_use"), std::string::npos) << msg;
  msg = misuse_message([&] { ring.mark_ready(0); });
  EXPECT_NE(msg.find("mark_ready(0): slot 0 is free, expected in_flight"), std::string::npos) << msg;
  msg = misuse_message([&] { ring.cancel(0); });
  EXPECT_NE(msg.find("cancel(0): slot 0 is free, expected in_flight or ready"), std::string::npos) << msg;
  msg = misuse_message([&] { ring.release(2); });
  EXPECT_NE(msg.find("release(2): slot 2 is out of range for a ring of 2 slots"), std::string::npos) << msg;
  msg = misuse_message([&] { (void)ring.state(5); });
  EXPECT_NE(msg.find("slot 5 is out of range"), std::string::npos) << msg;

  const std::size_t s = ring.acquire();
  msg = misuse_message([&] { ring.release(s); });
  EXPECT_NE(msg.find("slot 0 is in_flight, expected in_use"), std::string::npos) << msg;
  ring.mark_ready(s);
  msg = misuse_message([&] { ring.mark_ready(s); });
  EXPECT_NE(msg.find("slot 0 is ready, expected in_flight"), std::string::npos) << msg;
  (void)ring.take_ready();
  msg = misuse_message([&] { ring.cancel(s); });
  EXPECT_NE(msg.find("slot 0 is in_use, expected in_flight or ready"), std::string::npos) << msg;
  // A refused transition changes nothing.
  EXPECT_EQ(ring.state(s), slot_state::in_use);
  ring.release(s);
  EXPECT_TRUE(ring.full_free());
}

TEST(slot_ring, cancel_of_the_oldest_releases_younger_ready_slots) {
  slot_ring ring(3, delivery::in_order);
  const std::size_t a = ring.acquire();
  const std::size_t b = ring.acquire();
  ring.mark_ready(b);
  auto consumer = std::async(std::launch::async, [&] { return ring.take_ready(); });
  EXPECT_TRUE(still_running(consumer));
  ring.cancel(a);
  EXPECT_EQ(consumer.get(), b);
  EXPECT_EQ(ring.state(a), slot_state::free);
  ring.release(b);
  EXPECT_TRUE(ring.full_free());
}

TEST(slot_ring, cancel_of_a_ready_slot_skips_its_delivery) {
  for (const delivery order : {delivery::in_order, delivery::as_completed}) {
    slot_ring ring(3, order);
    const std::size_t a = ring.acquire();
    const std::size_t b = ring.acquire();
    ring.mark_ready(a);
    ring.mark_ready(b);
    ring.cancel(a);
    EXPECT_EQ(ring.take_ready(), b) << to_string(order);
    EXPECT_EQ(ring.try_take_ready(), std::nullopt);
    ring.release(b);
    EXPECT_TRUE(ring.full_free());
  }
}

TEST(slot_ring, stop_wakes_blocked_acquire_and_take_ready) {
  slot_ring ring(1);
  (void)ring.acquire();
  auto producer = std::async(std::launch::async, [&] { return ring.acquire(); });
  auto timed_producer = std::async(std::launch::async, [&] { return ring.acquire_for(1h); });
  auto consumer = std::async(std::launch::async, [&] { return ring.take_ready(); });
  auto timed_consumer = std::async(std::launch::async, [&] { return ring.take_ready_for(1h); });
  EXPECT_TRUE(still_running(producer));
  EXPECT_TRUE(still_running(consumer));
  ring.stop();
  ring.stop();  // idempotent
  EXPECT_THROW((void)producer.get(), ferry::stopped_error);
  EXPECT_THROW((void)timed_producer.get(), ferry::stopped_error);
  EXPECT_THROW((void)consumer.get(), ferry::stopped_error);
  EXPECT_THROW((void)timed_consumer.get(), ferry::stopped_error);
  EXPECT_TRUE(ring.stopped());
  EXPECT_FALSE(ring.failed());
  EXPECT_THROW((void)ring.try_acquire(), ferry::stopped_error);
  EXPECT_THROW((void)ring.try_take_ready(), ferry::stopped_error);
  // Bookkeeping still works, so the slot comes back.
  ring.cancel(0);
  EXPECT_TRUE(ring.full_free());
}

TEST(slot_ring, after_stop_ready_slots_are_still_delivered_in_order) {
  slot_ring ring(4, delivery::in_order);
  for (int i = 0; i < 4; ++i) (void)ring.acquire();
  ring.mark_ready(0);
  ring.mark_ready(1);
  ring.mark_ready(3);  // slot 2 stays in flight
  ring.stop();
  EXPECT_EQ(ring.take_ready(), 0U);
  EXPECT_EQ(ring.try_take_ready(), 1U);
  // Slot 2 is next and not ready: no waiting after stop, even though 3 is ready behind it.
  EXPECT_THROW((void)ring.take_ready(), ferry::stopped_error);
  // Marking it ready (its copy finished during shutdown) makes both deliverable again.
  ring.mark_ready(2);
  EXPECT_EQ(ring.take_ready(), 2U);
  EXPECT_EQ(ring.take_ready(), 3U);
  try {
    (void)ring.take_ready();
    FAIL() << "no throw";
  } catch (const ferry::stopped_error& e) {
    EXPECT_NE(std::string(e.what()).find("no ready slot"), std::string::npos) << e.what();
  }
  for (std::size_t s = 0; s < 4; ++s) ring.release(s);
  EXPECT_TRUE(ring.full_free());
}

TEST(slot_ring, fail_wakes_everyone_and_wins_over_ready_slots) {
  slot_ring ring(2);
  const std::size_t a = ring.acquire();
  const std::size_t b = ring.acquire();
  auto producer = std::async(std::launch::async, [&] { return ring.acquire(); });
  auto consumer = std::async(std::launch::async, [&] { return ring.take_ready(); });
  EXPECT_TRUE(still_running(producer));
  ring.fail(std::make_exception_ptr(std::runtime_error("copy engine fault")));
  ring.fail(std::make_exception_ptr(std::runtime_error("second")));
  for (auto* f : {&producer, &consumer}) {
    try {
      (void)f->get();
      ADD_FAILURE() << "no throw";
    } catch (const std::runtime_error& e) {
      EXPECT_STREQ(e.what(), "copy engine fault");
    }
  }
  EXPECT_TRUE(ring.failed());
  EXPECT_TRUE(ring.stopped());
  ring.mark_ready(a);
  EXPECT_THROW((void)ring.take_ready(), std::runtime_error);
  EXPECT_THROW((void)ring.try_take_ready(), std::runtime_error);
  EXPECT_THROW((void)ring.try_acquire(), std::runtime_error);
  EXPECT_THROW(ring.fail(nullptr), ferry::logic_error);
  // The owner returns every slot: the ready one is discarded, the in-flight one's work has ended.
  ring.cancel(a);
  ring.cancel(b);
  EXPECT_TRUE(ring.full_free());
}

TEST(slot_ring, wait_all_free_waits_for_every_slot_even_after_stop) {
  slot_ring ring(3, delivery::as_completed);
  ring.wait_all_free();  // every slot is free: returns at once
  const std::size_t a = ring.acquire();
  const std::size_t b = ring.acquire();
  ring.mark_ready(b);
  EXPECT_EQ(ring.take_ready(), b);

  auto waiter = std::async(std::launch::async, [&] { ring.wait_all_free(); });
  EXPECT_TRUE(still_running(waiter));
  ring.stop();
  EXPECT_TRUE(still_running(waiter)) << "wait_all_free returned with slots still out";
  EXPECT_FALSE(ring.wait_all_free_for(1ms));
  ring.release(b);
  EXPECT_TRUE(still_running(waiter)) << "wait_all_free returned with slot a in flight";
  ring.mark_ready(a);
  ring.cancel(a);
  waiter.get();
  EXPECT_TRUE(ring.wait_all_free_for(0ms));
}

TEST(slot_ring, timed_waits_time_out_without_changing_state) {
  slot_ring ring(1);
  const std::size_t s = ring.acquire();
  EXPECT_EQ(ring.acquire_for(2ms), std::nullopt);
  EXPECT_EQ(ring.take_ready_for(2ms), std::nullopt);
  EXPECT_EQ(ring.take_ready_for(-2ms), std::nullopt);
  EXPECT_EQ(ring.state(s), slot_state::in_flight);
  ring.mark_ready(s);
  EXPECT_EQ(ring.take_ready_for(std::chrono::hours::max()), s);
  ring.release(s);
  EXPECT_EQ(ring.acquire_for(std::chrono::nanoseconds::max()), s);
}

// One producer acquires and numbers slots; completers mark them ready in a scrambled order; several
// consumers take them. Every number is delivered exactly once and the pool returns to full.
void run_pipeline(delivery order, int consumers, int items, std::size_t slots) {
  slot_ring ring(slots, order);
  std::vector<long long> seq(slots, -1);
  ferry::bounded_queue<std::size_t> to_complete(slots);
  std::atomic<long long> sum{0};
  std::atomic<int> delivered{0};
  std::vector<std::atomic<int>> seen(static_cast<std::size_t>(items));

  std::vector<std::thread> threads;
  // Two completers racing each other scramble completion order.
  for (int c = 0; c < 2; ++c) {
    threads.emplace_back([&, c] {
      std::mt19937 rng(static_cast<unsigned>(c + 1));
      while (auto s = to_complete.pop()) {
        if (rng() % 4 == 0) std::this_thread::yield();
        ring.mark_ready(*s);
      }
    });
  }
  for (int c = 0; c < consumers; ++c) {
    threads.emplace_back([&] {
      for (;;) {
        std::size_t s = 0;
        try {
          s = ring.take_ready();
        } catch (const ferry::stopped_error&) {
          return;
        }
        const long long v = seq[s];
        seen[static_cast<std::size_t>(v)].fetch_add(1);
        sum.fetch_add(v);
        delivered.fetch_add(1);
        ring.release(s);
      }
    });
  }
  for (int i = 0; i < items; ++i) {
    const std::size_t s = ring.acquire();
    seq[s] = i;
    to_complete.push(s);
  }
  to_complete.close();
  for (int c = 0; c < 2; ++c) threads[static_cast<std::size_t>(c)].join();
  // Every slot is now ready or delivered; wait for the consumers to hand them all back, then stop them.
  ring.wait_all_free();
  ring.stop();
  for (std::size_t t = 2; t < threads.size(); ++t) threads[t].join();

  EXPECT_EQ(delivered.load(), items);
  EXPECT_EQ(sum.load(), static_cast<long long>(items) * (items - 1) / 2);
  int wrong = 0;
  for (auto& v : seen) wrong += v.load() != 1 ? 1 : 0;
  EXPECT_EQ(wrong, 0);
  EXPECT_TRUE(ring.full_free());
}

TEST(slot_ring, stress_as_completed_delivers_every_slot_once) {
  run_pipeline(delivery::as_completed, 3, 20'000, 8);
}

TEST(slot_ring, stress_in_order_delivers_every_slot_once) { run_pipeline(delivery::in_order, 3, 20'000, 8); }

TEST(slot_ring, stress_in_order_single_consumer_sees_submission_order) {
  constexpr int items = 20'000;
  slot_ring ring(6, delivery::in_order);
  std::vector<int> seq(6, -1);
  ferry::bounded_queue<std::size_t> to_complete(6);
  std::vector<std::thread> completers;
  for (int c = 0; c < 3; ++c) {
    completers.emplace_back([&] {
      while (auto s = to_complete.pop()) ring.mark_ready(*s);
    });
  }
  std::thread producer([&] {
    for (int i = 0; i < items; ++i) {
      const std::size_t s = ring.acquire();
      seq[s] = i;
      to_complete.push(s);
    }
    to_complete.close();
  });
  int expected = 0;
  for (; expected < items; ++expected) {
    const std::size_t s = ring.take_ready();
    ASSERT_EQ(seq[s], expected);
    ring.release(s);
  }
  producer.join();
  for (auto& t : completers) t.join();
  EXPECT_TRUE(ring.full_free());
}

// A completer fails midway; the owner fails the ring, every blocked thread wakes, and the owner returns
// every slot to free.
TEST(slot_ring, failure_under_load_returns_every_slot) {
  for (const delivery order : {delivery::in_order, delivery::as_completed}) {
    slot_ring ring(4, order);
    ferry::bounded_queue<std::size_t> to_complete(4);
    std::atomic<int> completed{0};
    std::atomic<int> consumer_failures{0};
    std::thread completer([&] {
      try {
        while (auto s = to_complete.pop()) {
          if (completed.fetch_add(1) == 500) {
            // This copy never happened; its slot stays in flight until the owner cancels it.
            throw std::runtime_error("copy failed");
          }
          ring.mark_ready(*s);
        }
      } catch (...) {
        to_complete.fail(std::current_exception());
        ring.fail(std::current_exception());
      }
    });
    std::vector<std::thread> consumers;
    for (int c = 0; c < 2; ++c) {
      consumers.emplace_back([&] {
        try {
          for (;;) ring.release(ring.take_ready());
        } catch (const std::runtime_error& e) {
          if (std::string(e.what()) == "copy failed") consumer_failures.fetch_add(1);
        }
      });
    }
    bool producer_failed = false;
    try {
      for (;;) {
        const std::size_t s = ring.acquire();
        try {
          to_complete.push(s);
        } catch (...) {
          ring.cancel(s);  // the submit failed before its work was queued
          throw;
        }
      }
    } catch (const std::runtime_error& e) {
      producer_failed = std::string(e.what()) == "copy failed";
    }
    completer.join();
    for (auto& t : consumers) t.join();
    EXPECT_TRUE(producer_failed);
    EXPECT_EQ(consumer_failures.load(), 2);

    // Owner's cleanup: nothing writes any slot any more, so every slot out is cancelled.
    for (std::size_t s = 0; s < ring.size(); ++s) {
      const slot_state st = ring.state(s);
      if (st == slot_state::in_flight || st == slot_state::ready) ring.cancel(s);
    }
    EXPECT_EQ(ring.count(slot_state::in_use), 0U) << "consumers release what they take";
    EXPECT_TRUE(ring.full_free()) << to_string(order);
  }
}

TEST(slot_ring, rotating_placement_gives_acquisition_n_slot_n_mod_size_and_waits_for_it) {
  slot_ring ring(3, delivery::in_order, placement::rotating);
  EXPECT_EQ(ring.slot_placement(), placement::rotating);
  for (std::size_t n = 0; n < 3; ++n) {
    EXPECT_EQ(ring.acquisitions(), n);
    EXPECT_EQ(ring.acquire(), n);
    EXPECT_EQ(ring.sequence(n), n);
  }
  ring.cancel(1);  // slot 1 is free, but acquisition 3 goes to slot 0
  EXPECT_EQ(ring.try_acquire(), std::nullopt);
  EXPECT_EQ(ring.acquire_for(2ms), std::nullopt);
  auto next = std::async(std::launch::async, [&] { return ring.acquire(); });
  EXPECT_TRUE(still_running(next));
  ring.mark_ready(0);
  EXPECT_EQ(ring.take_ready(), 0U);
  ring.release(0);
  EXPECT_EQ(next.get(), 0U);
  EXPECT_EQ(ring.sequence(0), 3U);
  EXPECT_EQ(ring.acquire(), 1U);  // acquisition 4
  EXPECT_EQ(ring.sequence(1), 4U);
  EXPECT_EQ(ring.count(slot_state::free), 0U);
}

TEST(slot_ring, sequence_of_a_slot_never_acquired_or_out_of_range_is_misuse) {
  slot_ring ring(2, delivery::in_order, placement::rotating);
  EXPECT_NE(misuse_message([&] { (void)ring.sequence(0); }).find("slot 0 was never acquired"),
            std::string::npos);
  EXPECT_NE(misuse_message([&] { (void)ring.sequence(2); }).find("out of range"), std::string::npos);
}

TEST(slot_ring, producers_of_one_slot_share_its_acquisition_and_deliver_in_number_order) {
  for (const placement place : {placement::first_freed, placement::rotating}) {
    slot_ring ring(3, delivery::in_order, place);
    // The first call for 2 makes 0, 1 and 2 in order; later calls for them join.
    const std::size_t s2 = ring.acquire_nth(2);
    EXPECT_EQ(ring.acquisitions(), 3U);
    const std::size_t s0 = ring.acquire_nth(0);
    const std::size_t s1 = ring.acquire_nth(1);
    EXPECT_EQ(ring.acquire_nth(2), s2);
    EXPECT_EQ(ring.try_acquire_nth(0), s0);
    EXPECT_EQ(ring.acquire_nth_for(1, 0ms), s1);
    EXPECT_EQ((std::vector<std::size_t>{s0, s1, s2}), (std::vector<std::size_t>{0, 1, 2}))
        << to_string(place);
    EXPECT_EQ(ring.acquisitions(), 3U) << "joining made no acquisition";
    EXPECT_EQ(ring.try_acquire_nth(3), std::nullopt) << "no slot is free";
    EXPECT_EQ(ring.acquisitions(), 3U);
    ring.mark_ready(s2);
    ring.mark_ready(s0);
    EXPECT_EQ(ring.take_ready(), s0);
    EXPECT_EQ(ring.try_take_ready(), std::nullopt) << "1 is before 2";
    ring.mark_ready(s1);
    EXPECT_EQ(ring.sequence(ring.take_ready()), 1U);
    EXPECT_EQ(ring.sequence(ring.take_ready()), 2U);
    for (const std::size_t s : {s0, s1, s2}) ring.release(s);
    EXPECT_TRUE(ring.full_free());
  }
}

TEST(slot_ring, joining_an_acquisition_that_moved_on_is_misuse_naming_it) {
  slot_ring ring(2, delivery::in_order, placement::rotating);
  EXPECT_EQ(ring.acquire_nth(0), 0U);
  ring.mark_ready(0);
  EXPECT_NE(
      misuse_message([&] { (void)ring.acquire_nth(0); }).find("slot 0, which is ready, expected in_flight"),
      std::string::npos);
  EXPECT_EQ(ring.take_ready(), 0U);
  ring.release(0);
  EXPECT_NE(misuse_message([&] { (void)ring.try_acquire_nth(0); }).find("which is free"), std::string::npos);
  EXPECT_EQ(ring.acquire_nth(2), 0U);  // makes 1 (slot 1) and 2 (slot 0 again)
  EXPECT_NE(misuse_message([&] { (void)ring.acquire_nth(0); }).find("acquisition 0 is over"),
            std::string::npos);
  EXPECT_EQ(ring.acquire_nth(1), 1U);
}

TEST(slot_ring, acquire_nth_waiters_for_different_numbers_each_wake_when_theirs_is_made) {
  slot_ring ring(2, delivery::in_order, placement::rotating);
  EXPECT_EQ(ring.acquire_nth(1), 1U);
  // Two producers of item 3 (slot 1) and one of item 2 (slot 0) wait; freeing slot 1 alone cannot make 3,
  // which comes after 2.
  auto third_a = std::async(std::launch::async, [&] { return ring.acquire_nth(3); });
  auto third_b = std::async(std::launch::async, [&] { return ring.acquire_nth_for(3, 1h); });
  auto second = std::async(std::launch::async, [&] { return ring.acquire_nth(2); });
  EXPECT_TRUE(still_running(third_a));
  ring.mark_ready(1);
  ring.cancel(1);
  EXPECT_TRUE(still_running(third_b));
  EXPECT_TRUE(still_running(second));
  EXPECT_EQ(ring.acquisitions(), 2U);
  ring.mark_ready(0);
  EXPECT_EQ(ring.take_ready(), 0U);
  ring.release(0);  // 2 takes slot 0, then 3 takes slot 1: every waiter returns
  EXPECT_EQ(second.get(), 0U);
  EXPECT_EQ(third_a.get(), 1U);
  EXPECT_EQ(third_b.get(), 1U);
  EXPECT_EQ(ring.acquisitions(), 4U);
}

TEST(slot_ring, stop_and_fail_wake_blocked_acquire_nth_and_a_timeout_keeps_what_was_made) {
  {
    slot_ring ring(2, delivery::in_order, placement::rotating);
    EXPECT_EQ(ring.acquire_nth(0), 0U);
    // 1 can be made now, 2 cannot: a timed call makes 1 and times out on 2.
    EXPECT_EQ(ring.acquire_nth_for(2, 2ms), std::nullopt);
    EXPECT_EQ(ring.acquisitions(), 2U);
    EXPECT_EQ(ring.acquire_nth(1), 1U);
    auto blocked = std::async(std::launch::async, [&] { return ring.acquire_nth(2); });
    auto timed = std::async(std::launch::async, [&] { return ring.acquire_nth_for(5, 1h); });
    EXPECT_TRUE(still_running(blocked));
    EXPECT_TRUE(still_running(timed));
    ring.stop();
    EXPECT_THROW((void)blocked.get(), ferry::stopped_error);
    EXPECT_THROW((void)timed.get(), ferry::stopped_error);
    EXPECT_THROW((void)ring.acquire_nth(1), ferry::stopped_error) << "made, but the ring is stopped";
    ring.cancel(0);
    ring.cancel(1);
    EXPECT_TRUE(ring.full_free());
  }
  {
    slot_ring ring(1, delivery::in_order, placement::rotating);
    (void)ring.acquire_nth(0);
    auto blocked = std::async(std::launch::async, [&] { return ring.acquire_nth(1); });
    EXPECT_TRUE(still_running(blocked));
    ring.fail(std::make_exception_ptr(std::runtime_error("fill failed")));
    EXPECT_THROW((void)blocked.get(), std::runtime_error);
    EXPECT_THROW((void)ring.try_acquire_nth(0), std::runtime_error);
  }
}

// The loader's shape: items of `parts` parts each; producers draw parts from one counter, join the item's
// acquisition, write their part and the last one marks the item ready; one consumer checks every byte in
// item order. Ends with a stop while producers wait for slots: every thread returns.
void run_shared_producers(std::size_t slots, int producers, std::uint64_t items, std::size_t parts,
                          std::uint64_t stop_after) {
  slot_ring ring(slots, delivery::in_order, placement::rotating);
  std::vector<std::vector<std::uint64_t>> buffers(slots, std::vector<std::uint64_t>(parts));
  std::vector<std::atomic<std::size_t>> done(slots);
  std::atomic<std::uint64_t> counter{0};
  std::atomic<int> returned{0};
  std::vector<std::thread> threads;
  for (int p = 0; p < producers; ++p) {
    threads.emplace_back([&] {
      for (;;) {
        const std::uint64_t t = counter.fetch_add(1);
        const std::uint64_t n = t / parts;
        if (n >= items) break;
        std::size_t s = 0;
        try {
          s = ring.acquire_nth(n);
        } catch (const ferry::stopped_error&) {
          break;
        }
        EXPECT_EQ(s, n % slots);
        buffers[s][t % parts] = n * 1000 + t % parts;
        if (done[s].fetch_add(1, std::memory_order_acq_rel) + 1 == parts) {
          done[s].store(0, std::memory_order_relaxed);
          ring.mark_ready(s);
        }
      }
      returned.fetch_add(1);
    });
  }
  std::uint64_t wrong = 0;
  for (std::uint64_t n = 0; n < stop_after; ++n) {
    const std::size_t s = ring.take_ready();
    EXPECT_EQ(ring.sequence(s), n);
    for (std::size_t j = 0; j < parts; ++j) wrong += buffers[s][j] != n * 1000 + j ? 1 : 0;
    ring.release(s);
  }
  // Nothing more is taken: the producers fill every slot and wait for more; stop wakes them.
  ring.stop();
  for (auto& t : threads) t.join();
  EXPECT_EQ(wrong, 0U);
  EXPECT_EQ(returned.load(), producers);
}

TEST(slot_ring, stress_producers_sharing_slots_deliver_every_item_whole_in_order) {
  run_shared_producers(3, 6, 3'000, 5, 3'000);
  run_shared_producers(4, 8, 1'000'000, 3, 2'000);  // stopped while producers wait for slots
}

TEST(slot_ring, to_string_names) {
  EXPECT_EQ(ferry::to_string(slot_state::free), "free");
  EXPECT_EQ(ferry::to_string(slot_state::in_flight), "in_flight");
  EXPECT_EQ(ferry::to_string(slot_state::ready), "ready");
  EXPECT_EQ(ferry::to_string(slot_state::in_use), "in_use");
  EXPECT_EQ(ferry::to_string(delivery::in_order), "in_order");
  EXPECT_EQ(ferry::to_string(delivery::as_completed), "as_completed");
  EXPECT_EQ(ferry::to_string(placement::first_freed), "first_freed");
  EXPECT_EQ(ferry::to_string(placement::rotating), "rotating");
}

}  // namespace
