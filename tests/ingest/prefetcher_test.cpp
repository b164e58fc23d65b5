// The prefetcher on every backend of FERRY_TEST_BACKENDS: every byte that reaches the device checked
// after a slow consumer read it back, order over epochs, no device or pinned slot reused before its event,
// the range-for, errors, and shutdown under load.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <future>
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

const stage_snapshot* find_stage(const std::vector<stage_snapshot>& s, std::string_view name) {
  for (const auto& st : s) {
    if (st.name == name) return &st;
  }
  return nullptr;
}

// The consumer side of a test: reads every device batch back into pinned memory on its own stream after
// a spin (a slow consumer: a slot the prefetcher refilled before the release event would be overwritten
// before the read), releases the batch, then checks every byte.
class reader {
 public:
  reader(device& dev, const loader& l) : dev_(dev), l_(l), s_(dev.make_stream()) {
    for (const auto& f : l.options().fields)
      back_.push_back(dev.alloc_pinned(f.sample_bytes * l.options().sampling.batch_size));
  }
  stream_view consumer() const { return s_.view(); }

  // Reads `b` back after `spin`, releasing it on the consumer; returns the first mismatch or "".
  std::string read(prefetcher& p, const device_batch& b, std::chrono::microseconds spin,
                   bool release = true) {
    dev_.spin_async(spin, s_);
    std::vector<std::size_t> bytes;
    for (std::size_t f = 0; f < back_.size(); ++f) {
      dev_.copy_async(back_[f], b.field(f), s_);
      bytes.push_back(b.field(f).bytes);
    }
    // Released as soon as the read is queued, before it ran: the slot must not be refilled before then.
    if (release) p.release(b, s_);
    s_.synchronize();
    return check_batch(l_, b.epoch, b.batch, b.samples, [&](std::size_t f) {
      return std::span<const std::byte>(back_[f].host_bytes(), bytes[f]);
    });
  }

 private:
  device& dev_;
  const loader& l_;
  stream s_;
  std::vector<buffer> back_;
};

class ingest_prefetcher : public on_backend {};

TEST_P(ingest_prefetcher, three_epochs_reach_the_device_intact_in_order_past_a_slow_consumer) {
  with_watchdog(60s, [&] {
    const auto opts = small_options(45, 3, true, false);  // 6 batches per epoch, the last of 5 samples
    loader l(dev(), opts, pattern_fill);
    prefetcher p(dev(), l, {.depth = 2});
    reader r(dev(), l);
    const std::size_t per_epoch = l.batches().batches_per_epoch();
    std::vector<std::vector<std::uint64_t>> seen(3);
    std::uint64_t expected = 0;
    while (auto b = p.next(r.consumer())) {
      ASSERT_EQ(b->epoch * per_epoch + b->batch, expected) << "out of order";
      ASSERT_EQ(r.read(p, *b, 3ms), "");
      for (std::size_t j = 0; j < b->samples; ++j) {
        seen[b->epoch].push_back(l.batches().index(b->epoch, static_cast<std::size_t>(b->batch), j));
      }
      ++expected;
    }
    EXPECT_EQ(expected, 3 * per_epoch);
    for (auto& e : seen) {
      std::sort(e.begin(), e.end());
      ASSERT_EQ(e.size(), 45U);
      for (std::uint64_t i = 0; i < 45; ++i) ASSERT_EQ(e[i], i);
    }
    p.close();
    const prefetch_stats st = p.stats();
    ASSERT_NE(find_stage(st.stages, "copy"), nullptr);
    EXPECT_EQ(find_stage(st.stages, "copy")->count, 3 * per_epoch);
    EXPECT_EQ(find_stage(st.stages, "copy")->bytes, 3 * 45U * (3 * 1024 + 8));
    EXPECT_EQ(st.batches, 3 * per_epoch);
    EXPECT_EQ(st.bytes, 3 * 45U * (3 * 1024 + 8));
    EXPECT_GT(st.copy_seconds, 0.0);
    EXPECT_GT(st.h2d_gbps, 0.0);
  });
}

