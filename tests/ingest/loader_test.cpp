// The loader on every backend of FERRY_TEST_BACKENDS: every byte checked, order whatever the worker
// timing, workers cooperating on one batch, back-pressure, epochs, errors, and shutdown under load.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <future>
#include <mutex>
#include <set>
#include <stdexcept>
#include <thread>
#include <vector>

#include "ferry/core/error.hpp"
#include "ferry/ingest/ingest.hpp"
#include "ingest_test_support.hpp"

namespace ferry::ingest {
namespace {

using namespace std::chrono_literals;
using namespace ferry::ingest::testing;

using ferry::testing::gate;

const stage_snapshot* find_stage(const std::vector<stage_snapshot>& s, std::string_view name) {
  for (const auto& st : s) {
    if (st.name == name) return &st;
  }
  return nullptr;
}

// A few microseconds of jitter per sample, seeded by the sample, so workers finish out of order.
void jitter(const sample& s) {
  if (s.seed % 3 == 0) std::this_thread::sleep_for(std::chrono::microseconds(s.seed % 200));
}

class ingest_loader : public on_backend {};

TEST_P(ingest_loader, three_shuffled_epochs_arrive_intact_in_order_each_a_permutation) {
  with_watchdog(60s, [&] {
    const auto opts = small_options(101, 3, true, false);  // 13 batches, the last of 5 samples
    std::atomic<std::uint64_t> bad_seeds{0};
    const std::uint64_t root = opts.seed;
    loader l(dev(), opts, [&](const sample& s, sample_fields out) {
      if (s.seed != sample_seed(root, s.epoch, s.index)) bad_seeds.fetch_add(1);
      jitter(s);
      pattern_fill(s, out);
    });
    const std::size_t per_epoch = l.batches().batches_per_epoch();
    ASSERT_EQ(per_epoch, 13U);
    std::vector<std::vector<std::uint64_t>> seen(3);
    std::uint64_t expected = 0;
    while (auto b = l.next()) {
      ASSERT_EQ(b->epoch * per_epoch + b->batch, expected) << "out of order";
      ASSERT_EQ(b->samples, l.batches().batch_samples(static_cast<std::size_t>(b->batch)));
      const std::string bad = check_batch(l, b->epoch, b->batch, b->samples, [&](std::size_t f) {
        return std::span<const std::byte>(b->field(f));
      });
      ASSERT_EQ(bad, "");
      for (std::size_t j = 0; j < b->samples; ++j) {
        seen[b->epoch].push_back(l.batches().index(b->epoch, static_cast<std::size_t>(b->batch), j));
      }
      l.release(*b);
      ++expected;
    }
    EXPECT_EQ(expected, 3 * per_epoch);
    EXPECT_TRUE(l.done());
    EXPECT_EQ(bad_seeds.load(), 0U);
    for (auto& e : seen) {
      std::sort(e.begin(), e.end());
      ASSERT_EQ(e.size(), 101U);
      for (std::uint64_t i = 0; i < 101; ++i) ASSERT_EQ(e[i], i) << "not a permutation";
    }
    const loader_stats st = l.stats();
    ASSERT_NE(find_stage(st.stages, "fill"), nullptr);
    EXPECT_EQ(find_stage(st.stages, "fill")->count, 3 * 101U);
    EXPECT_EQ(find_stage(st.stages, "fill_cpu")->count, 3 * 101U);
    EXPECT_EQ(find_stage(st.stages, "fill")->bytes, 3 * 101U * (3 * 1024 + 8));
    EXPECT_GT(find_stage(st.stages, "fill_cpu")->total_ns, 0U);
    EXPECT_EQ(st.samples, 3 * 101U);
    EXPECT_EQ(st.bytes, 3 * 101U * (3 * 1024 + 8));
  });
}

TEST_P(ingest_loader, workers_cooperate_on_one_batch_and_never_run_more_than_slots_ahead) {
  with_watchdog(60s, [&] {
    auto opts = small_options(64, 1, false, true);
    opts.workers = 4;
    opts.slots = 2;
    std::mutex mu;
    std::vector<std::set<std::size_t>> workers_of(8);
    std::atomic<std::uint64_t> filled{0};
    loader l(dev(), opts, [&](const sample& s, sample_fields out) {
      std::this_thread::sleep_for(1ms);
      pattern_fill(s, out);
      {
        const std::lock_guard lock(mu);
        workers_of[s.batch].insert(s.worker);
      }
      filled.fetch_add(1);
    });
    // Nothing released: the workers fill the two slots and stop.
    auto first = l.next();
    ASSERT_TRUE(first.has_value());
    auto second = l.next();
    ASSERT_TRUE(second.has_value());
    std::this_thread::sleep_for(50ms);
    EXPECT_EQ(filled.load(), 16U) << "workers ran ahead of the free slots";
    EXPECT_FALSE(l.try_next().has_value());
    l.release(*first);
    l.release(*second);
    std::uint64_t n = 2;
    while (auto b = l.next()) {
      EXPECT_EQ(b->batch, n++);
      l.release(*b);
    }
    EXPECT_EQ(n, 8U);
    const std::size_t cooperating = static_cast<std::size_t>(
        std::count_if(workers_of.begin(), workers_of.end(), [](const auto& w) { return w.size() > 1; }));
    EXPECT_GE(cooperating, 4U) << "batches were filled by one worker each";
  });
}

TEST_P(ingest_loader, try_next_returns_nullopt_while_nothing_is_ready) {
  with_watchdog(60s, [&] {
    gate g;
    loader l(dev(), small_options(32, 1, false, true), [&](const sample& s, sample_fields out) {
      g.pass();
      pattern_fill(s, out);
    });
    EXPECT_FALSE(l.try_next().has_value());
    EXPECT_FALSE(l.done());
    g.open();
    std::uint64_t n = 0;
    while (!l.done()) {
      if (auto b = l.try_next()) {
        EXPECT_EQ(b->batch, n++);
        l.release(*b);
      } else {
        std::this_thread::sleep_for(100us);
      }
    }
    EXPECT_EQ(n, 4U);
    EXPECT_FALSE(l.try_next().has_value());
    EXPECT_FALSE(l.next().has_value());
  });
}

TEST_P(ingest_loader, a_fill_error_reaches_the_consumer_and_every_worker_stops) {
  with_watchdog(60s, [&] {
    auto opts = small_options(256, 0, true, true);
    opts.workers = 4;
    std::atomic<std::uint64_t> calls{0};
    std::atomic<std::uint64_t> after{0};
    std::atomic<bool> caught{false};
    {
      loader l(dev(), opts, [&](const sample& s, sample_fields out) {
        if (caught.load()) after.fetch_add(1);
        if (calls.fetch_add(1) == 45) {
          throw std::runtime_error("bad sample 45");
        }
        pattern_fill(s, out);
      });
      std::string message;
      try {
        for (;;) {
          auto b = l.next();
          ASSERT_TRUE(b.has_value());
          l.release(*b);
        }
      } catch (const std::runtime_error& e) {
        message = e.what();
        caught.store(true);
      }
      EXPECT_EQ(message, "bad sample 45");
      EXPECT_THROW((void)l.try_next(), std::runtime_error);  // the error stays
    }
    // Once the error reached the consumer, a worker past its stop check may start one last fill; none
    // starts another.
    EXPECT_LE(after.load(), opts.workers);
  });
}

TEST_P(ingest_loader, close_and_destruction_mid_epoch_join_blocked_workers_and_consumer) {
  with_watchdog(60s, [&] {
    // Workers blocked on slots (nothing released), then closed.
    {
      loader l(dev(), small_options(1000, 0, false, true), pattern_fill);
      auto b = l.next();
      ASSERT_TRUE(b.has_value());
      std::this_thread::sleep_for(20ms);
      l.close();
      EXPECT_THROW((void)l.next(), stopped_error);
      l.release(*b);  // after close: accepted, ignored
      l.close();      // idempotent
    }
    // Destroyed with workers blocked, nothing taken.
    {
      loader l(dev(), small_options(1000, 0, false, true), pattern_fill);
      std::this_thread::sleep_for(10ms);
    }
    // A consumer blocked in next() on another thread while every worker is blocked in a fill.
    {
      gate g;
      loader l(dev(), small_options(1000, 0, false, true), [&](const sample& s, sample_fields out) {
        g.pass();
        pattern_fill(s, out);
      });
      auto consumer = std::async(std::launch::async, [&] {
        try {
          (void)l.next();
          return std::string("returned");
        } catch (const stopped_error&) {
          return std::string("stopped");
        }
      });
      std::this_thread::sleep_for(20ms);
      // A fill cannot be interrupted: close wakes the consumer at once and joins each worker when its
      // fill returns (the gate opens while close waits).
      auto opener = std::async(std::launch::async, [&] {
        std::this_thread::sleep_for(30ms);
        g.open();
      });
      l.close();
      EXPECT_EQ(consumer.get(), "stopped");
      opener.get();
    }
  });
}

TEST_P(ingest_loader, release_checks_its_batch) {
  loader l(dev(), small_options(32, 1, false, true), pattern_fill);
  auto b = l.next();
  ASSERT_TRUE(b.has_value());
  l.release(*b);
  EXPECT_MESSAGE_HAS(message_of<logic_error>([&] { l.release(*b); }), "not lent out");
}

TEST_P(ingest_loader, bad_options_name_the_value) {
  const auto fill = [](const sample&, sample_fields) {};
  auto o = small_options(32, 1, false, true);
  o.workers = 0;
  EXPECT_MESSAGE_HAS(message_of<logic_error>([&] { loader l(dev(), o, fill); }), "workers is 0");
  o = small_options(32, 1, false, true);
  o.slots = 0;
  EXPECT_MESSAGE_HAS(message_of<logic_error>([&] { loader l(dev(), o, fill); }), "slots is 0");
  o = small_options(32, 1, false, true);
  o.fields[1].sample_bytes = 0;
  EXPECT_MESSAGE_HAS(message_of<logic_error>([&] { loader l(dev(), o, fill); }), "fields[1] ('label')");
  o = small_options(32, 1, false, true);
  o.fields.clear();
  EXPECT_MESSAGE_HAS(message_of<logic_error>([&] { loader l(dev(), o, fill); }), "fields is empty");
  o = small_options(32, 1, false, true);
  EXPECT_MESSAGE_HAS(message_of<logic_error>([&] { loader l(dev(), o, fill_fn{}); }), "empty fill");
  o.sampling.batch_size = 0;
  EXPECT_MESSAGE_HAS(message_of<logic_error>([&] { loader l(dev(), o, fill); }), "batch_size is 0");
}

TEST_P(ingest_loader, slots_are_laid_out_aligned) {
  loader l(dev(), small_options(32, 1, false, true), pattern_fill);
  EXPECT_EQ(l.field_offset(0), 0U);
  EXPECT_EQ(l.field_offset(1), 8U * 3 * 1024);
  EXPECT_EQ(l.batch_bytes(), 8U * (3 * 1024 + 8));
  auto b = l.next();
  ASSERT_TRUE(b.has_value());
  for (std::size_t f = 0; f < 2; ++f) {
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(b->field(f).data()) % 256, 0U);
    EXPECT_EQ(b->view(f).kind, memory_kind::pinned);
  }
  EXPECT_GE(l.stats().pin_seconds, 0.0);
  EXPECT_GT(l.stats().pinned_bytes, 0U);
  l.release(*b);
}

INSTANTIATE_TEST_SUITE_P(backends, ingest_loader, ::testing::ValuesIn(backends_under_test()),
                         backend_test_name);

}  // namespace
}  // namespace ferry::ingest
