// The host backend's groups of devices (make_host_devices) and the peer link they share: modelled time of
// peer copies (the profile's latency and bandwidth, copies out of or into one device taking turns, a ring
// and both directions of a pair running at once), the presets, the options' checks, groups, ordinals and
// tracing. Modelled time is asserted exactly (timing events read the model); wall time only from below.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ferry/core/error.hpp"
#include "ferry/core/pattern.hpp"
#include "ferry/core/units.hpp"
#include "ferry/device/device.hpp"
#include "ferry/trace/timeline.hpp"
#include "support/test_support.hpp"

namespace ferry {
namespace {

using namespace std::chrono_literals;
using steady = std::chrono::steady_clock;
using testing::held_stream;
using testing::message_of;

double ms_since(steady::time_point t0) {
  return std::chrono::duration<double, std::milli>(steady::now() - t0).count();
}

// Milliseconds a copy of `bytes` takes at `gbps` decimal GB/s after `latency`.
double modelled_ms(std::size_t bytes, double gbps, std::chrono::nanoseconds latency = 0ns) {
  return static_cast<double>(bytes) / (gbps * 1e6) +
         std::chrono::duration<double, std::milli>(latency).count();
}

// A slow peer link on small buffers (15.6 MB/s: 512 KiB take 34 ms), so memcpy, about ten times slower
// under ThreadSanitizer, stays far below the modelled time. No jitter: these tests time copies.
constexpr double slow_gbps = 1.0 / 64;

host_device_options slow_peer_options() {
  host_device_options o;
  o.peer.gbps = slow_gbps;
  o.peer.latency = 0ns;
  return o;
}

TEST(host_peer_link, a_peer_copy_lasts_latency_plus_bytes_over_the_profile_bandwidth) {
  constexpr std::size_t n = 512 * KiB;
  host_device_options o = slow_peer_options();
  o.peer.latency = 3ms;
  const double expected = modelled_ms(n, slow_gbps, o.peer.latency);  // 36.6 ms
  auto devs = make_host_devices(2, o);
  device& a = *devs[0];
  device& b = *devs[1];
  stream s = a.make_stream();
  buffer src = a.alloc_device(n);
  buffer dst = b.alloc_device(n);
  event start = a.make_timing_event();
  event stop = a.make_timing_event();
  const auto t0 = steady::now();
  {
    // Held while the test queues, so the copy follows the start event however slowly the test queues.
    const held_stream hold(a, s);
    a.fill_pattern_async(src, 8, s);
    start.record(s);
    a.copy_peer_async(dst, b, src, s);
    stop.record(s);
  }
  stop.synchronize();
  EXPECT_GE(ms_since(t0), expected);
  EXPECT_NEAR(a.elapsed_ms(start, stop), expected, 1e-5);
  stream sb = b.make_stream();
  buffer back = b.alloc_pinned(n);
  b.copy(back, dst, sb);
  const auto bad = find_pattern_mismatch({back.host_bytes(), n}, 8);
  EXPECT_FALSE(bad.has_value()) << "the modelled copy did not copy: first wrong byte at " << *bad;
}

TEST(host_peer_link, the_presets_model_nvlink_and_copies_staged_through_host_memory) {
  constexpr std::size_t n = 8 * MiB;
  for (const auto& [name, profile] : {std::pair{"nvlink", peer_link_profile::nvlink()},
                                      std::pair{"pcie_host", peer_link_profile::pcie_host()}}) {
    SCOPED_TRACE(name);
    host_device_options o;
    o.peer = profile;
    auto devs = make_host_devices(2, o);
    stream s = devs[1]->make_stream();
    buffer src = devs[1]->alloc_device(n);
    buffer dst = devs[0]->alloc_device(n);
    event start = devs[1]->make_timing_event();
    event stop = devs[1]->make_timing_event();
    {
      const held_stream hold(*devs[1], s);
      start.record(s);
      devs[1]->copy_peer_async(dst, *devs[0], src, s);
      stop.record(s);
    }
    stop.synchronize();
    EXPECT_NEAR(devs[1]->elapsed_ms(start, stop), modelled_ms(n, profile.gbps, profile.latency), 1e-5);
  }
  // Without a peer path the same copy is an order of magnitude slower (docs/DEVICE.md: the figures).
  EXPECT_GT(modelled_ms(n, peer_link_profile::pcie_host().gbps, peer_link_profile::pcie_host().latency),
            10 * modelled_ms(n, peer_link_profile::nvlink().gbps, peer_link_profile::nvlink().latency));
  // The default is NVLink's profile.
  EXPECT_EQ(host_device_options{}.peer.gbps, peer_link_profile::nvlink().gbps);
  EXPECT_EQ(host_device_options{}.peer.latency, peer_link_profile::nvlink().latency);
}

// Three devices and a stream per copy; window_ms runs copies that all become ready at one moment (their
// streams wait for one event behind a held stream) and returns the modelled time from that moment to the
// end of the last.
class host_peer_turns : public ::testing::Test {
 protected:
  static constexpr std::size_t n = 512 * KiB;
  static constexpr int count = 3;