// A slow link and fast fills: a pinned slot handed back to the loader before its copy completed would be
// refilled under the copy, and the device would get bytes of a later batch.
TEST_P(ingest_prefetcher, pinned_slots_are_refilled_only_after_their_copy_completed) {
  with_watchdog(60s, [&] {
    auto slow =
        GetParam() == backend::host ? make_device_under_test(backend::host, 0.05) : make_cuda_device(0);
    auto opts = small_options(64, 2, false, true);
    opts.slots = 2;
    opts.workers = 2;
    loader l(*slow, opts, pattern_fill);
    prefetcher p(*slow, l, {.depth = 3});
    reader r(*slow, l);
    std::uint64_t n = 0;
    while (auto b = p.next(r.consumer())) {
      ASSERT_EQ(r.read(p, *b, 0us), "") << "batch " << n;
      ++n;
    }
    EXPECT_EQ(n, 16U);
  });
}

// A consumer whose compute is the bottleneck and that releases each batch as soon as its work is queued
// (the range-for) runs ahead of the device, so the copy of a batch waits on the device behind the
// consumer's compute. The copier must not wait for such copies (to read their times, say): on the cuda
// backend that wait busy-spins a core for most of every step.
TEST_P(ingest_prefetcher, the_copier_never_waits_for_the_device_behind_a_compute_bound_consumer) {
  with_watchdog(60s, [&] {
    auto opts = small_options(96, 1, false, true);  // 12 batches of 8
    opts.slots = 3;
    opts.workers = 2;
    loader l(dev(), opts, pattern_fill);
    prefetcher p(dev(), l, {.depth = 2});
    stream compute = dev().make_stream();
    buffer sums = dev().alloc_device(8 * 12);
    std::uint64_t n = 0;
    for (device_batch& b : p.batches(compute)) {
      dev().spin_async(4ms, compute);
      dev().checksum_async(b.field(0), sums.view(8 * n, 8), compute);
      ++n;
    }
    compute.synchronize();
    EXPECT_EQ(n, 12U);
    p.close();
    const prefetch_stats st = p.stats();
    EXPECT_EQ(st.batches, 12U);
    EXPECT_EQ(st.copier_waits, 0U) << "the copier waited for copies queued behind the consumer's compute";
    // Every copy was delivered intact: the device checksums match the pattern of every batch.
    buffer back = dev().alloc_pageable(sums.size());
    dev().copy(back, sums, compute);
    for (std::uint64_t g = 0; g < n; ++g) {
      std::uint64_t got = 0;
      std::memcpy(&got, back.host_bytes() + 8 * g, 8);
      std::uint64_t want = 0;
      const std::size_t sb = opts.fields[0].sample_bytes;
      for (std::size_t j = 0; j < 8; ++j) {
        const std::uint64_t seed = field_seed(sample_seed(opts.seed, 0, l.batches().index(0, g, j)), 0);
        want += pattern_checksum(seed, sb, j * sb / 8);
      }
      EXPECT_EQ(got, want) << "batch " << g;
    }
  });
}

TEST_P(ingest_prefetcher, range_for_releases_each_batch_and_an_early_break_releases_the_last) {
  with_watchdog(60s, [&] {
    loader l(dev(), small_options(80, 1, false, true), pattern_fill);  // 10 batches
    prefetcher p(dev(), l, {.depth = 1});
    reader r(dev(), l);
    std::uint64_t n = 0;
    for (device_batch& b : p.batches(r.consumer())) {
      EXPECT_EQ(b.batch, n);
      EXPECT_EQ(r.read(p, b, 1ms, false), "");
      if (++n == 4) break;
    }
    // With depth 1 the next batch can only be copied once the range released batch 3.
    for (device_batch& b : p.batches(r.consumer())) {
      EXPECT_EQ(b.batch, n);
      EXPECT_EQ(r.read(p, b, 1ms, false), "");
      ++n;
    }
    EXPECT_EQ(n, 10U);
    EXPECT_FALSE(p.next(r.consumer()).has_value());
  });
}

