// The device conformance suite: the semantics of device.hpp, checked on every backend named in
// FERRY_TEST_BACKENDS (comma-separated "host", "cuda"; default "host"). A cuda backend that cannot make a
// device fails the suite: a GPU run that quietly skips would pass without testing anything.
//
// The host backend runs with seeded random delays before its operations, so ordering bugs show up as
// wrong bytes instead of hiding behind lucky timing.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <set>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "ferry/core/error.hpp"
#include "ferry/core/pattern.hpp"
#include "ferry/core/units.hpp"
#include "ferry/device/device.hpp"
#include "support/test_support.hpp"

namespace ferry {
namespace {

using testing::backends_under_test;
using testing::held_stream;
using testing::message_of;

using namespace std::chrono_literals;
using steady = std::chrono::steady_clock;

// The conformance suite keeps the host backend's link model on, so copies take their modelled time.
std::unique_ptr<device> make_device_under_test(backend b) {
  host_device_options options = testing::jittery_host_options(20240611, 0.3, 200us);
  options.model_link = true;
  return testing::make_device_under_test(b, options);
}

// Bytes that differ from their neighbours and from one seed to the next, so a shifted, truncated or stale
// copy cannot match by accident.
std::uint8_t pattern_byte(std::size_t i, std::uint32_t seed) {
  const std::uint64_t x = (i + 1) * 0x9E3779B97F4A7C15ULL + seed * 0xBF58476D1CE4E5B9ULL;
  return static_cast<std::uint8_t>(x >> 56);
}

void fill_pattern(std::byte* p, std::size_t n, std::uint32_t seed) {
  for (std::size_t i = 0; i < n; ++i) p[i] = std::byte{pattern_byte(i, seed)};
}

// Index of the first byte that is not the pattern, or npos.
std::size_t pattern_mismatch(const std::byte* p, std::size_t n, std::uint32_t seed) {
  for (std::size_t i = 0; i < n; ++i) {
    if (p[i] != std::byte{pattern_byte(i, seed)}) return i;
  }
  return std::string::npos;
}

// Index of the first byte that is not `value`, or npos.
std::size_t value_mismatch(const std::byte* p, std::size_t n, std::uint8_t value) {
  for (std::size_t i = 0; i < n; ++i) {
    if (p[i] != std::byte{value}) return i;
  }
  return std::string::npos;
}

constexpr std::size_t npos = std::string::npos;

class conformance : public ::testing::TestWithParam<backend> {
 protected:
  void SetUp() override { dev_ = make_device_under_test(GetParam()); }
  device& dev() { return *dev_; }

  buffer alloc_host(memory_kind kind, std::size_t bytes) {
    return kind == memory_kind::pinned ? dev().alloc_pinned(bytes) : dev().alloc_pageable(bytes);
  }

