// The host communicator's collectives over 1 to 4 ranks, each driven by its own thread: the bytes every
// rank ends with, for every dtype, in place and out of place.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "ferry/comm/communicator.hpp"
#include "ferry/comm/float16.hpp"
#include "ferry/core/error.hpp"
#include "host_ranks.hpp"

namespace ferry::comm {
namespace {

using testing::host_ranks;
using testing::on_every_rank;

// Element i of rank r: integers in [-30, 30], so a sum over 4 ranks (at most 120 in magnitude) is exact in
// f16 (integers to 2048) and bf16 (to 256), and a mistake in any rank's part shows in the sum.
float value(int rank, std::size_t i) {
  return static_cast<float>(static_cast<int>((i * 7 + rank * 13) % 61) - 30);
}

// f32 values that are not integers, for an exact comparison with a float sum taken in rank order.
float fine_value(int rank, std::size_t i) {
  return static_cast<float>((i * 2654435761U + static_cast<std::size_t>(rank) * 40503U) % 100003U) * 1.0e-3F -
         50.0F;
}

std::vector<std::byte> encode(dtype t, const std::vector<float>& v) {
  std::vector<std::byte> out(v.size() * size_of(t));
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (t == dtype::f32) {
      std::memcpy(out.data() + i * 4, &v[i], 4);
    } else {
      const std::uint16_t h = t == dtype::f16 ? float_to_f16(v[i]) : float_to_bf16(v[i]);
      std::memcpy(out.data() + i * 2, &h, 2);
    }
  }
  return out;
}

std::vector<float> decode(dtype t, const std::vector<std::byte>& b) {
  std::vector<float> out(b.size() / size_of(t));
  for (std::size_t i = 0; i < out.size(); ++i) {
    if (t == dtype::f32) {
      std::memcpy(&out[i], b.data() + i * 4, 4);
    } else {
      std::uint16_t h = 0;
      std::memcpy(&h, b.data() + i * 2, 2);
      out[i] = t == dtype::f16 ? f16_to_float(h) : bf16_to_float(h);
    }
  }
  return out;
}

void upload(device& d, const buffer& dst, const std::vector<std::byte>& bytes, stream_view s) {
  std::vector<std::byte> copy = bytes;
  d.copy(dst, pageable_view(copy.data(), copy.size()), s);
}

std::vector<std::byte> download(device& d, mem_view src, std::size_t bytes, stream_view s) {
  std::vector<std::byte> out(bytes);
  d.copy(pageable_view(out.data(), bytes), src.subview(0, bytes), s);
  return out;
}

// The relative error bound of one rounding to `t` (half a unit in the last place), plus one rounding to
// float before it.
double rounding_bound(dtype t) {
  const double f32 = std::ldexp(1.0, -24);
  if (t == dtype::f16) return std::ldexp(1.0, -11) + 2 * f32;
  if (t == dtype::bf16) return std::ldexp(1.0, -8) + 2 * f32;
  return 2 * f32;
}

struct reduce_case {
  int ranks;
  dtype type;
  reduce_op op;
  bool in_place;
};

std::string case_name(const ::testing::TestParamInfo<reduce_case>& info) {
  const reduce_case& c = info.param;
  return std::to_string(c.ranks) + "_ranks_" + std::string(to_string(c.type)) + "_" +
         std::string(to_string(c.op)) + (c.in_place ? "_in_place" : "_out_of_place");
}

class all_reduce_test : public ::testing::TestWithParam<reduce_case> {};

// Sums of integers are exact in every dtype; averages are within one rounding of the exact quotient (and
// exact where n is a power of two).
TEST_P(all_reduce_test, every_rank_ends_with_the_sum_or_average_of_every_ranks_elements) {
  const reduce_case c = GetParam();
  host_ranks g(c.ranks);
  // More elements than one block of the reduction (1024), not a multiple of the rank count; and 1 element,
  // fewer than the ranks.
  for (const std::size_t count : {std::size_t{3001}, std::size_t{1}}) {
    on_every_rank(c.ranks, [&](int r) {
      device& d = g.dev(r);
      const stream s = d.make_stream();
      const std::size_t bytes = count * size_of(c.type);
      std::vector<float> mine(count);
      for (std::size_t i = 0; i < count; ++i) mine[i] = value(r, i);
      const buffer send = d.alloc_device(bytes);
      const buffer recv = d.alloc_device(bytes);
      upload(d, send, encode(c.type, mine), s);
      d.memset_async(recv, 0xA5, s);
      const mem_view out = c.in_place ? send.view() : recv.view();
      event done = g[r].all_reduce(send, out, count, c.type, c.op, s);
      done.synchronize();
      const std::vector<float> got = decode(c.type, download(d, out, bytes, s));
      int wrong = 0;
      for (std::size_t i = 0; i < count; ++i) {
        double exact = 0;
        for (int k = 0; k < c.ranks; ++k) exact += value(k, i);
        if (c.op == reduce_op::avg) exact /= c.ranks;
        const double err = std::fabs(got[i] - exact);
        if (err > std::fabs(exact) * rounding_bound(c.type) && wrong++ < 5)
          ADD_FAILURE() << "rank " << r << " element " << i << " of " << count << ": " << got[i]
                        << ", expected " << exact;
      }
      EXPECT_EQ(wrong, 0) << "rank " << r;
      if (c.op == reduce_op::sum || (c.ranks & (c.ranks - 1)) == 0) {
        // Exact: the sum of integers, or their quotient by a power of two.
        for (std::size_t i = 0; i < count; ++i) {
          double exact = 0;
          for (int k = 0; k < c.ranks; ++k) exact += value(k, i);
          if (c.op == reduce_op::avg) exact /= c.ranks;
          ASSERT_EQ(got[i], exact) << "rank " << r << " element " << i;
        }
      }
    });
  }
}

std::vector<reduce_case> reduce_cases() {
  std::vector<reduce_case> out;
  for (int n = 1; n <= 4; ++n)
    for (dtype t : {dtype::f32, dtype::f16, dtype::bf16})
      for (reduce_op op : {reduce_op::sum, reduce_op::avg})
        for (bool in_place : {false, true}) out.push_back({n, t, op, in_place});
  return out;
}

INSTANTIATE_TEST_SUITE_P(host, all_reduce_test, ::testing::ValuesIn(reduce_cases()), case_name);

TEST(host_collectives, an_f32_all_reduce_is_the_float_sum_in_rank_order_on_every_rank) {
  constexpr int n = 3;
  constexpr std::size_t count = 5000;
  host_ranks g(n);
  on_every_rank(n, [&](int r) {
    device& d = g.dev(r);
    const stream s = d.make_stream();
    std::vector<float> mine(count);
    for (std::size_t i = 0; i < count; ++i) mine[i] = fine_value(r, i);
    const buffer buf = d.alloc_device(count * 4);
    upload(d, buf, encode(dtype::f32, mine), s);
    g[r].all_reduce(buf, buf, count, dtype::f32, reduce_op::sum, s).synchronize();
    const std::vector<float> got = decode(dtype::f32, download(d, buf, count * 4, s));
    for (std::size_t i = 0; i < count; ++i) {
      float sum = fine_value(0, i);
      for (int k = 1; k < n; ++k) sum += fine_value(k, i);
      ASSERT_EQ(got[i], sum) << "rank " << r << " element " << i;  // the same float on every rank
    }
  });
}

class gather_test : public ::testing::TestWithParam<int> {};

TEST_P(gather_test, all_gather_puts_every_ranks_part_in_rank_order_in_place_and_out_of_place) {
  const int n = GetParam();
  host_ranks g(n);
  for (const dtype t : {dtype::f32, dtype::bf16}) {
    for (const bool in_place : {false, true}) {
      constexpr std::size_t count = 1500;
      on_every_rank(n, [&](int r) {
        device& d = g.dev(r);
        const stream s = d.make_stream();
        const std::size_t part = count * size_of(t);
        std::vector<float> mine(count);
        for (std::size_t i = 0; i < count; ++i) mine[i] = value(r, i);
        const buffer send = d.alloc_device(part);
        const buffer recv = d.alloc_device(part * static_cast<std::size_t>(n));
        d.memset_async(recv, 0xA5, s);
        const mem_view src = in_place ? recv.view(static_cast<std::size_t>(r) * part, part) : send.view();
        upload(d, send, encode(t, mine), s);
        if (in_place) d.copy_async(src, send, s);
        g[r].all_gather(src, recv, count, t, s).synchronize();
        const std::vector<float> got = decode(t, download(d, recv, part * static_cast<std::size_t>(n), s));
        for (int k = 0; k < n; ++k)
          for (std::size_t i = 0; i < count; ++i)
            ASSERT_EQ(got[static_cast<std::size_t>(k) * count + i], value(k, i))
                << "rank " << r << " part " << k << " element " << i << (in_place ? " in place" : "");
      });
    }
  }
}

TEST_P(gather_test, broadcast_from_every_root_gives_every_rank_roots_elements) {
  const int n = GetParam();
  host_ranks g(n);
  constexpr std::size_t count = 2048 + 3;
  for (int root = 0; root < n; ++root) {
    for (const bool in_place : {false, true}) {
      on_every_rank(n, [&](int r) {
        device& d = g.dev(r);
        const stream s = d.make_stream();
        std::vector<float> mine(count);
        for (std::size_t i = 0; i < count; ++i) mine[i] = fine_value(r, i);
        const buffer send = d.alloc_device(count * 2);
        const buffer recv = d.alloc_device(count * 2);
        upload(d, send, encode(dtype::f16, mine), s);
        d.memset_async(recv, 0xA5, s);
        // Only root's send is read (and checked): the other ranks pass none.
        mem_view src{};
        if (r == root) src = in_place ? recv.view() : send.view();
        if (r == root && in_place) d.copy_async(recv, send, s);
        g[r].broadcast(src, recv, count, dtype::f16, root, s).synchronize();
        const std::vector<std::byte> got = download(d, recv, count * 2, s);
        std::vector<float> roots(count);
        for (std::size_t i = 0; i < count; ++i) roots[i] = fine_value(root, i);
        ASSERT_EQ(got, encode(dtype::f16, roots)) << "rank " << r << " root " << root;
      });
    }
  }
}

// Integer element i of rank r as 64 bits: large (above 2^53, where a double or a pair of floats would lose
// bits, and far above fp32's exact 2^24), so a sum over the ranks wraps past the type's top.
std::uint64_t int_value(int rank, std::size_t i) {
  return 0xF000'0000'0000'0000ULL + i * 0x1'0000'0001ULL +
         static_cast<std::uint64_t>(rank) * 0x0123'4567'89AB'CDEFULL;
}

// `count` elements of integer dtype `t` (i32 keeps the low 32 bits), as the bytes a rank holds.
std::vector<std::byte> int_bytes(dtype t, const std::vector<std::uint64_t>& v) {
  std::vector<std::byte> out(v.size() * size_of(t));
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (t == dtype::i32) {
      const auto w = static_cast<std::uint32_t>(v[i]);
      std::memcpy(out.data() + i * 4, &w, 4);
    } else {
      std::memcpy(out.data() + i * 8, &v[i], 8);
    }
  }
  return out;
}

