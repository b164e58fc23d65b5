// The egress pipeline on every backend of FERRY_TEST_BACKENDS: every delivered byte checked, ordering,
// back-pressure, bounded pinned memory, errors of sinks and of the device, and shutdown under load.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <future>
#include <memory>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "egress_test_support.hpp"
#include "ferry/core/error.hpp"
#include "ferry/core/units.hpp"
#include "ferry/device/device.hpp"
#include "ferry/egress/egress.hpp"

namespace ferry::egress {
namespace {

using namespace std::chrono_literals;
using namespace ferry::egress::testing;
using steady = std::chrono::steady_clock;

double ms_since(steady::time_point t0) {
  return std::chrono::duration<double, std::milli>(steady::now() - t0).count();
}

// Waits up to `limit` for `pred`; true when it held.
template <class Pred>
bool eventually(Pred pred, std::chrono::milliseconds limit = 60s) {
  const auto until = steady::now() + limit;
  while (!pred()) {
    if (steady::now() > until) return false;
    std::this_thread::sleep_for(1ms);
  }
  return true;
}

const stage_snapshot* find_stage(const pipeline_stats& s, std::string_view name) {
  for (const auto& st : s.stages) {
    if (st.name == name) return &st;
  }
  return nullptr;
}

using ferry::testing::gate;

// A device buffer of `bytes` bytes set to `value` on `s`, complete on return: submitted again and again
// by tests that do not check contents, since it is never written again.
buffer constant_output(device& dev, std::size_t bytes, std::uint8_t value, stream_view s) {
  buffer b = dev.alloc_device(bytes);
  dev.memset_async(b, value, s);
  s.synchronize();
  return b;
}

// Sizes of the many-outputs tests: 4 KiB to 64 KiB, not all multiples of 8, most larger than a 32 KiB slot.
std::size_t output_size(std::size_t i) { return 4 * KiB + (i * 7919) % (60 * KiB) + i % 7; }
constexpr std::size_t max_output_size = 64 * KiB + 8;

class egress_pipeline : public on_backend {};

TEST_P(egress_pipeline, ten_thousand_outputs_arrive_intact_and_in_submission_order) {
  with_watchdog(240s, [&] {
    constexpr std::size_t n = 10000;
    options opts;
    opts.slot_bytes = 32 * KiB;
    opts.slots = 4;
    opts.sink_workers = 1;
    opts.order = delivery::in_order;

    auto sums = std::make_shared<checksum_sink>();
    // Written by the one worker only; read after close() joined it.
    std::vector<std::pair<std::uint64_t, std::uint32_t>> order;
    order.reserve(3 * n);
    std::uint64_t wrong_tags = 0;
    auto sink = std::make_shared<callback_sink>([&](const output_chunk& d) {
      sums->consume(d);
      order.emplace_back(d.sequence, d.chunk);
      if (d.tag != d.sequence + 1000) ++wrong_tags;
    });

    std::vector<std::uint64_t> expected(n);
    std::vector<std::pair<std::uint64_t, std::uint32_t>> expected_order;
    expected_order.reserve(3 * n);
    std::uint64_t total_bytes = 0;
    producer prod(dev(), 3, max_output_size);
    pipeline pipe(dev(), sink, opts);
    for (std::size_t i = 0; i < n; ++i) {
      const std::size_t bytes = output_size(i);
      const auto out = prod.next(bytes, i);
      expected[i] = out.checksum;
      total_bytes += bytes;
      const std::size_t chunks = (bytes + opts.slot_bytes - 1) / opts.slot_bytes;
      for (std::size_t c = 0; c < chunks; ++c) expected_order.emplace_back(i, static_cast<std::uint32_t>(c));
      prod.copied(out.buffer, pipe.submit(out.view, prod.producer_stream(), i + 1000));
    }
    pipe.close();

    std::size_t mismatches = 0;
    for (std::size_t i = 0; i < n; ++i) mismatches += sums->checksum(i + 1000) != expected[i] ? 1 : 0;
    EXPECT_EQ(mismatches, 0u);
    EXPECT_EQ(sums->completed(), n);
    EXPECT_EQ(wrong_tags, 0u);
    EXPECT_TRUE(order == expected_order) << "consume was not called in submission order";

    const pipeline_stats s = pipe.stats();
    EXPECT_EQ(s.outputs, n);
    EXPECT_EQ(s.deliveries, expected_order.size());
    EXPECT_EQ(s.bytes, total_bytes);
    EXPECT_EQ(s.dropped, 0u);
    EXPECT_EQ(s.pinned_bytes, opts.slots * opts.slot_bytes);
    EXPECT_GT(s.pin_seconds, 0.0);
    EXPECT_GT(s.copy_seconds, 0.0);
    EXPECT_GT(s.d2h_gbps, 0.0);
    const stage_snapshot* wait = find_stage(s, "wait_slot");
    const stage_snapshot* copy = find_stage(s, "copy");
    const stage_snapshot* consume = find_stage(s, "sink");
    ASSERT_TRUE(wait != nullptr && copy != nullptr && consume != nullptr);
    EXPECT_EQ(wait->count, n);
    EXPECT_EQ(wait->bytes, total_bytes);
    EXPECT_EQ(copy->count, expected_order.size());
    EXPECT_EQ(copy->bytes, total_bytes);
    EXPECT_EQ(consume->count, expected_order.size());
    EXPECT_EQ(consume->bytes, total_bytes);
    EXPECT_EQ(pipe.free_slots(), opts.slots);
  });
}

TEST_P(egress_pipeline, outputs_from_two_threads_arrive_exactly_once_as_completed) {
  with_watchdog(240s, [&] {
    constexpr std::size_t per_thread = 2500;
    constexpr std::size_t threads = 2;
    options opts;
    opts.slot_bytes = 32 * KiB;
    opts.slots = 5;
    opts.sink_workers = 3;
    opts.order = delivery::as_completed;

    auto sums = std::make_shared<checksum_sink>();
    std::mutex seen_mu;
    std::vector<std::uint32_t> chunk_mask(threads * per_thread, 0);  // by tag: chunks delivered
    std::vector<std::uint32_t> sequences(threads * per_thread, 0);   // by sequence: deliveries seen
    std::uint64_t duplicates = 0;
    auto sink = std::make_shared<callback_sink>([&](const output_chunk& d) {
      sums->consume(d);
      const std::lock_guard lock(seen_mu);
      const std::uint32_t bit = 1u << d.chunk;
      if ((chunk_mask.at(d.tag) & bit) != 0) ++duplicates;
      chunk_mask.at(d.tag) |= bit;
      if (d.chunk == 0) ++sequences.at(d.sequence);
    });

    std::vector<std::uint64_t> expected(threads * per_thread);
    std::vector<std::uint32_t> chunks_of(threads * per_thread);
    pipeline pipe(dev(), sink, opts);
    std::vector<std::future<void>> submitters;
    for (std::size_t t = 0; t < threads; ++t) {
      submitters.push_back(std::async(std::launch::async, [&, t] {
        producer prod(dev(), 3, max_output_size);
        for (std::size_t i = 0; i < per_thread; ++i) {
          const std::size_t tag = t * per_thread + i;
          const std::size_t bytes = output_size(tag * 3 + t);
          const auto out = prod.next(bytes, tag);
          expected[tag] = out.checksum;
          chunks_of[tag] = static_cast<std::uint32_t>((bytes + opts.slot_bytes - 1) / opts.slot_bytes);
          prod.copied(out.buffer, pipe.submit(out.view, prod.producer_stream(), tag));
        }
        // The producer's buffers must outlive the copies out of them.
        pipe.flush();
      }));
    }
    for (auto& f : submitters) f.get();
    pipe.close();

    std::size_t mismatches = 0;
    std::size_t incomplete = 0;
    for (std::size_t tag = 0; tag < expected.size(); ++tag) {
      incomplete += chunk_mask[tag] != (1u << chunks_of[tag]) - 1 ? 1 : 0;
      mismatches += sums->checksum(tag) != expected[tag] ? 1 : 0;
    }
    EXPECT_EQ(duplicates, 0u);
    EXPECT_EQ(incomplete, 0u);
    EXPECT_EQ(mismatches, 0u);
    EXPECT_TRUE(std::all_of(sequences.begin(), sequences.end(), [](std::uint32_t n) { return n == 1; }))
        << "every sequence number 0.." << expected.size() - 1 << " must be delivered once";
    EXPECT_EQ(pipe.stats().outputs, expected.size());
    EXPECT_EQ(pipe.free_slots(), opts.slots);
  });
}

TEST_P(egress_pipeline, a_slow_sink_blocks_submit_and_pinned_memory_stays_bounded) {
  with_watchdog(120s, [&] {
    constexpr std::size_t n = 60;
    constexpr auto sink_time = 5ms;
    options opts;
    opts.slot_bytes = 4 * KiB;
    opts.slots = 4;
    opts.sink_workers = 2;
    const std::uint64_t pool = opts.slots * opts.slot_bytes;

    std::atomic<std::uint64_t> pinned_violations{0};
    std::atomic<std::uint64_t> consumed{0};
    std::atomic<int> in_sink{0};
    std::atomic<int> max_in_sink{0};
    auto sink = std::make_shared<callback_sink>([&](const output_chunk&) {
      if (dev().pinned().bytes != pool) pinned_violations.fetch_add(1);
      const int now_in = in_sink.fetch_add(1) + 1;
      for (int seen = max_in_sink.load();
           now_in > seen && !max_in_sink.compare_exchange_weak(seen, now_in);) {
      }
      std::this_thread::sleep_for(sink_time);
      in_sink.fetch_sub(1);
      consumed.fetch_add(1);
    });
    stream s = dev().make_stream();
    const buffer out = constant_output(dev(), opts.slot_bytes, 7, s);
    pipeline pipe(dev(), sink, opts);
    EXPECT_EQ(dev().pinned().bytes, pool);

    const auto t0 = steady::now();
    for (std::size_t i = 0; i < n; ++i) {
      static_cast<void>(pipe.submit(out, s, i));
      if (dev().pinned().bytes != pool) pinned_violations.fetch_add(1);
    }
    const double submit_ms = ms_since(t0);
    pipe.flush();
    const double total_ms = ms_since(t0);

    // Output i needs a slot freed by consume number i - slots + 1, and two workers finish consumes no
    // faster than two per sink_time.
    const double sink_ms = std::chrono::duration<double, std::milli>(sink_time).count();
    const double blocked_ms =
        static_cast<double>(n - opts.slots) * sink_ms / static_cast<double>(opts.sink_workers);
    // Lower bounds only: the sinks' sleeps make them hold on any machine, while how much longer a busy
    // machine takes is not the pipeline's behaviour.
    EXPECT_GE(submit_ms, 0.95 * blocked_ms) << "submit did not wait for slots";
    const double sink_rate = static_cast<double>(opts.sink_workers) / sink_ms;  // deliveries per ms
    const double rate = static_cast<double>(n) / total_ms;
    EXPECT_LE(rate, sink_rate * 1.02);
    EXPECT_LE(max_in_sink.load(), static_cast<int>(opts.sink_workers));
    EXPECT_EQ(consumed.load(), n);
    EXPECT_EQ(pinned_violations.load(), 0u);
    EXPECT_EQ(dev().pinned().peak_bytes, pool);
    const pipeline_stats st = pipe.stats();
    const stage_snapshot* wait = find_stage(st, "wait_slot");
    ASSERT_NE(wait, nullptr);
    EXPECT_LE(static_cast<double>(wait->total_ns) / 1e6, submit_ms) << "waits counted outside submit";
    pipe.close();
  });
}

// A sink that records the sequences it consumed and throws at one of them.
struct failing_sink {
  explicit failing_sink(std::uint64_t fail_at) : fail_at_(fail_at) {}
  std::shared_ptr<callback_sink> make() {
    return std::make_shared<callback_sink>([this](const output_chunk& d) {
      if (d.sequence == fail_at_)
        throw std::runtime_error("sink failed at sequence " + std::to_string(fail_at_));
      const std::lock_guard lock(mu);
      seen.push_back(d.sequence);
    });
  }
  std::vector<std::uint64_t> sorted_seen() {
    const std::lock_guard lock(mu);
    std::vector<std::uint64_t> out = seen;
    std::sort(out.begin(), out.end());
    return out;
  }
  std::uint64_t fail_at_;
  std::mutex mu;
  std::vector<std::uint64_t> seen;
};

TEST_P(egress_pipeline, a_sink_error_surfaces_at_the_next_submit_and_the_pool_returns_to_full) {
  with_watchdog(60s, [&] {
    constexpr std::uint64_t k = 10;
    options opts;
    opts.slot_bytes = 4 * KiB;
    opts.slots = 4;
    opts.sink_workers = 1;
    failing_sink recorder(k);
    stream s = dev().make_stream();
    const buffer out = constant_output(dev(), opts.slot_bytes, 3, s);
    pipeline pipe(dev(), recorder.make(), opts);

    std::uint64_t submitted = 0;
    const std::string message = message_of<std::runtime_error>([&] {
      for (; submitted < 1000; ++submitted) static_cast<void>(pipe.submit(out, s, submitted));
    });
    EXPECT_MESSAGE_HAS(message, "sink failed at sequence 10");
    EXPECT_GT(submitted, k);
    EXPECT_LT(submitted, 1000u);

    // Without close: every slot comes back, each chunk counted as delivered or dropped.
    EXPECT_TRUE(eventually([&] { return pipe.free_slots() == opts.slots; })) << pipe.free_slots() << " free";
    const pipeline_stats st = pipe.stats();
    EXPECT_EQ(st.deliveries, k);
    EXPECT_EQ(st.deliveries + st.dropped, submitted);

    EXPECT_MESSAGE_HAS(message_of<std::runtime_error>([&] { static_cast<void>(pipe.submit(out, s, 0)); }),
                       "sequence 10");
    EXPECT_MESSAGE_HAS(message_of<std::runtime_error>([&] { static_cast<void>(pipe.try_submit(out, s, 0)); }),
                       "sequence 10");
    EXPECT_MESSAGE_HAS(message_of<std::runtime_error>([&] { pipe.close(); }), "sequence 10");
    EXPECT_MESSAGE_HAS(message_of<std::runtime_error>([&] { pipe.close(); }), "sequence 10");

    std::vector<std::uint64_t> before(k);
    for (std::uint64_t i = 0; i < k; ++i) before[i] = i;
    EXPECT_EQ(recorder.sorted_seen(), before) << "one worker in order consumes exactly the outputs before k";
  });
}

TEST_P(egress_pipeline, with_several_workers_every_output_before_the_failing_one_is_delivered) {
  with_watchdog(60s, [&] {
    constexpr std::uint64_t k = 20;
    options opts;
    opts.slot_bytes = 4 * KiB;
    opts.slots = 6;
    opts.sink_workers = 3;
    opts.order = delivery::in_order;
    failing_sink recorder(k);
    stream s = dev().make_stream();
    const buffer out = constant_output(dev(), opts.slot_bytes, 3, s);
    pipeline pipe(dev(), recorder.make(), opts);

    std::uint64_t submitted = 0;
    EXPECT_MESSAGE_HAS(message_of<std::runtime_error>([&] {
                         for (; submitted < 1000; ++submitted)
                           static_cast<void>(pipe.submit(out, s, submitted));
                       }),
                       "sink failed at sequence 20");
    EXPECT_TRUE(eventually([&] { return pipe.free_slots() == opts.slots; }));
    EXPECT_MESSAGE_HAS(message_of<std::runtime_error>([&] { pipe.close(); }), "sequence 20");

    const std::vector<std::uint64_t> seen = recorder.sorted_seen();
    for (std::uint64_t i = 0; i < k; ++i) EXPECT_TRUE(std::binary_search(seen.begin(), seen.end(), i)) << i;
    EXPECT_FALSE(std::binary_search(seen.begin(), seen.end(), k));
    const pipeline_stats st = pipe.stats();
    EXPECT_EQ(st.deliveries, seen.size());
    EXPECT_EQ(st.deliveries + st.dropped, submitted);
  });
}

TEST_P(egress_pipeline, a_sink_error_surfaces_at_flush) {
  with_watchdog(60s, [&] {
    options opts;
    opts.slot_bytes = 4 * KiB;
    opts.slots = 8;
    opts.sink_workers = 1;
    gate g;
    failing_sink recorder(3);
    auto inner = recorder.make();
    auto sink = std::make_shared<callback_sink>([&](const output_chunk& d) {
      g.pass();
      inner->consume(d);
    });
    stream s = dev().make_stream();
    const buffer out = constant_output(dev(), opts.slot_bytes, 3, s);
    pipeline pipe(dev(), sink, opts);
    for (std::uint64_t i = 0; i < 6; ++i) static_cast<void>(pipe.submit(out, s, i));  // fits in the pool
    g.open();
    EXPECT_MESSAGE_HAS(message_of<std::runtime_error>([&] { pipe.flush(); }), "sink failed at sequence 3");
    EXPECT_TRUE(eventually([&] { return pipe.free_slots() == opts.slots; }));
    EXPECT_EQ(recorder.sorted_seen(), (std::vector<std::uint64_t>{0, 1, 2}));
    const pipeline_stats st = pipe.stats();
    EXPECT_EQ(st.deliveries, 3u);
    EXPECT_EQ(st.dropped, 3u);
    EXPECT_MESSAGE_HAS(message_of<std::runtime_error>([&] { pipe.flush(); }), "sequence 3");
    EXPECT_MESSAGE_HAS(message_of<std::runtime_error>([&] { pipe.close(); }), "sequence 3");
  });
}

TEST_P(egress_pipeline, a_submit_blocked_for_a_slot_wakes_and_throws_when_the_sink_fails) {
  with_watchdog(60s, [&] {
    options opts;
    opts.slot_bytes = 4 * KiB;
    opts.slots = 2;
    opts.sink_workers = 1;
    gate g;
    auto sink = std::make_shared<callback_sink>([&](const output_chunk&) {
      g.pass();
      throw std::runtime_error("sink failed while a submit waited");
    });
    stream s = dev().make_stream();
    const buffer out = constant_output(dev(), opts.slot_bytes, 3, s);
    pipeline pipe(dev(), sink, opts);
    static_cast<void>(pipe.submit(out, s, 0));
    static_cast<void>(pipe.submit(out, s, 1));
    // t0 before the opener starts: the failure comes at least 50 ms after it, however late this thread runs.
    const auto t0 = steady::now();
    std::thread opener([&] {
      std::this_thread::sleep_for(50ms);
      g.open();
    });
    EXPECT_MESSAGE_HAS(message_of<std::runtime_error>([&] { static_cast<void>(pipe.submit(out, s, 2)); }),
                       "sink failed while a submit waited");
    EXPECT_GE(ms_since(t0), 40.0) << "the third submit should have blocked until the failure";
    opener.join();
    EXPECT_TRUE(eventually([&] { return pipe.free_slots() == opts.slots; }));
    const pipeline_stats st = pipe.stats();
    EXPECT_EQ(st.deliveries, 0u);
    EXPECT_EQ(st.dropped, 2u);
    EXPECT_EQ(st.outputs, 2u);
    EXPECT_THROW(pipe.close(), std::runtime_error);
  });
}

TEST_P(egress_pipeline, a_device_error_fails_the_pipeline) {
  with_watchdog(60s, [&] {
    options opts;
    opts.slot_bytes = 4 * KiB;
    opts.slots = 2;
    opts.sink_workers = 1;
    std::atomic<int> consumed{0};
    auto sink = std::make_shared<callback_sink>([&](const output_chunk&) { consumed.fetch_add(1); });
    stream s = dev().make_stream();
    const buffer out = constant_output(dev(), opts.slot_bytes, 3, s);
    pipeline pipe(dev(), sink, opts);
    // An exception in a host callback surfaces at the next synchronize of the device: the completion
    // thread's wait for the copy after it.
    dev().launch_host_func(s,
                           [] { throw std::runtime_error("host callback failed on the producer stream"); });
    static_cast<void>(pipe.submit(out, s, 0));
    EXPECT_MESSAGE_HAS(message_of<std::runtime_error>([&] { pipe.flush(); }), "host callback failed");
    EXPECT_TRUE(eventually([&] { return pipe.free_slots() == opts.slots; }));
    EXPECT_EQ(consumed.load(), 0) << "a slot whose copy wait failed must not be delivered";
    EXPECT_EQ(pipe.stats().dropped, 1u);
    EXPECT_MESSAGE_HAS(message_of<std::runtime_error>([&] { static_cast<void>(pipe.submit(out, s, 1)); }),
                       "host callback failed");
    EXPECT_THROW(pipe.close(), std::runtime_error);
  });
}

TEST_P(egress_pipeline, close_from_another_thread_stops_a_blocked_submit_after_delivering_the_rest) {
  with_watchdog(60s, [&] {
    options opts;
    opts.slot_bytes = 4 * KiB;
    opts.slots = 2;
    opts.sink_workers = 1;
    std::mutex mu;
    std::vector<std::uint64_t> seen;
    auto sink = std::make_shared<callback_sink>([&](const output_chunk& d) {
      std::this_thread::sleep_for(5ms);
      const std::lock_guard lock(mu);
      seen.push_back(d.sequence);
    });
    stream s = dev().make_stream();
    const buffer out = constant_output(dev(), opts.slot_bytes, 3, s);
    pipeline pipe(dev(), sink, opts);

    std::atomic<bool> close_returned{false};
    std::string close_error;
    std::thread closer([&] {
      std::this_thread::sleep_for(50ms);
      try {
        pipe.close();
      } catch (const std::exception& e) {
        close_error = e.what();
      }
      close_returned = true;
    });
    std::uint64_t submitted = 0;
    const std::string message = message_of<stopped_error>([&] {
      for (; submitted < 100000; ++submitted) static_cast<void>(pipe.submit(out, s, submitted));
    });
    closer.join();
    EXPECT_MESSAGE_HAS(message, "closed");
    EXPECT_TRUE(close_returned.load());
    EXPECT_EQ(close_error, "");
    EXPECT_GE(submitted, opts.slots);

    std::vector<std::uint64_t> all(submitted);
    for (std::uint64_t i = 0; i < submitted; ++i) all[i] = i;
    {
      const std::lock_guard lock(mu);
      EXPECT_EQ(seen, all) << "everything submitted before close must be delivered, in order";
    }
    const pipeline_stats st = pipe.stats();
    EXPECT_EQ(st.deliveries, submitted);
    EXPECT_EQ(st.dropped, 0u);
    EXPECT_EQ(pipe.free_slots(), opts.slots);
    EXPECT_THROW(static_cast<void>(pipe.submit(out, s, 0)), stopped_error);
    EXPECT_THROW(static_cast<void>(pipe.try_submit(out, s, 0)), stopped_error);
    EXPECT_THROW(pipe.flush(), stopped_error);
    EXPECT_NO_THROW(pipe.close());
  });
}

TEST_P(egress_pipeline, try_submit_returns_empty_when_full_and_submit_for_times_out) {
  with_watchdog(60s, [&] {
    options opts;
    opts.slot_bytes = 4 * KiB;
    opts.slots = 2;
    opts.sink_workers = 1;
    gate g;
    std::atomic<int> consumed{0};
    auto sink = std::make_shared<callback_sink>([&](const output_chunk&) {
      g.pass();
      consumed.fetch_add(1);
    });
    stream s = dev().make_stream();
    const buffer one = constant_output(dev(), opts.slot_bytes, 1, s);
    const buffer two = constant_output(dev(), 2 * opts.slot_bytes, 2, s);  // two chunks
    pipeline pipe(dev(), sink, opts);

    event first = pipe.try_submit(one, s, 0);
    event second = pipe.try_submit(one, s, 1);
    EXPECT_FALSE(first.empty());
    EXPECT_FALSE(second.empty());
    EXPECT_TRUE(pipe.try_submit(one, s, 2).empty());
    EXPECT_TRUE(pipe.try_submit(two, s, 3).empty());
    const auto t0 = steady::now();
    EXPECT_TRUE(pipe.submit_for(one, s, 4, 30ms).empty());
    EXPECT_GE(ms_since(t0), 29.0);
    // The copies finished even though their slots are still held by the sink.
    first.synchronize();
    second.synchronize();

    g.open();
    pipe.flush();
    EXPECT_EQ(consumed.load(), 2);
    EXPECT_EQ(pipe.free_slots(), opts.slots);
    // An output of two chunks needs both slots at once, which are now free.
    EXPECT_FALSE(pipe.try_submit(two, s, 5).empty());
    EXPECT_FALSE(pipe.submit_for(one, s, 6, 10s).empty());
    pipe.close();
    EXPECT_EQ(consumed.load(), 5);
    EXPECT_EQ(pipe.stats().outputs, 4u);
  });
}

TEST_P(egress_pipeline, an_output_of_ten_chunks_streams_through_three_slots) {
  with_watchdog(60s, [&] {
    options opts;
    opts.slot_bytes = 1 * KiB;
    opts.slots = 3;
    opts.sink_workers = 1;
    const std::size_t bytes = 10 * opts.slot_bytes - 100;
    auto sums = std::make_shared<checksum_sink>();
    std::vector<output_chunk> seen;  // written by the one worker, read after close
    auto sink = std::make_shared<callback_sink>([&](const output_chunk& d) {
      std::this_thread::sleep_for(1ms);  // slower than the copies: submit has to wait for slots
      sums->consume(d);
      seen.push_back(d);
    });
    producer prod(dev(), 1, bytes);
    const auto out = prod.next(bytes, 42);
    pipeline pipe(dev(), sink, opts);
    event copied = pipe.submit(out.view, prod.producer_stream(), 7);
    copied.synchronize();
    pipe.close();

    ASSERT_EQ(seen.size(), 10u);
    for (std::uint32_t c = 0; c < 10; ++c) {
      const output_chunk& d = seen[c];
      EXPECT_EQ(d.chunk, c);
      EXPECT_EQ(d.chunks, 10u);
      EXPECT_EQ(d.offset, std::uint64_t{c} * opts.slot_bytes);
      EXPECT_EQ(d.total_bytes, bytes);
      EXPECT_EQ(d.bytes.size(), c < 9 ? opts.slot_bytes : opts.slot_bytes - 100);
      EXPECT_EQ(d.tag, 7u);
      EXPECT_EQ(d.sequence, 0u);
      EXPECT_EQ(d.last_chunk(), c == 9);
    }
    EXPECT_EQ(sums->checksum(7), out.checksum);
    const pipeline_stats st = pipe.stats();
    ASSERT_NE(find_stage(st, "wait_slot"), nullptr);
    EXPECT_GT(find_stage(st, "wait_slot")->total_ns, 0u);
  });
}

TEST_P(egress_pipeline, outputs_of_more_chunks_than_slots_cannot_be_tried) {
  options opts;
  opts.slot_bytes = 1 * KiB;
  opts.slots = 3;
  opts.sink_workers = 1;
  stream s = dev().make_stream();
  const buffer out = constant_output(dev(), 10 * opts.slot_bytes - 100, 1, s);
  pipeline pipe(dev(), std::make_shared<null_sink>(), opts);
  const std::string tried = message_of<logic_error>([&] { static_cast<void>(pipe.try_submit(out, s, 0)); });
  EXPECT_MESSAGE_HAS(tried, "try_submit");
  EXPECT_MESSAGE_HAS(tried, "10 chunks");
  EXPECT_MESSAGE_HAS(tried, "3 slots");
  EXPECT_MESSAGE_HAS(tried, "1.00 KiB");
  const std::string timed =
      message_of<logic_error>([&] { static_cast<void>(pipe.submit_for(out, s, 0, 1s)); });
  EXPECT_MESSAGE_HAS(timed, "submit_for");
  EXPECT_MESSAGE_HAS(timed, "10 chunks");
  EXPECT_EQ(pipe.stats().outputs, 0u);
  pipe.close();
}

TEST_P(egress_pipeline, bad_options_are_logic_errors_naming_the_value) {
  auto sink = std::make_shared<null_sink>();
  auto message = [&](options o, std::shared_ptr<egress::sink> out) {
    return message_of<logic_error>([&] { pipeline p(dev(), std::move(out), o); });
  };
  options o;
  o.slot_bytes = 4 * KiB;
  options zero_slots = o;
  zero_slots.slots = 0;
  EXPECT_MESSAGE_HAS(message(zero_slots, sink), "slots is 0");
  options zero_bytes = o;
  zero_bytes.slot_bytes = 0;
  EXPECT_MESSAGE_HAS(message(zero_bytes, sink), "slot_bytes is 0");
  options odd_bytes = o;
  odd_bytes.slot_bytes = 1001;
  const std::string odd = message(odd_bytes, sink);
  EXPECT_MESSAGE_HAS(odd, "1001");
  EXPECT_MESSAGE_HAS(odd, "multiple of 8");
  options zero_workers = o;
  zero_workers.sink_workers = 0;
  EXPECT_MESSAGE_HAS(message(zero_workers, sink), "sink_workers is 0");
  EXPECT_MESSAGE_HAS(message(o, nullptr), "null sink");
  EXPECT_MESSAGE_HAS(message_of<logic_error>([] { callback_sink empty(nullptr); }), "empty function");
  EXPECT_EQ(dev().pinned().bytes, 0u) << "a rejected pipeline must not pin anything";
}

TEST_P(egress_pipeline, submit_takes_only_device_memory_of_its_device) {
  options o;
  o.slot_bytes = 4 * KiB;
  o.slots = 2;
  o.sink_workers = 1;
  stream s = dev().make_stream();
  const buffer pinned = dev().alloc_pinned(4 * KiB);
  const buffer pageable = dev().alloc_pageable(4 * KiB);
  const buffer out = constant_output(dev(), 4 * KiB, 1, s);
  pipeline pipe(dev(), std::make_shared<null_sink>(), o);
  EXPECT_MESSAGE_HAS(message_of<logic_error>([&] { static_cast<void>(pipe.submit(pinned, s, 0)); }),
                     "pinned view");
  EXPECT_MESSAGE_HAS(message_of<logic_error>([&] { static_cast<void>(pipe.try_submit(pageable, s, 0)); }),
                     "pageable view");
  EXPECT_MESSAGE_HAS(message_of<logic_error>([&] { static_cast<void>(pipe.submit(mem_view{}, s, 0)); }),
                     "empty");
  {
    const auto other = make_host_device();
    const stream foreign = other->make_stream();
    EXPECT_MESSAGE_HAS(message_of<logic_error>([&] { static_cast<void>(pipe.submit(out, foreign, 0)); }),
                       "another device");
  }
  EXPECT_EQ(pipe.stats().outputs, 0u);
  EXPECT_EQ(pipe.free_slots(), o.slots);
  // The pipeline still works after rejected submits.
  static_cast<void>(pipe.submit(out, s, 1));
  pipe.close();
  EXPECT_EQ(pipe.stats().deliveries, 1u);
}

// Counts consumes and what had been consumed when flush was called.
class counting_sink final : public sink {
 public:
  void consume(const output_chunk&) override {
    std::this_thread::sleep_for(1ms);
    consumed_.fetch_add(1);
  }
  void flush() override { consumed_at_flush_.push_back(consumed_.load()); }
  std::atomic<int> consumed_{0};
  std::vector<int> consumed_at_flush_;  // flush is called from the test thread only
};

TEST_P(egress_pipeline, flush_waits_for_everything_submitted_before_it_then_flushes_the_sink) {
  with_watchdog(60s, [&] {
    options o;
    o.slot_bytes = 4 * KiB;
    o.slots = 4;
    o.sink_workers = 2;
    auto sink = std::make_shared<counting_sink>();
    stream s = dev().make_stream();
    const buffer out = constant_output(dev(), 3 * o.slot_bytes, 1, s);  // three chunks each
    pipeline pipe(dev(), sink, o);
    for (std::uint64_t i = 0; i < 10; ++i) static_cast<void>(pipe.submit(out, s, i));
    pipe.flush();
    EXPECT_EQ(sink->consumed_at_flush_, (std::vector<int>{30}));
    EXPECT_EQ(pipe.free_slots(), o.slots);
    pipe.flush();  // nothing new: flushes the sink again at once
    for (std::uint64_t i = 0; i < 5; ++i) static_cast<void>(pipe.submit(out, s, i));
    pipe.close();
    EXPECT_EQ(sink->consumed_at_flush_, (std::vector<int>{30, 30, 45}));
  });
}

TEST_P(egress_pipeline, flush_and_close_from_inside_consume_are_logic_errors) {
  with_watchdog(60s, [&] {
    options o;
    o.slot_bytes = 4 * KiB;
    o.slots = 2;
    o.sink_workers = 1;
    pipeline* self = nullptr;
    std::string flush_error;
    std::string close_error;
    auto sink = std::make_shared<callback_sink>([&](const output_chunk&) {
      flush_error = message_of<logic_error>([&] { self->flush(); });
      close_error = message_of<logic_error>([&] { self->close(); });
    });
    stream s = dev().make_stream();
    const buffer out = constant_output(dev(), o.slot_bytes, 1, s);
    pipeline pipe(dev(), sink, o);
    self = &pipe;
    static_cast<void>(pipe.submit(out, s, 0));
    pipe.close();
    EXPECT_MESSAGE_HAS(flush_error, "inside consume");
    EXPECT_MESSAGE_HAS(close_error, "inside consume");
  });
}

TEST_P(egress_pipeline, the_destructor_reports_an_error_nobody_collected) {
  with_watchdog(60s, [&] {
    options o;
    o.slot_bytes = 4 * KiB;
    o.slots = 2;
    o.sink_workers = 1;
    stream s = dev().make_stream();
    const buffer out = constant_output(dev(), o.slot_bytes, 1, s);
    auto sink = std::make_shared<callback_sink>(
        [](const output_chunk&) { throw std::runtime_error("an error for the destructor to report"); });
    detail::forget_reported_destructor_errors();
    ::testing::internal::CaptureStderr();
    {
      pipeline pipe(dev(), sink, o);
      static_cast<void>(pipe.submit(out, s, 0));
      EXPECT_TRUE(eventually([&] { return pipe.stats().dropped == 1; }));
    }
    const std::string reported = ::testing::internal::GetCapturedStderr();
    EXPECT_MESSAGE_HAS(reported, "nobody collected");
    EXPECT_MESSAGE_HAS(reported, "an error for the destructor to report");

    // Once close() has thrown it, the error was collected: the destructor stays quiet.
    detail::forget_reported_destructor_errors();
    ::testing::internal::CaptureStderr();
    {
      pipeline pipe(dev(), sink, o);
      static_cast<void>(pipe.submit(out, s, 0));
      EXPECT_THROW(pipe.close(), std::runtime_error);
    }
    EXPECT_EQ(::testing::internal::GetCapturedStderr(), "");
  });
}

INSTANTIATE_TEST_SUITE_P(backends, egress_pipeline, ::testing::ValuesIn(backends_under_test()),
                         backend_test_name);

}  // namespace
}  // namespace ferry::egress
