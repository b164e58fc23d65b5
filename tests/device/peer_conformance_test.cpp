// Peer copies between devices (device::copy_peer_async, can_access_peer, ordinals), checked on every
// backend named in FERRY_TEST_BACKENDS: on the host backend with a make_host_devices group (seeded jitter,
// link model on); on cuda with GPUs 0, 1 (, 2), each test skipping, saying why, where fewer GPUs are
// visible. The ctest `device_peer_cuda` (label multigpu) runs this suite alone on the cuda backend.
//
// Bytes are checked with ferry's verification pattern, so a shifted, truncated or stale copy cannot
// match; the destination reads only after waiting on an event of the source's stream.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ferry/core/error.hpp"
#include "ferry/core/pattern.hpp"
#include "ferry/core/units.hpp"
#include "ferry/cuda/cuda.hpp"
#include "ferry/device/device.hpp"
#include "support/test_support.hpp"

namespace ferry {
namespace {

using namespace std::chrono_literals;
using testing::backends_under_test;
using testing::message_of;

class peer_copy : public ::testing::TestWithParam<backend> {
 protected:
  /// `n` devices of the backend under test (GPUs 0..n-1 on cuda), or an empty vector when the machine has
  /// fewer GPUs: then the test must GTEST_SKIP (the SKIP_IF_TOO_FEW macro does).
  std::vector<std::unique_ptr<device>> make_devices(int n) {
    if (GetParam() == backend::host) {
      host_device_options o = testing::jittery_host_options(20261123, 0.3, 200us);
      o.model_link = true;
      return make_host_devices(n, o);
    }
    std::vector<std::unique_ptr<device>> out;
    if (cuda_device_count() < n) return out;
    for (int i = 0; i < n; ++i) out.push_back(make_cuda_device(i));
    return out;
  }
};

// Skips the test, saying why, when the cuda backend sees fewer than `n` GPUs.
#define FERRY_PEER_DEVICES(var, n)                                                               \
  std::vector<std::unique_ptr<device>> var = make_devices(n);                                    \
  if (var.empty()) {                                                                             \
    GTEST_SKIP() << "needs " << (n) << " GPUs; the CUDA runtime sees " << cuda_device_count()    \
                 << " (run it on a machine with " << (n) << " or more, e.g. ctest -L multigpu)"; \
  }

// Copies `v` (device memory of `dev`) into a fresh pinned buffer on `s`, synchronizing.
buffer to_host(device& dev, mem_view v, stream_view s) {
  buffer h = dev.alloc_pinned(v.bytes);
  dev.copy(h, v, s);
  return h;
}

// The first byte of `h` that is not byte offset.. of the pattern of `seed`, or nullopt.
std::optional<std::uint64_t> mismatch(const buffer& h, std::uint64_t seed, std::uint64_t offset = 0) {
  return find_pattern_mismatch({h.host_bytes(), h.size()}, seed, offset);
}

TEST_P(peer_copy, devices_are_numbered_by_their_ordinals) {
  FERRY_PEER_DEVICES(devs, 2);
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(devs[static_cast<std::size_t>(i)]->ordinal(), i);
    EXPECT_EQ(devs[static_cast<std::size_t>(i)]->info().ordinal, i);
    EXPECT_EQ(devs[static_cast<std::size_t>(i)]->kind(), GetParam());
  }
}

TEST_P(peer_copy, a_device_is_its_own_peer_and_peer_access_is_symmetric) {
  FERRY_PEER_DEVICES(devs, 2);
  device& a = *devs[0];
  device& b = *devs[1];
  EXPECT_TRUE(a.can_access_peer(a));
  EXPECT_TRUE(b.can_access_peer(b));
  EXPECT_EQ(a.can_access_peer(b), b.can_access_peer(a));
  if (GetParam() == backend::host) {
    EXPECT_TRUE(a.can_access_peer(b)) << "one group's devices are peers";
  }
  std::printf("can_access_peer(0 -> 1) = %s\n", a.can_access_peer(b) ? "true" : "false");
}

TEST_P(peer_copy, a_peer_copy_delivers_every_byte_in_both_directions) {
  FERRY_PEER_DEVICES(devs, 2);
  // An odd size, so the partial last word travels too.
  constexpr std::size_t n = 3 * MiB + 5;
  for (const auto& [from, to] : {std::pair{0, 1}, std::pair{1, 0}}) {
    SCOPED_TRACE(fmt::format("device {} -> device {}", from, to));
    device& src_dev = *devs[static_cast<std::size_t>(from)];
    device& dst_dev = *devs[static_cast<std::size_t>(to)];
    const auto seed = static_cast<std::uint64_t>(40 + from);
    stream src_s = src_dev.make_stream();
    stream dst_s = dst_dev.make_stream();
    buffer src = src_dev.alloc_device(n);
    buffer dst = dst_dev.alloc_device(n);
    buffer sum = dst_dev.alloc_device(sizeof(std::uint64_t));
    dst_dev.memset_async(dst, 0xEE, dst_s);
    dst_s.synchronize();
    event copied = src_dev.make_event();
    src_dev.fill_pattern_async(src, seed, src_s);
    src_dev.copy_peer_async(dst, dst_dev, src, src_s);
    copied.record(src_s);
    dst_s.wait(copied);
    dst_dev.checksum_async(dst, sum, dst_s);
    const buffer sum_h = to_host(dst_dev, sum, dst_s);
    const buffer dst_h = to_host(dst_dev, dst, dst_s);
    std::uint64_t got = 0;
    std::memcpy(&got, sum_h.host_bytes(), sizeof got);
    EXPECT_EQ(got, pattern_checksum(seed, n)) << "the checksum on the destination device";
    const auto bad = mismatch(dst_h, seed);
    EXPECT_FALSE(bad.has_value()) << "first wrong byte at " << *bad;
    src_s.synchronize();
  }
}

TEST_P(peer_copy, a_copy_of_part_of_a_buffer_writes_only_that_part) {
  FERRY_PEER_DEVICES(devs, 2);
  constexpr std::size_t n = MiB;
  constexpr std::size_t src_at = 4096 + 8;
  constexpr std::size_t dst_at = 24;
  constexpr std::size_t count = 300 * KiB + 1;
  device& a = *devs[0];
  device& b = *devs[1];
  stream sa = a.make_stream();
  stream sb = b.make_stream();
  buffer src = a.alloc_device(n);
  buffer dst = b.alloc_device(n);
  b.memset_async(dst, 0x5C, sb);
  sb.synchronize();
  a.fill_pattern_async(src, 77, sa);
  // The views are larger than the copy: the count says how much moves.
  a.copy_peer_async(dst.view(dst_at, n - dst_at), b, src.view(src_at, n - src_at), count, sa);
  sa.synchronize();
  const buffer h = to_host(b, dst, sb);
  const std::byte* p = h.host_bytes();
  for (std::size_t i = 0; i < dst_at; ++i)
    ASSERT_EQ(p[i], std::byte{0x5C}) << "byte " << i << " before the copy";
  const auto bad = find_pattern_mismatch({p + dst_at, count}, 77, src_at);
  EXPECT_FALSE(bad.has_value()) << "first wrong byte at " << *bad;
  for (std::size_t i = dst_at + count; i < n; ++i)
    ASSERT_EQ(p[i], std::byte{0x5C}) << "byte " << i << " after the copy";
}

TEST_P(peer_copy, events_order_a_ping_pong_of_copies_between_two_devices) {
  // Device 0 fills one buffer per round and copies it into a single buffer of device 1, which checksums it
  // into that round's slot. Each copy waits (on device 0's stream) for device 1's checksum of the round
  // before, and each checksum waits (on device 1's stream) for the copy: without both waits a round's
  // checksum would read the next round's bytes, or a half-written buffer.
  FERRY_PEER_DEVICES(devs, 2);
  constexpr int rounds = 12;
  constexpr std::size_t n = 512 * KiB + 8;
  device& a = *devs[0];
  device& b = *devs[1];
  stream sa = a.make_stream();
  stream sb = b.make_stream();
  buffer src = a.alloc_device(n);
  buffer dst = b.alloc_device(n);
  buffer sums = b.alloc_device(rounds * sizeof(std::uint64_t));
  event copied = a.make_event();
  event read = b.make_event();
  for (int r = 0; r < rounds; ++r) {
    a.fill_pattern_async(src, static_cast<std::uint64_t>(1000 + r), sa);
    if (r > 0) sa.wait(read);
    a.copy_peer_async(dst, b, src, sa);
    copied.record(sa);
    sb.wait(copied);
    // A slow reader, so a copy that does not wait for it overwrites what it reads.
    b.spin_async(2ms, sb);
    b.checksum_async(dst, sums.view(static_cast<std::size_t>(r) * 8, 8), sb);
    read.record(sb);
  }
  const buffer h = to_host(b, sums, sb);
  for (int r = 0; r < rounds; ++r) {
    std::uint64_t got = 0;
    std::memcpy(&got, h.host_bytes() + static_cast<std::size_t>(r) * 8, sizeof got);
    EXPECT_EQ(got, pattern_checksum(static_cast<std::uint64_t>(1000 + r), n)) << "round " << r;
  }
  sa.synchronize();
}

TEST_P(peer_copy, a_ring_of_three_devices_moves_every_buffer_one_step) {
  FERRY_PEER_DEVICES(devs, 3);
  constexpr std::size_t n = MiB + 3;
  struct member {
    stream s;
    buffer mine;
    buffer received;
    event sent;
  };
  std::array<member, 3> m;
  for (std::size_t i = 0; i < 3; ++i) {
    device& d = *devs[i];
    m[i] = {d.make_stream(), d.alloc_device(n), d.alloc_device(n), d.make_event()};
    d.fill_pattern_async(m[i].mine, 500 + i, m[i].s);
  }
  // Every hop at once: device i sends to i + 1 on its own stream.
  for (std::size_t i = 0; i < 3; ++i) {
    const std::size_t next = (i + 1) % 3;
    devs[i]->copy_peer_async(m[next].received, *devs[next], m[i].mine, m[i].s);
    m[i].sent.record(m[i].s);
  }
  for (std::size_t i = 0; i < 3; ++i) {
    const std::size_t prev = (i + 2) % 3;
    m[i].s.wait(m[prev].sent);
    const buffer h = to_host(*devs[i], m[i].received, m[i].s);
    const auto bad = mismatch(h, 500 + prev);
    EXPECT_FALSE(bad.has_value()) << "device " << i << ": first wrong byte at " << *bad;
  }
  for (auto& x : m) x.s.synchronize();
}

TEST_P(peer_copy, a_peer_copy_within_one_device_is_a_device_copy) {
  FERRY_PEER_DEVICES(devs, 1);
  device& a = *devs[0];
  constexpr std::size_t n = 256 * KiB + 1;
  stream s = a.make_stream();
  buffer src = a.alloc_device(n);
  buffer dst = a.alloc_device(n);
  a.fill_pattern_async(src, 3, s);
  a.copy_peer_async(dst, a, src, s);
  const buffer h = to_host(a, dst, s);
  const auto bad = mismatch(h, 3);
  EXPECT_FALSE(bad.has_value()) << "first wrong byte at " << *bad;
  EXPECT_MESSAGE_HAS(
      message_of<logic_error>([&] { a.copy_peer_async(src.view(0, MiB / 8), a, src.view(8, MiB / 8), s); }),
      "overlaps");
}

TEST_P(peer_copy, bad_input_is_a_logic_error_that_names_the_values_and_queues_nothing) {
  FERRY_PEER_DEVICES(devs, 2);
  device& a = *devs[0];
  device& b = *devs[1];
  stream sa = a.make_stream();
  stream sb = b.make_stream();
  buffer small = b.alloc_device(MiB);
  buffer big = a.alloc_device(2 * MiB);
  buffer pinned = a.alloc_pinned(MiB);
  buffer pageable = b.alloc_pageable(MiB);
  b.memset_async(small, 0x11, sb);
  sb.synchronize();

  EXPECT_MESSAGE_HAS(message_of<logic_error>([&] { a.copy_peer_async(small, b, big, sa); }),
                     "peer copy of 2.00 MiB does not fit in its destination of 1.00 MiB");
  const std::string past_source =
      message_of<logic_error>([&] { a.copy_peer_async(small, b, big.view(0, MiB / 2), MiB / 2 + 1, sa); });
  EXPECT_MESSAGE_HAS(past_source, "source");
  EXPECT_MESSAGE_HAS(past_source, "524289 bytes");
  EXPECT_MESSAGE_HAS(message_of<logic_error>([&] { a.copy_peer_async(small, b, big, 0, sa); }), "0 bytes");
  const std::string from_pinned = message_of<logic_error>([&] { a.copy_peer_async(small, b, pinned, sa); });
  EXPECT_MESSAGE_HAS(from_pinned, "source is 1.00 MiB of pinned memory");
  EXPECT_MESSAGE_HAS(from_pinned, "copy_async");
  EXPECT_MESSAGE_HAS(message_of<logic_error>([&] { a.copy_peer_async(pageable, b, big.view(0, MiB), sa); }),
                     "destination is 1.00 MiB of pageable memory");
  EXPECT_MESSAGE_HAS(message_of<logic_error>([&] { a.copy_peer_async(mem_view{}, b, big, sa); }),
                     "peer copy destination is a null");
  // The stream must be the source device's.
  const std::string wrong_stream =
      message_of<logic_error>([&] { a.copy_peer_async(small, b, big.view(0, MiB), sb); });
  EXPECT_MESSAGE_HAS(wrong_stream, "from device 0 to device 1: the stream belongs to device 1");
  EXPECT_MESSAGE_HAS(wrong_stream, "stream of its source device");

  if (GetParam() == backend::cuda) {
    // A device of the other backend is never a peer.
    std::unique_ptr<device> emulated = make_host_device();
    buffer far = emulated->alloc_device(MiB);
    EXPECT_FALSE(a.can_access_peer(*emulated));
    EXPECT_MESSAGE_HAS(
        message_of<logic_error>([&] { a.copy_peer_async(far, *emulated, big.view(0, MiB), sa); }),
        "peers must be devices of one backend");
    stream es = emulated->make_stream();
    event foreign = emulated->make_event();
    foreign.record(es);
    EXPECT_MESSAGE_HAS(message_of<logic_error>([&] { sa.wait(foreign); }), "its own backend");
    es.synchronize();
  }

  // Nothing was queued: the destination still holds what it held.
  sa.synchronize();
  const buffer h = to_host(b, small, sb);
  for (std::size_t i = 0; i < MiB; ++i) ASSERT_EQ(h.host_bytes()[i], std::byte{0x11}) << "byte " << i;
}

INSTANTIATE_TEST_SUITE_P(backends, peer_copy, ::testing::ValuesIn(backends_under_test()),
                         testing::backend_test_name);

}  // namespace
}  // namespace ferry