  std::unique_ptr<device> dev_;
};

TEST_P(conformance, a_stream_runs_its_operations_in_order) {
  constexpr std::size_t n = 4099;
  constexpr int rounds = 40;
  stream s = dev().make_stream();
  buffer d1 = dev().alloc_device(n);
  buffer d2 = dev().alloc_device(n);
  buffer h = dev().alloc_pinned(n);
  std::vector<int> seen;
  int stale = 0;
  for (int r = 0; r < rounds; ++r) {
    // Each round's result depends on every earlier operation of the round having finished, and on none
    // of the next round having started.
    const auto value = static_cast<std::uint8_t>(r * 5 + 1);
    dev().memset_async(d1, value, s);
    dev().copy_async(d2, d1, s);
    dev().copy_async(h, d2, s);
    dev().launch_host_func(s, [&, r, value] {
      seen.push_back(r);
      if (value_mismatch(h.host_bytes(), n, value) != npos) ++stale;
    });
  }
  s.synchronize();
  EXPECT_EQ(stale, 0);
  ASSERT_EQ(seen.size(), static_cast<std::size_t>(rounds));
  for (int r = 0; r < rounds; ++r) EXPECT_EQ(seen[static_cast<std::size_t>(r)], r);
}

TEST_P(conformance, elapsed_ms_of_a_pending_event_is_a_logic_error) {
  stream s = dev().make_stream();
  event start = dev().make_timing_event();
  event stop = dev().make_timing_event();
  start.record(s);
  dev().spin_async(100ms, s);
  stop.record(s);
  EXPECT_MESSAGE_HAS(message_of<logic_error>([&] { static_cast<void>(dev().elapsed_ms(start, stop)); }),
                     "not completed");
  s.synchronize();
  EXPECT_GE(dev().elapsed_ms(start, stop), 99.0);
}

TEST_P(conformance, fill_pattern_writes_the_verification_pattern) {
  // An odd size, so the partial last word is written too; device memory checked through a copy.
  constexpr std::size_t n = 3 * 1024 * 1024 + 5;
  stream s = dev().make_stream();
  buffer d = dev().alloc_device(n);
  buffer h = dev().alloc_pinned(n);
  std::memset(h.host_bytes(), 0xEE, n);
  dev().fill_pattern_async(d, 99, s);
  dev().copy_async(h, d, s);
  s.synchronize();
  const auto bad = ferry::find_pattern_mismatch({h.host_bytes(), n}, 99);
  EXPECT_FALSE(bad.has_value()) << "first wrong byte at " << *bad;
  // Directly into pinned memory, and into a view that starts at a word boundary inside a buffer.
  dev().fill_pattern_async(h.view(8, n - 8), 5, s);
  s.synchronize();
  EXPECT_FALSE(ferry::find_pattern_mismatch({h.host_bytes(), 8}, 99).has_value())
      << "bytes before the view changed";
  const auto bad2 = ferry::find_pattern_mismatch({h.host_bytes() + 8, n - 8}, 5);
  EXPECT_FALSE(bad2.has_value()) << "first wrong byte at " << *bad2;
  const buffer pageable = dev().alloc_pageable(64);
  EXPECT_THROW(dev().fill_pattern_async(pageable, 1, s), logic_error);
}

TEST_P(conformance, a_wait_is_bound_to_its_record_even_when_the_event_is_recorded_again_elsewhere) {
  // Record on A (slow), wait on it from C, then record the same event on B (fast): C must still wait
  // for A's record, not for B's, which completes first.
  stream a = dev().make_stream();
  stream b = dev().make_stream();
  stream c = dev().make_stream();
  event e = dev().make_event();
  event c_done = dev().make_event();
  {
    // A is held until the checks are done, however long a busy machine takes to run them.
    held_stream hold(dev(), a);
    e.record(a);
    c.wait(e);
    c_done.record(c);
    e.record(b);
    b.synchronize();
    std::this_thread::sleep_for(30ms);  // time for a wrong wait to end
    EXPECT_FALSE(c_done.query()) << "the wait on A's record ended when B's record completed";
  }
  c_done.synchronize();
  EXPECT_TRUE(c_done.query());
}

TEST_P(conformance, checksum_matches_the_host_checksum) {
  constexpr std::size_t n = 2 * 1024 * 1024 + 3;  // a partial last word
  stream s = dev().make_stream();
  buffer d = dev().alloc_device(n);
  buffer h = dev().alloc_pinned(n);
  buffer result = dev().alloc_device(8);
  buffer back = dev().alloc_pinned(8);
  ferry::fill_pattern({h.host_bytes(), n}, 21);
  h.host_bytes()[12345] = std::byte{0x42};  // not only the pattern: any bytes
  dev().copy_async(d, h, s);
  dev().checksum_async(d, result, s);
  dev().copy_async(back, result, s);
  s.synchronize();
  std::uint64_t sum = 0;
  std::memcpy(&sum, back.host_bytes(), 8);
  EXPECT_EQ(sum, checksum64({h.host_bytes(), n}));
  // Twice in a row: the result is overwritten, not accumulated; a pinned source works too.
  dev().checksum_async(h, result, s);
  dev().copy_async(back, result, s);
  s.synchronize();
  std::memcpy(&sum, back.host_bytes(), 8);
  EXPECT_EQ(sum, checksum64({h.host_bytes(), n}));
  // A pattern's checksum is known without its bytes.
  ferry::fill_pattern({h.host_bytes(), n}, 21);
  EXPECT_EQ(checksum64({h.host_bytes(), n}), pattern_checksum(21, n));
  EXPECT_EQ(checksum64({h.host_bytes() + 4096, 8192}, 512),
            pattern_checksum(21, 12288) - pattern_checksum(21, 4096));
  EXPECT_THROW(dev().checksum_async(d, h.view(0, 8), s), logic_error);
}

TEST_P(conformance, streams_run_independently) {
  stream a = dev().make_stream();
  stream b = dev().make_stream();
  event a_done = dev().make_event();
  event b_done = dev().make_event();
  buffer d = dev().alloc_device(4096);
  buffer h = dev().alloc_pinned(4096);

  {
    // Stream a is held until b's work is checked: b must finish meanwhile, however busy the machine
    // (streams that ran one after the other would leave b waiting out the minute).
    held_stream hold(dev(), a);
    a_done.record(a);
    dev().memset_async(d, 7, b);
    dev().copy_async(h, d, b);
    b_done.record(b);
    const auto deadline = steady::now() + 60s;
    while (!b_done.query() && steady::now() < deadline) std::this_thread::sleep_for(1ms);
    EXPECT_TRUE(b_done.query()) << "stream b's work waited for stream a";
    EXPECT_FALSE(a_done.query());
  }
  b_done.synchronize();
  EXPECT_EQ(value_mismatch(h.host_bytes(), 4096, 7), npos);
  a_done.synchronize();
  EXPECT_TRUE(a_done.query());
}

TEST_P(conformance, query_and_synchronize_follow_completion) {
  stream s = dev().make_stream();
  event e = dev().make_event();
  dev().spin_async(100ms, s);
  e.record(s);
  EXPECT_FALSE(e.query());
  e.synchronize();
  EXPECT_TRUE(e.query());
}

TEST_P(conformance, recording_again_moves_the_point) {
  stream s = dev().make_stream();
  event e = dev().make_event();
  e.record(s);
  e.synchronize();
  EXPECT_TRUE(e.query());

  dev().spin_async(100ms, s);
  e.record(s);
  EXPECT_FALSE(e.query()) << "query answered for the earlier record, not the most recent one";
  e.synchronize();
  EXPECT_TRUE(e.query());
}

TEST_P(conformance, a_wait_is_for_the_record_current_at_the_time_of_the_call) {
  stream a = dev().make_stream();
  stream b = dev().make_stream();
  event e = dev().make_event();
  event b_done = dev().make_event();
  e.record(a);
  b.wait(e);
  b_done.record(b);
  {
    // A later record must not extend a wait that was already queued: b finishes while A is held (a wait
    // bound to the later record would hold b until A is released, and fail the minute below).
    held_stream hold(dev(), a);
    e.record(a);
    const auto deadline = steady::now() + 60s;
    while (!b_done.query() && steady::now() < deadline) std::this_thread::sleep_for(1ms);
    EXPECT_TRUE(b_done.query()) << "b's wait was extended to a record made after it";
    EXPECT_FALSE(e.query());
  }
  e.synchronize();
}

TEST_P(conformance, waiting_on_a_never_recorded_event_is_a_logic_error) {
  stream s = dev().make_stream();
  for (const bool timing : {false, true}) {
    event e = timing ? dev().make_timing_event() : dev().make_event();
    const std::string expected = "event was never recorded: record it on a stream before waiting on it";
    EXPECT_MESSAGE_HAS(message_of<logic_error>([&] { s.wait(e); }), expected);
    EXPECT_MESSAGE_HAS(message_of<logic_error>([&] { e.synchronize(); }), expected);
    EXPECT_MESSAGE_HAS(message_of<logic_error>([&] { static_cast<void>(e.query()); }), expected);
  }
}

TEST_P(conformance, timing_events_measure_the_time_between_them) {
  stream s = dev().make_stream();
  event start = dev().make_timing_event();
  event stop = dev().make_timing_event();
  EXPECT_TRUE(start.timing());
  {
    // Held, so that the spin follows the start event at once however slowly the test queues it: the
    // events then time the spin alone (exactly its modelled 50 ms on the host backend).
    const held_stream hold(dev(), s);
    start.record(s);
    dev().spin_async(50ms, s);
    stop.record(s);
  }
  stop.synchronize();
  const double ms = dev().elapsed_ms(start, stop);
  EXPECT_GE(ms, 49.0);
  EXPECT_LT(ms, 90.0);

  event plain = dev().make_event();
  EXPECT_FALSE(plain.timing());
  plain.record(s);
  plain.synchronize();
  EXPECT_MESSAGE_HAS(message_of<logic_error>([&] { static_cast<void>(dev().elapsed_ms(plain, stop)); }),
                     "make_timing_event");
  event unrecorded = dev().make_timing_event();
  EXPECT_MESSAGE_HAS(message_of<logic_error>([&] { static_cast<void>(dev().elapsed_ms(start, unrecorded)); }),
                     "never recorded");
}

TEST_P(conformance, a_stream_waiting_on_an_event_sees_the_data_written_before_it) {
  constexpr std::size_t n = 256 * KiB + 3;
  stream a = dev().make_stream();
  stream b = dev().make_stream();
  buffer d = dev().alloc_device(n);
  buffer h = dev().alloc_pinned(n);
  event ready = dev().make_event();
  // Stale content that a copy running ahead of the wait would deliver.
  dev().memset_async(d, 0x11, a);
  a.synchronize();

  for (int round = 0; round < 12; ++round) {
    const auto value = static_cast<std::uint8_t>(0x5A + round);
    std::memset(h.host_bytes(), 0xEE, n);
    if (round == 0) dev().spin_async(100ms, a);
    dev().memset_async(d, value, a);
    ready.record(a);
    b.wait(ready);
    dev().copy_async(h, d, b);
    b.synchronize();
    const std::size_t bad = value_mismatch(h.host_bytes(), n, value);
    EXPECT_EQ(bad, npos) << "round " << round << ": byte " << bad << " is "
                         << static_cast<int>(h.host_bytes()[bad == npos ? 0 : bad]);
    a.synchronize();
  }
}

TEST_P(conformance, copies_are_exact_in_every_direction) {
  constexpr std::uint8_t host_poison = 0xEE;
  constexpr std::uint8_t device_poison = 0xD0;
  constexpr std::uint8_t device_poison2 = 0xD1;
  constexpr std::size_t pad = 71;  // past the copied range: must keep its poison
  // At most one large pinned buffer lives at a time: two of 4 MiB and a page each would exceed the 8 MiB
  // RLIMIT_MEMLOCK that an unprivileged user gets by default, and the host backend really locks pages.
  constexpr std::size_t pinned_pair_max = 4097;
  stream s = dev().make_stream();
  std::uint32_t seed = 1;
  for (const std::size_t size : {std::size_t{1}, std::size_t{7}, std::size_t{4097}, 4 * MiB + 7}) {
    const std::size_t total = size + pad;
    for (const memory_kind host_kind : {memory_kind::pinned, memory_kind::pageable}) {
      SCOPED_TRACE(::testing::Message() << "size " << size << ", host memory " << to_string(host_kind));
      ++seed;
      buffer dev_a = dev().alloc_device(total);
      buffer dev_b = dev().alloc_device(total);
      {
        buffer src = alloc_host(host_kind, total);
        fill_pattern(src.host_bytes(), total, seed);
        // host to device, then device to device, each into a poisoned buffer
        dev().memset_async(dev_a, device_poison, s);
        dev().memset_async(dev_b, device_poison2, s);
        dev().copy_async(dev_a, src, size, s);
        dev().copy_async(dev_b, dev_a, size, s);
        s.synchronize();
      }

      // device to host of exactly `size` bytes
      buffer out = alloc_host(host_kind, total);
      std::memset(out.host_bytes(), host_poison, total);
      dev().copy_async(out, dev_a, size, s);
      s.synchronize();
      EXPECT_EQ(pattern_mismatch(out.host_bytes(), size, seed), npos) << "h2d or d2h";
      EXPECT_EQ(value_mismatch(out.host_bytes() + size, pad, host_poison), npos)
          << "d2h wrote past its range";

      // whole device buffers back, to see what the h2d and d2d copies left past their range
      std::memset(out.host_bytes(), host_poison, total);
      dev().copy_async(out, dev_a, s);
      s.synchronize();
      EXPECT_EQ(value_mismatch(out.host_bytes() + size, pad, device_poison), npos)
          << "h2d wrote past its range";
      std::memset(out.host_bytes(), host_poison, total);
      dev().copy_async(out, dev_b, s);
      s.synchronize();
      EXPECT_EQ(pattern_mismatch(out.host_bytes(), size, seed), npos) << "d2d";
      EXPECT_EQ(value_mismatch(out.host_bytes() + size, pad, device_poison2), npos)
          << "d2d wrote past its range";
    }
    for (const memory_kind from : {memory_kind::pinned, memory_kind::pageable}) {
      for (const memory_kind to : {memory_kind::pinned, memory_kind::pageable}) {
        if (from == memory_kind::pinned && to == memory_kind::pinned && size > pinned_pair_max) continue;
        SCOPED_TRACE(::testing::Message()
                     << "size " << size << ", h2h " << to_string(from) << " to " << to_string(to));
        ++seed;
        buffer src = alloc_host(from, total);
        buffer dst = alloc_host(to, total);
        fill_pattern(src.host_bytes(), total, seed);
        std::memset(dst.host_bytes(), host_poison, total);
        dev().copy_async(dst, src, size, s);
        s.synchronize();
        EXPECT_EQ(pattern_mismatch(dst.host_bytes(), size, seed), npos);
        EXPECT_EQ(value_mismatch(dst.host_bytes() + size, pad, host_poison), npos)
            << "h2h wrote past its range";
      }
    }
  }
}

TEST_P(conformance, copies_from_and_to_pageable_memory_return_when_the_host_side_is_done) {
  constexpr std::size_t n = MiB + 5;
  stream s = dev().make_stream();
  buffer src = dev().alloc_pageable(n);
  buffer d = dev().alloc_device(n);
  buffer out = dev().alloc_pageable(n);
  fill_pattern(src.host_bytes(), n, 77);
  dev().copy_async(d, src, s);
  // The source may be reused at once: the copy has consumed it.
  std::memset(src.host_bytes(), 0xEE, n);
  std::memset(out.host_bytes(), 0xEE, n);
  dev().copy_async(out, d, s);
  // And the destination is filled when copy_async returns, without a synchronize.
  EXPECT_EQ(pattern_mismatch(out.host_bytes(), n, 77), npos);
  s.synchronize();
}

TEST_P(conformance, host_callbacks_run_in_order_after_the_work_before_them) {
  constexpr std::size_t n = 64 * KiB + 1;
  constexpr int rounds = 48;
  stream s = dev().make_stream();
  buffer src = dev().alloc_pinned(n * rounds);
  buffer d = dev().alloc_device(n);
  buffer out = dev().alloc_pinned(n);
  for (int r = 0; r < rounds; ++r) fill_pattern(src.host_bytes() + n * r, n, static_cast<std::uint32_t>(r));
  std::vector<int> order;
  std::vector<int> early;  // rounds whose callback saw bytes its preceding copy had not delivered yet
  for (int r = 0; r < rounds; ++r) {
    dev().copy_async(d, src.view(n * r, n), s);
    dev().copy_async(out, d, s);
    dev().launch_host_func(s, [&, r] {
      order.push_back(r);
      if (pattern_mismatch(out.host_bytes(), n, static_cast<std::uint32_t>(r)) != npos) early.push_back(r);
    });
  }
  s.synchronize();
  EXPECT_TRUE(early.empty()) << "first early round: " << (early.empty() ? -1 : early.front());
  ASSERT_EQ(order.size(), static_cast<std::size_t>(rounds));
  for (int r = 0; r < rounds; ++r) EXPECT_EQ(order[static_cast<std::size_t>(r)], r);
}

struct callback_failure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

TEST_P(conformance, an_exception_from_a_callback_is_rethrown_at_the_next_synchronize) {
  stream s = dev().make_stream();
  bool ran_after = false;
  dev().launch_host_func(s, [] { throw callback_failure("first failure"); });
  dev().launch_host_func(s, [] { throw callback_failure("second failure"); });
  dev().launch_host_func(s, [&] { ran_after = true; });
  EXPECT_MESSAGE_HAS(message_of<callback_failure>([&] { s.synchronize(); }), "first failure");
  EXPECT_TRUE(ran_after) << "the stream stopped after a failing callback";
  EXPECT_NO_THROW(s.synchronize());
  EXPECT_NO_THROW(dev().synchronize());

  event e = dev().make_event();
  dev().launch_host_func(s, [] { throw callback_failure("seen by an event"); });
  e.record(s);
  EXPECT_MESSAGE_HAS(message_of<callback_failure>([&] { e.synchronize(); }), "seen by an event");
  EXPECT_NO_THROW(e.synchronize());

  dev().launch_host_func(s, [] { throw callback_failure("seen by the device"); });
  EXPECT_MESSAGE_HAS(message_of<callback_failure>([&] { dev().synchronize(); }), "seen by the device");
  EXPECT_NO_THROW(dev().synchronize());
  EXPECT_NO_THROW(s.synchronize());
}

TEST_P(conformance, bad_input_is_a_logic_error_that_names_the_values) {
  stream s = dev().make_stream();
  EXPECT_MESSAGE_HAS(message_of<logic_error>([&] { static_cast<void>(dev().alloc_device(0)); }), "size 0");
  EXPECT_MESSAGE_HAS(message_of<logic_error>([&] { static_cast<void>(dev().alloc_pinned(0)); }), "size 0");
  EXPECT_MESSAGE_HAS(message_of<logic_error>([&] { static_cast<void>(dev().alloc_pageable(0)); }), "size 0");

  buffer big = dev().alloc_pageable(2 * MiB);
  buffer small = dev().alloc_device(MiB);
  const std::string too_big = message_of<logic_error>([&] { dev().copy_async(small, big, s); });
  EXPECT_MESSAGE_HAS(too_big, "copy of 2.00 MiB does not fit in its destination of 1.00 MiB");
  const std::string too_big_for_source =
      message_of<logic_error>([&] { dev().copy_async(big, small, MiB + 1, s); });
  EXPECT_MESSAGE_HAS(too_big_for_source, "source");
  EXPECT_MESSAGE_HAS(too_big_for_source, "1048577 bytes");
  EXPECT_MESSAGE_HAS(too_big_for_source, "1048576 bytes");
  EXPECT_MESSAGE_HAS(message_of<logic_error>([&] { dev().copy_async(small, big, 0, s); }), "0 bytes");

  EXPECT_MESSAGE_HAS(message_of<logic_error>([&] { static_cast<void>(small.view(MiB - 10, 11)); }),
                     "1048566");
  EXPECT_MESSAGE_HAS(message_of<logic_error>([&] { static_cast<void>(small.view(MiB + 1, 0)); }), "1048576");

  for (const std::uintptr_t handle : {std::uintptr_t{0}, std::uintptr_t{1}, std::uintptr_t{2}}) {
    const std::string msg = message_of<logic_error>(
        [&] { static_cast<void>(dev().adopt_stream(reinterpret_cast<void*>(handle))); });
    EXPECT_MESSAGE_HAS(msg, handle == 0 ? "nullptr" : handle == 1 ? "0x1" : "0x2");
    EXPECT_MESSAGE_HAS(msg, "legacy default stream");
    EXPECT_MESSAGE_HAS(msg, "torch.cuda.Stream()");
  }

  EXPECT_MESSAGE_HAS(message_of<logic_error>([&] { dev().memset_async(big, 0, s); }), "pageable");
  EXPECT_MESSAGE_HAS(message_of<logic_error>([&] { dev().launch_host_func(s, {}); }), "empty");
  EXPECT_MESSAGE_HAS(message_of<logic_error>([&] { dev().spin_async(-1ms, s); }), "negative");
  EXPECT_MESSAGE_HAS(message_of<logic_error>([&] { static_cast<void>(device_view(nullptr, 16)); }),
                     "device_view");
  EXPECT_MESSAGE_HAS(message_of<logic_error>([&] { static_cast<void>(pinned_view(big.data(), 0)); }),
                     "pinned_view");
  EXPECT_MESSAGE_HAS(message_of<logic_error>([&] { static_cast<void>(pageable_view(nullptr, 1)); }),
                     "pageable_view");
  EXPECT_MESSAGE_HAS(message_of<logic_error>([&] { static_cast<void>(small.host_bytes()); }), "device");
  EXPECT_MESSAGE_HAS(
      message_of<logic_error>([&] { dev().copy_async(big.view(0, MiB), big.view(MiB / 2, MiB), s); }),
      "overlaps");

  // Work on another device's stream, or an event recorded there on a stream of this device.
  std::unique_ptr<device> other = make_device_under_test(GetParam());
  stream foreign = other->make_stream();
  event foreign_event = other->make_event();
  EXPECT_MESSAGE_HAS(message_of<logic_error>([&] { dev().spin_async(1ms, foreign); }), "another device");
  EXPECT_MESSAGE_HAS(message_of<logic_error>([&] { foreign_event.record(s); }), "another device");
  foreign.synchronize();
}

TEST_P(conformance, a_stream_waits_on_an_event_of_another_device) {
  // The other device (a second device object of GPU 0 on cuda) fills a pinned buffer late, in a host
  // function behind a spin; this device's stream copies it only once the other's event says so.
  constexpr std::size_t n = 64 * KiB + 3;
  std::unique_ptr<device> other = make_device_under_test(GetParam());
  stream theirs = other->make_stream();
  stream mine = dev().make_stream();
  buffer src = dev().alloc_pinned(n);
  buffer d = dev().alloc_device(n);
  buffer back = dev().alloc_pinned(n);
  std::memset(src.host_bytes(), 0, n);
  std::memset(back.host_bytes(), 0xEE, n);
  event filled = other->make_event();
  other->spin_async(30ms, theirs);
  other->launch_host_func(theirs, [&] { std::memset(src.host_bytes(), 0x6B, n); });
  filled.record(theirs);
  mine.wait(filled);
  dev().copy_async(d, src, mine);
  dev().copy_async(back, d, mine);
  mine.synchronize();
  EXPECT_EQ(value_mismatch(back.host_bytes(), n, 0x6B), npos)
      << "the copy ran before the other device's event";
  theirs.synchronize();
}

TEST_P(conformance, an_impossible_device_allocation_is_out_of_memory_naming_the_size) {
  constexpr std::size_t pebibyte = std::size_t{1} << 50;
  const std::string msg = message_of<out_of_memory>([&] { static_cast<void>(dev().alloc_device(pebibyte)); });
  EXPECT_MESSAGE_HAS(msg, format_bytes(pebibyte));
  // The failure left nothing behind: ordinary allocations still work.
  buffer ok = dev().alloc_device(MiB);
  EXPECT_FALSE(ok.empty());
}

TEST_P(conformance, adopt_stream_accepts_a_stream_of_the_device) {
  stream s = dev().make_stream();
  const stream_view adopted = dev().adopt_stream(s.view().native());
  EXPECT_TRUE(adopted == s.view());
  buffer d = dev().alloc_device(4096);
  buffer h = dev().alloc_pinned(4096);
  dev().memset_async(d, 0x42, adopted);
  dev().copy_async(h, d, adopted);
  adopted.synchronize();
  EXPECT_EQ(value_mismatch(h.host_bytes(), 4096, 0x42), npos);
}

TEST_P(conformance, moved_from_owners_are_empty) {
  stream a = dev().make_stream();
  void* native = a.view().native();
  stream b(std::move(a));
  EXPECT_TRUE(a.empty());  // NOLINT(bugprone-use-after-move): the moved-from state is what is tested
  EXPECT_FALSE(b.empty());
  EXPECT_EQ(b.view().native(), native);
  EXPECT_MESSAGE_HAS(message_of<logic_error>([&] { static_cast<void>(a.view()); }), "empty");
  stream c;
  EXPECT_TRUE(c.empty());
  c = std::move(b);
  EXPECT_TRUE(b.empty());   // NOLINT(bugprone-use-after-move)
  c = dev().make_stream();  // destroys the stream c held
  dev().spin_async(1ms, c);
  c.synchronize();

  event e1 = dev().make_event();
  e1.record(c);
  event e2(std::move(e1));
  EXPECT_TRUE(e1.empty());  // NOLINT(bugprone-use-after-move)
  EXPECT_FALSE(e1.recorded());
  EXPECT_TRUE(e2.recorded());
  e2.synchronize();
  EXPECT_THROW(static_cast<void>(e1.query()), logic_error);
  event e3;
  e3 = std::move(e2);
  EXPECT_TRUE(e2.empty());  // NOLINT(bugprone-use-after-move)
  EXPECT_TRUE(e3.query());
  event t1 = dev().make_timing_event();
  event t2(std::move(t1));
  EXPECT_FALSE(t1.timing());  // NOLINT(bugprone-use-after-move)
  EXPECT_TRUE(t2.timing());
  EXPECT_EQ(t1.dev(), nullptr);
  EXPECT_EQ(t2.dev(), &dev());

  const std::uint64_t base = dev().pinned().bytes;
  buffer b1 = dev().alloc_pinned(8192);
  void* data = b1.data();
  buffer b2(std::move(b1));
  EXPECT_TRUE(b1.empty());  // NOLINT(bugprone-use-after-move)
  EXPECT_EQ(b1.size(), 0u);
  EXPECT_EQ(b1.data(), nullptr);
  EXPECT_EQ(b2.data(), data);
  EXPECT_EQ(b2.size(), 8192u);
  EXPECT_EQ(b2.kind(), memory_kind::pinned);
  EXPECT_EQ(dev().pinned().bytes, base + 8192);
  b2 = dev().alloc_pinned(4096);  // frees the 8192 bytes b2 held
  EXPECT_EQ(dev().pinned().bytes, base + 4096);
  buffer b3;
  b3 = std::move(b2);
  EXPECT_TRUE(b2.empty());  // NOLINT(bugprone-use-after-move)
  EXPECT_EQ(b3.size(), 4096u);
}

TEST_P(conformance, completion_events_come_back_from_the_pool) {
  void* first = nullptr;
  {
    event e = dev().make_event();
    first = e.native();
  }
  {
    event e = dev().make_event();
    EXPECT_EQ(e.native(), first) << "a released completion event did not come back from the pool";
  }

  stream s = dev().make_stream();
  std::set<void*> handles;
  for (int i = 0; i < 10000; ++i) {
    event e = dev().make_event();
    // Some go back to the pool with their record still pending, as pipelines do.
    if (i % 100 == 0) e.record(s);
    handles.insert(e.native());
  }
  EXPECT_EQ(handles.size(), 1u);

  std::vector<event> live;
  for (int round = 0; round < 50; ++round) {
    for (int k = 0; k < 16; ++k) {
      live.push_back(dev().make_event());
      live.back().record(s);
      handles.insert(live.back().native());
    }
    live.clear();
  }
  EXPECT_LE(handles.size(), 16u);
  s.synchronize();
}

TEST_P(conformance, pinned_stats_account_for_every_pinned_buffer) {
  const pinned_stats before = dev().pinned();
  {
    buffer a = dev().alloc_pinned(MiB);
    buffer b = dev().alloc_pinned(3 * KiB + 1);
    buffer not_pinned = dev().alloc_pageable(MiB);
    buffer not_pinned_either = dev().alloc_device(MiB);
    const pinned_stats during = dev().pinned();
    EXPECT_EQ(during.bytes, before.bytes + MiB + 3 * KiB + 1);
    EXPECT_EQ(during.allocations, before.allocations + 2);
    EXPECT_GE(during.peak_bytes, during.bytes);
    EXPECT_GT(during.seconds, before.seconds);
  }
  const pinned_stats after = dev().pinned();
  EXPECT_EQ(after.bytes, before.bytes);
  EXPECT_EQ(after.allocations, before.allocations + 2);
  EXPECT_GE(after.peak_bytes, before.bytes + MiB + 3 * KiB + 1);
}

TEST_P(conformance, many_threads_drive_their_own_streams) {
  constexpr int threads = 8;
  constexpr int rounds = 25;
  std::atomic<int> wrong{0};
  std::atomic<int> failed{0};
  std::vector<std::thread> pool;
  pool.reserve(threads);
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      try {
        const std::size_t n = 64 * KiB + 13 + static_cast<std::size_t>(t);
        stream s = dev().make_stream();
        buffer src = dev().alloc_pinned(n);
        buffer d = dev().alloc_device(n);
        buffer out = dev().alloc_pinned(n);
        for (int r = 0; r < rounds; ++r) {
          const auto seed = static_cast<std::uint32_t>(t * 1000 + r);
          fill_pattern(src.host_bytes(), n, seed);
          std::memset(out.host_bytes(), 0xEE, n);
          dev().copy_async(d, src, s);
          dev().copy_async(out, d, s);
          event done = dev().make_event();
          done.record(s);
          done.synchronize();
          if (pattern_mismatch(out.host_bytes(), n, seed) != npos) ++wrong;
        }
      } catch (...) {
        ++failed;
      }
    });
  }
  for (std::thread& th : pool) th.join();
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_EQ(failed.load(), 0);
}

TEST_P(conformance, device_synchronize_waits_for_every_stream) {
  std::vector<stream> streams;
  std::vector<event> done;
  for (int i = 0; i < 3; ++i) {
    streams.push_back(dev().make_stream());
    dev().spin_async(std::chrono::milliseconds(30 + 10 * i), streams.back());
    done.push_back(dev().make_event());
    done.back().record(streams.back());
  }
  dev().synchronize();
  for (const event& e : done) EXPECT_TRUE(e.query());
}

TEST_P(conformance, info_names_the_backend) {
  const device_info info = dev().info();
  EXPECT_EQ(info.kind, GetParam());
  EXPECT_EQ(dev().kind(), GetParam());
  EXPECT_FALSE(info.name.empty());
  EXPECT_GT(info.memory_bytes, 0u);
  EXPECT_GT(info.copy_engines, 0);
  EXPECT_NO_THROW(dev().profiler_start());
  EXPECT_NO_THROW(dev().profiler_stop());
}

INSTANTIATE_TEST_SUITE_P(backends, conformance, ::testing::ValuesIn(backends_under_test()),
                         [](const ::testing::TestParamInfo<backend>& param_info) {
                           return std::string(to_string(param_info.param));
                         });

}  // namespace
}  // namespace ferry