// Integer dtypes cross between ranks as what they are: sums are exact modulo 2^bits (two's complement for
// i32/i64, as NCCL's ncclInt32/ncclInt64/ncclUint64), gathers and broadcasts move every bit.
TEST_P(gather_test, integer_dtypes_sum_gather_and_broadcast_exactly) {
  const int n = GetParam();
  host_ranks g(n);
  constexpr std::size_t count = 1500;  // more than one block of the reduction
  for (const dtype t : {dtype::i32, dtype::i64, dtype::u64}) {
    on_every_rank(n, [&](int r) {
      device& d = g.dev(r);
      const stream s = d.make_stream();
      const std::size_t part = count * size_of(t);
      std::vector<std::uint64_t> mine(count), sum(count), roots(count), all;
      for (std::size_t i = 0; i < count; ++i) {
        mine[i] = int_value(r, i);
        roots[i] = int_value(n - 1, i);
        for (int k = 0; k < n; ++k) sum[i] += int_value(k, i);  // wraps modulo 2^64 (2^32 once truncated)
      }
      for (int k = 0; k < n; ++k)
        for (std::size_t i = 0; i < count; ++i) all.push_back(int_value(k, i));
      const buffer a = d.alloc_device(part);
      const buffer b = d.alloc_device(part * static_cast<std::size_t>(n));
      upload(d, a, int_bytes(t, mine), s);
      g[r].all_reduce(a, a, count, t, reduce_op::sum, s).synchronize();
      ASSERT_EQ(download(d, a, part, s), int_bytes(t, sum)) << to_string(t) << " sum on rank " << r;
      upload(d, a, int_bytes(t, mine), s);
      g[r].all_gather(a, b, count, t, s).synchronize();
      ASSERT_EQ(download(d, b, part * static_cast<std::size_t>(n), s), int_bytes(t, all))
          << to_string(t) << " gather on rank " << r;
      g[r].broadcast(a, a, count, t, n - 1, s).synchronize();
      ASSERT_EQ(download(d, a, part, s), int_bytes(t, roots)) << to_string(t) << " broadcast on rank " << r;
    });
  }
}