  void SetUp() override {
    devs_ = make_host_devices(count, slow_peer_options());
    for (int i = 0; i < count; ++i) {
      device& d = *devs_[static_cast<std::size_t>(i)];
      src_.push_back(d.alloc_device(n));
      dst_.push_back(d.alloc_device(n));
      dst2_.push_back(d.alloc_device(n));
    }
    go_stream_ = devs_[0]->make_stream();
  }

  // Copies from->to for each pair, each on its own stream of its source device.
  double window_ms(const std::vector<std::pair<int, int>>& copies) {
    struct one {
      device* dev;
      stream s;
      event ready;
      event done;
    };
    std::vector<one> runs;
    event go = devs_[0]->make_event();
    {
      const held_stream hold(*devs_[0], go_stream_);
      go.record(go_stream_);
      std::vector<int> received(count, 0);
      for (const auto& [from, to] : copies) {
        device& src_dev = *devs_[static_cast<std::size_t>(from)];
        device& dst_dev = *devs_[static_cast<std::size_t>(to)];
        one r{&src_dev, src_dev.make_stream(), src_dev.make_timing_event(), src_dev.make_timing_event()};
        r.s.wait(go);  // an event of device 0: the cross-device wait puts every copy at go's moment
        r.ready.record(r.s);
        // Two copies into one device write different buffers.
        const buffer& into = received[static_cast<std::size_t>(to)]++ == 0
                                 ? dst_[static_cast<std::size_t>(to)]
                                 : dst2_[static_cast<std::size_t>(to)];
        src_dev.copy_peer_async(into, dst_dev, src_[static_cast<std::size_t>(from)], r.s);
        r.done.record(r.s);
        runs.push_back(std::move(r));
      }
    }
    double window = 0;
    for (one& r : runs) {
      r.s.synchronize();
      window = std::max(window, r.dev->elapsed_ms(r.ready, r.done));
    }
    return window;
  }