TEST_P(ingest_prefetcher, a_fill_error_reaches_next_and_everything_joins) {
  with_watchdog(60s, [&] {
    std::atomic<std::uint64_t> calls{0};
    loader l(dev(), small_options(1000, 0, true, true), [&](const sample& s, sample_fields out) {
      if (calls.fetch_add(1) == 77) throw std::runtime_error("fill failed at sample 77");
      pattern_fill(s, out);
    });
    prefetcher p(dev(), l, {.depth = 2});
    reader r(dev(), l);
    std::string message;
    try {
      for (;;) {
        auto b = p.next(r.consumer());
        ASSERT_TRUE(b.has_value());
        ASSERT_EQ(r.read(p, *b, 0us), "");
      }
    } catch (const std::runtime_error& e) {
      message = e.what();
    }
    EXPECT_EQ(message, "fill failed at sample 77");
    EXPECT_THROW((void)p.next(r.consumer()), std::runtime_error);
  });
}

TEST_P(ingest_prefetcher, close_and_destruction_mid_epoch_do_not_deadlock) {
  with_watchdog(60s, [&] {
    // Consumer holds every device slot; copier blocked on a slot, workers blocked on pinned slots.
    {
      loader l(dev(), small_options(1000, 0, false, true), pattern_fill);
      prefetcher p(dev(), l, {.depth = 2});
      const stream s = dev().make_stream();
      auto a = p.next(s);
      auto b = p.next(s);
      ASSERT_TRUE(a && b);
      std::this_thread::sleep_for(20ms);
      p.release(*a, s);
    }  // destroyed with b still lent
    // A consumer blocked in next() on another thread (the fill is slow), closed from this one.
    {
      loader l(dev(), small_options(1000, 0, false, true), [](const sample& s, sample_fields out) {
        std::this_thread::sleep_for(5ms);
        pattern_fill(s, out);
      });
      prefetcher p(dev(), l, {.depth = 2});
      const stream s = dev().make_stream();
      auto consumer = std::async(std::launch::async, [&] {
        try {
          (void)p.next(s);
          return std::string("returned");
        } catch (const stopped_error&) {
          return std::string("stopped");
        }
      });
      std::this_thread::sleep_for(5ms);
      p.close();
      const std::string got = consumer.get();
      EXPECT_TRUE(got == "stopped" || got == "returned") << got;
      EXPECT_THROW((void)p.next(s), stopped_error);
      EXPECT_THROW((void)l.next(), stopped_error);  // close closes the loader
      p.close();
    }
    // The loader closed under the prefetcher: the consumer hears of it instead of waiting forever.
    {
      loader l(dev(), small_options(1000, 0, false, true), pattern_fill);
      prefetcher p(dev(), l, {.depth = 2});
      const stream s = dev().make_stream();
      auto b = p.next(s);
      ASSERT_TRUE(b.has_value());
      p.release(*b, s);
      l.close();
      EXPECT_THROW(
          {
            for (;;) {
              auto c = p.next(s);
              ASSERT_TRUE(c.has_value());
              p.release(*c, s);
            }
          },
          stopped_error);
      s.synchronize();
    }
    // Destroyed right after construction, while the copier is busy.
    {
      loader l(dev(), small_options(1000, 0, false, true), pattern_fill);
      prefetcher p(dev(), l, {.depth = 3});
    }
  });
}

TEST_P(ingest_prefetcher, release_checks_its_batch_and_depth_zero_is_refused) {
  loader l(dev(), small_options(32, 1, false, true), pattern_fill);
  EXPECT_MESSAGE_HAS(message_of<logic_error>([&] { prefetcher p(dev(), l, {.depth = 0}); }), "depth is 0");
  prefetcher p(dev(), l, {.depth = 2});
  const stream s = dev().make_stream();
  auto b = p.next(s);
  ASSERT_TRUE(b.has_value());
  EXPECT_THROW((void)b->field(2), logic_error);
  p.release(*b, s);
  EXPECT_MESSAGE_HAS(message_of<logic_error>([&] { p.release(*b, s); }), "not lent out");
  s.synchronize();
}

INSTANTIATE_TEST_SUITE_P(backends, ingest_prefetcher, ::testing::ValuesIn(backends_under_test()),
                         backend_test_name);

}  // namespace
}  // namespace ferry::ingest