TEST(host_collectives, an_integer_average_is_refused_naming_the_dtype) {
  host_ranks g(1);
  device& d = g.dev(0);
  const stream s = d.make_stream();
  const buffer a = d.alloc_device(64);
  for (const dtype t : {dtype::i32, dtype::i64, dtype::u64}) {
    try {
      static_cast<void>(g[0].all_reduce(a, a, 2, t, reduce_op::avg, s));
      ADD_FAILURE() << "avg of " << to_string(t) << " was accepted";
    } catch (const logic_error& e) {
      EXPECT_NE(std::string(e.what()).find(std::string("avg of ") + std::string(to_string(t))),
                std::string::npos)
          << e.what();
    }
  }
}

INSTANTIATE_TEST_SUITE_P(host, gather_test, ::testing::Values(1, 2, 3, 4),
                         [](const ::testing::TestParamInfo<int>& p) {
                           return std::to_string(p.param) + "_ranks";
                         });

// Rank 1 sets a flag in a host function before its barrier; rank 0 reads it in a host function after its
// own barrier, which cannot complete before rank 1 reached the barrier on its stream.
TEST(host_collectives, a_barrier_completes_on_a_rank_only_after_every_rank_reached_it) {
  constexpr int n = 3;
  host_ranks g(n);
  for (int round = 0; round < 5; ++round) {
    std::atomic<int> reached{0};
    std::atomic<int> seen_by_rank0{-1};
    on_every_rank(n, [&](int r) {
      device& d = g.dev(r);
      const stream s = d.make_stream();
      if (r != 0) {
        d.spin_async(std::chrono::milliseconds(5 * r), s);  // arrive late
        d.launch_host_func(s, [&] { reached.fetch_add(1); });
      }
      g[r].barrier(s);
      if (r == 0) d.launch_host_func(s, [&] { seen_by_rank0 = reached.load(); });
      s.synchronize();
    });
    EXPECT_EQ(seen_by_rank0.load(), n - 1) << "round " << round;
  }
}