  std::vector<std::unique_ptr<device>> devs_;
  std::vector<buffer> src_;
  std::vector<buffer> dst_;
  std::vector<buffer> dst2_;
  stream go_stream_;
};

TEST_F(host_peer_turns, copies_out_of_one_device_take_turns) {
  const double one = modelled_ms(n, slow_gbps);  // 33.6 ms
  const auto t0 = steady::now();
  EXPECT_NEAR(window_ms({{0, 1}, {0, 2}}), 2 * one, 1e-5) << "device 0 sent twice its bandwidth";
  EXPECT_GE(ms_since(t0), 2 * one);
}

TEST_F(host_peer_turns, copies_into_one_device_take_turns) {
  const double one = modelled_ms(n, slow_gbps);
  EXPECT_NEAR(window_ms({{1, 0}, {2, 0}}), 2 * one, 1e-5) << "device 0 received twice its bandwidth";
}

TEST_F(host_peer_turns, both_directions_of_a_pair_run_at_once) {
  const double one = modelled_ms(n, slow_gbps);
  EXPECT_NEAR(window_ms({{0, 1}, {1, 0}}), one, 1e-5) << "the link is full duplex";
}

TEST_F(host_peer_turns, every_hop_of_a_ring_runs_at_once) {
  const double one = modelled_ms(n, slow_gbps);
  EXPECT_NEAR(window_ms({{0, 1}, {1, 2}, {2, 0}}), one, 1e-5) << "a ring's hops share no engine";
}

TEST(host_peer_link, unmodelled_peer_copies_run_at_memcpy_speed) {
  // 1 MiB at 1 kB/s would take 17 minutes: the bound is a minute, far above a memcpy on a busy machine.
  host_device_options o;
  o.model_link = false;
  o.peer.gbps = 1e-6;
  auto devs = make_host_devices(2, o);
  stream s = devs[0]->make_stream();
  buffer src = devs[0]->alloc_device(MiB);
  buffer dst = devs[1]->alloc_device(MiB);
  const auto t0 = steady::now();
  devs[0]->copy_peer_async(dst, *devs[1], src, s);
  s.synchronize();
  EXPECT_LT(ms_since(t0), 60'000.0) << "model_link = false still paced the peer copy";
}

TEST(host_peer_link, bad_options_are_a_logic_error_naming_the_option) {
  host_device_options o;
  o.peer.gbps = 0;
  EXPECT_MESSAGE_HAS(message_of<logic_error>([&] { static_cast<void>(make_host_devices(2, o)); }),
                     "peer.gbps = 0");
  EXPECT_MESSAGE_HAS(message_of<logic_error>([&] { static_cast<void>(make_host_device(o)); }),
                     "peer.gbps = 0");
  o = {};
  o.peer.latency = -1ns;
  EXPECT_MESSAGE_HAS(message_of<logic_error>([&] { static_cast<void>(make_host_devices(2, o)); }),
                     "peer.latency = -1 ns");
  o = {};
  for (const int n : {0, -1, max_host_devices + 1}) {
    const std::string msg = message_of<logic_error>([&] { static_cast<void>(make_host_devices(n, o)); });
    EXPECT_MESSAGE_HAS(msg, fmt::format("make_host_devices({})", n));
    EXPECT_MESSAGE_HAS(msg, fmt::format("1 to {} devices", max_host_devices));
  }
  o.ordinal = -1;
  EXPECT_MESSAGE_HAS(message_of<logic_error>([&] { static_cast<void>(make_host_device(o)); }),
                     "ordinal = -1");
  EXPECT_MESSAGE_HAS(message_of<logic_error>([&] { static_cast<void>(make_host_devices(2, o)); }),
                     "ordinal = -1");
  o.ordinal = std::numeric_limits<int>::max();
  EXPECT_MESSAGE_HAS(message_of<logic_error>([&] { static_cast<void>(make_host_devices(2, o)); }),
                     fmt::format("ordinal = {}", std::numeric_limits<int>::max()));
  // A bad peer profile does not matter when nothing is modelled.
  o = {};
  o.model_link = false;
  o.peer.gbps = 0;
  EXPECT_NO_THROW(static_cast<void>(make_host_devices(2, o)));
}

TEST(host_peer_link, a_group_numbers_its_devices_from_the_options_ordinal) {
  host_device_options o;
  o.ordinal = 4;
  auto devs = make_host_devices(3, o);
  ASSERT_EQ(devs.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(devs[static_cast<std::size_t>(i)]->ordinal(), 4 + i);
    EXPECT_EQ(devs[static_cast<std::size_t>(i)]->info().ordinal, 4 + i);
  }
  EXPECT_EQ(make_host_device(o)->info().ordinal, 4);
  EXPECT_EQ(make_host_device()->ordinal(), 0);
}

TEST(host_peer_link, devices_made_separately_are_not_peers) {
  auto a = make_host_device();
  host_device_options o;
  o.ordinal = 1;
  auto b = make_host_device(o);
  EXPECT_FALSE(a->can_access_peer(*b));
  EXPECT_FALSE(b->can_access_peer(*a));
  EXPECT_TRUE(a->can_access_peer(*a));
  auto group = make_host_devices(2);
  EXPECT_FALSE(group[0]->can_access_peer(*a)) << "devices of two groups share no link";
  stream s = a->make_stream();
  buffer src = a->alloc_device(KiB);
  buffer dst = b->alloc_device(KiB);
  const std::string msg = message_of<logic_error>([&] { a->copy_peer_async(dst, *b, src, s); });
  EXPECT_MESSAGE_HAS(msg, "from host device 0 to host device 1");
  EXPECT_MESSAGE_HAS(msg, "make_host_devices");
  // Streams of another device may still wait on their events: waiting needs no link.
  stream sb = b->make_stream();
  event e = a->make_event();
  e.record(s);
  EXPECT_NO_THROW(sb.wait(e));
  sb.synchronize();
}

TEST(host_peer_link, the_devices_of_a_group_may_be_destroyed_in_any_order) {
  auto devs = make_host_devices(3);
  devs[1].reset();  // the link lives on with the others
  stream s = devs[2]->make_stream();
  buffer src = devs[2]->alloc_device(64 * KiB);
  buffer dst = devs[0]->alloc_device(64 * KiB);
  devs[2]->fill_pattern_async(src, 6, s);
  devs[2]->copy_peer_async(dst, *devs[0], src, s);
  s.synchronize();
  stream s0 = devs[0]->make_stream();
  buffer back = devs[0]->alloc_pinned(64 * KiB);
  devs[0]->copy(back, dst, s0);
  EXPECT_FALSE(find_pattern_mismatch({back.host_bytes(), back.size()}, 6).has_value());
}

TEST(host_peer_link, a_trace_records_a_peer_copy_as_a_p2p_copy_of_the_source_device) {
  auto devs = make_host_devices(2);
  constexpr std::size_t n = 3 * MiB;
  stream s = devs[1]->make_stream();
  buffer src = devs[1]->alloc_device(n);
  buffer dst = devs[0]->alloc_device(n);
  trace::recorder r;
  r.start();
  devs[1]->trace_begin(r);
  devs[1]->copy_peer_async(dst, *devs[0], src, s);
  s.synchronize();
  devs[1]->trace_end();
  r.stop();
  const trace::timeline t = r.take("test", devs[1]->info().name);
  std::vector<const trace::event*> copies;
  std::vector<const trace::event*> calls;
  for (const auto& e : t.events) {
    if (e.kind == trace::activity::memcpy) copies.push_back(&e);
    if (e.kind == trace::activity::api && t.name_of(e) == "copy_peer_async") calls.push_back(&e);
  }
  ASSERT_EQ(copies.size(), 1u);
  EXPECT_EQ(copies[0]->copy, trace::copy_kind::p2p);
  EXPECT_EQ(copies[0]->src, trace::mem_kind::device);
  EXPECT_EQ(copies[0]->dst, trace::mem_kind::device);
  EXPECT_EQ(copies[0]->bytes, n);
  EXPECT_EQ(copies[0]->device, 1) << "the copy is the source device's work";
  EXPECT_TRUE(copies[0]->async);
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0]->correlation, copies[0]->correlation);
  EXPECT_EQ(calls[0]->device, 1);
}

}  // namespace
}  // namespace ferry