// A rank queues many more collectives than the rendezvous has slots before the other starts: the slots are
// reused, and every collective still meets its partner by number (element k sums the two ranks' element k).
TEST(host_collectives, more_collectives_than_slots_each_meet_their_partner_by_number) {
  constexpr int n = 2;
  constexpr int rounds = 150;  // more than rendezvous::ring (64)
  host_ranks g(n);
  on_every_rank(n, [&](int r) {
    device& d = g.dev(r);
    const stream s = d.make_stream();
    std::vector<float> mine(rounds);
    for (int k = 0; k < rounds; ++k) mine[static_cast<std::size_t>(k)] = static_cast<float>(k * 10 + r);
    const buffer buf = d.alloc_device(4 * rounds);
    upload(d, buf, encode(dtype::f32, mine), s);
    if (r == 1) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    for (int k = 0; k < rounds; ++k) {
      const mem_view one = buf.view(static_cast<std::size_t>(k) * 4, 4);
      g[r].all_reduce(one, one, 1, dtype::f32, reduce_op::sum, s);
    }
    const std::vector<float> got = decode(dtype::f32, download(d, buf, 4 * rounds, s));
    for (int k = 0; k < rounds; ++k)
      ASSERT_EQ(got[static_cast<std::size_t>(k)], static_cast<float>(k * 20 + 1))
          << "rank " << r << " collective " << k;
  });
}

TEST(host_collectives, the_completion_event_is_recorded_after_the_collective_on_the_callers_stream) {
  constexpr int n = 2;
  host_ranks g(n);
  on_every_rank(n, [&](int r) {
    device& d = g.dev(r);
    const stream s = d.make_stream();
    const stream other = d.make_stream();
    const buffer buf = d.alloc_device(4 * 1000);
    upload(d, buf, encode(dtype::f32, std::vector<float>(1000, static_cast<float>(r + 1))), s);
    const event done = g[r].all_reduce(buf, buf, 1000, dtype::f32, reduce_op::sum, s);
    EXPECT_FALSE(done.timing());
    // Another stream that waits on the event reads the reduced values.
    other.wait(done);
    const std::vector<float> got = decode(dtype::f32, download(d, buf, 4 * 1000, other));
    for (float v : got) ASSERT_EQ(v, 3.0F) << "rank " << r;
  });
}

}  // namespace
}  // namespace ferry::comm
