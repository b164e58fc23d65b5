// What every backend shares: names, the link model's arithmetic, and the argument checks of the base class,
// which reject misuse before any work starts (shown on the host backend).
#include "ferry/comm/communicator.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <vector>

#include "ferry/core/error.hpp"
#include "host_ranks.hpp"

namespace ferry::comm {
namespace {

using testing::host_ranks;
using testing::on_every_rank;

// Runs `body`, expecting logic_error; returns its message.
template <typename F>
std::string logic_message(F&& body) {
  try {
    body();
  } catch (const logic_error& e) {
    return e.what();
  }
  ADD_FAILURE() << "no logic_error";
  return {};
}

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

TEST(comm_names, dtypes_collectives_and_reductions_have_names_and_sizes) {
  EXPECT_EQ(size_of(dtype::f32), 4u);
  EXPECT_EQ(size_of(dtype::f16), 2u);
  EXPECT_EQ(size_of(dtype::bf16), 2u);
  EXPECT_EQ(to_string(dtype::bf16), "bf16");
  EXPECT_EQ(to_string(reduce_op::avg), "avg");
  EXPECT_EQ(to_string(collective::all_gather), "all_gather");
  for (const char* t : {"f32", "fp32", "float"}) EXPECT_EQ(parse_dtype(t), dtype::f32) << t;
  for (const char* t : {"f16", "fp16", "half"}) EXPECT_EQ(parse_dtype(t), dtype::f16) << t;
  EXPECT_EQ(parse_dtype("bf16"), dtype::bf16);
  EXPECT_EQ(parse_dtype("i32"), dtype::i32);
  EXPECT_EQ(parse_dtype("i64"), dtype::i64);
  EXPECT_EQ(parse_dtype("u64"), dtype::u64);
  EXPECT_EQ(size_of(dtype::i32), 4U);
  EXPECT_EQ(size_of(dtype::i64), 8U);
  EXPECT_EQ(size_of(dtype::u64), 8U);
  EXPECT_TRUE(has(logic_message([] { static_cast<void>(parse_dtype("int8")); }), "unknown dtype \"int8\""));
}

TEST(comm_link_model, modelled_time_is_latency_plus_bytes_times_the_bus_share_over_bus_bandwidth) {
  comm_link l;
  l.bus_gbps = 2.0;
  l.latency = std::chrono::microseconds(10);
  using std::chrono::nanoseconds;
  // 1e9 bytes at 2 GB/s is 0.5 s of bus time; an all-reduce over 4 ranks moves 2 * 3/4 of it.
  EXPECT_EQ(l.modelled_time(collective::all_reduce, 1'000'000'000, 4), nanoseconds(750'000'000 + 10'000));
  EXPECT_EQ(l.modelled_time(collective::all_reduce, 1'000'000'000, 2), nanoseconds(500'000'000 + 10'000));
  EXPECT_EQ(l.modelled_time(collective::all_reduce, 1'000'000'000, 1), nanoseconds(10'000));
  EXPECT_EQ(l.modelled_time(collective::all_gather, 1'000'000'000, 4), nanoseconds(375'000'000 + 10'000));
  EXPECT_EQ(l.modelled_time(collective::broadcast, 1'000'000'000, 4), nanoseconds(500'000'000 + 10'000));
  EXPECT_EQ(l.modelled_time(collective::barrier, 0, 4), nanoseconds(10'000));
  EXPECT_EQ(comm_link::nvlink().name, "nvlink");
  EXPECT_GT(comm_link::nvlink().bus_gbps, comm_link::host_memory().bus_gbps);
  l.bus_gbps = 0;
  EXPECT_TRUE(has(logic_message([&] { static_cast<void>(l.modelled_time(collective::broadcast, 1, 2)); }),
                  "bus_gbps = 0"));
}

TEST(comm_checks, a_collective_refuses_memory_that_is_not_device_memory_naming_its_kind) {
  host_ranks g(2);
  device& d = g.dev(0);
  const stream s = d.make_stream();
  const buffer pinned = d.alloc_pinned(400);
  const buffer dev = d.alloc_device(400);
  const std::string m =
      logic_message([&] { g[0].all_reduce(pinned, dev, 100, dtype::f32, reduce_op::sum, s); });
  EXPECT_TRUE(has(m, "all_reduce on rank 0: the send view is pinned memory")) << m;
  const std::string n =
      logic_message([&] { g[0].all_reduce(dev, mem_view{}, 100, dtype::f32, reduce_op::sum, s); });
  EXPECT_TRUE(has(n, "the recv view is null")) << n;
}

TEST(comm_checks, a_view_too_small_for_the_count_is_refused_naming_both_sizes) {
  host_ranks g(3);
  device& d = g.dev(1);
  const stream s = d.make_stream();
  const buffer small = d.alloc_device(396);
  const buffer big = d.alloc_device(4000);
  std::string m = logic_message([&] { g[1].all_reduce(big, small, 100, dtype::f32, reduce_op::avg, s); });
  EXPECT_TRUE(
      has(m, "all_reduce on rank 1: the recv view of 396 bytes cannot hold 100 f32 elements (400 bytes)"))
      << m;
  // An all-gather's recv holds every rank's part.
  m = logic_message([&] { g[1].all_gather(big.view(0, 200), small, 100, dtype::f16, s); });
  EXPECT_TRUE(has(m, "the recv view of 396 bytes cannot hold 300 f16 elements (600 bytes)")) << m;
  m = logic_message([&] { g[1].all_reduce(big, big, 0, dtype::f32, reduce_op::sum, s); });
  EXPECT_TRUE(has(m, "all_reduce of 0 elements on rank 1")) << m;
}

TEST(comm_checks, a_root_out_of_range_is_refused_naming_the_root_and_the_group_size) {
  host_ranks g(2);
  device& d = g.dev(0);
  const stream s = d.make_stream();
  const buffer buf = d.alloc_device(64);
  for (int root : {-1, 2}) {
    const std::string m = logic_message([&] { g[0].broadcast(buf, buf, 16, dtype::f32, root, s); });
    EXPECT_TRUE(has(m, "broadcast on rank 0: root " + std::to_string(root) +
                           " is not a rank of this group of 2 (0 to 1)"))
        << m;
  }
  // A non-root rank's send is not read, so not checked; its recv is.
  const std::string m = logic_message([&] { g[0].broadcast(mem_view{}, mem_view{}, 16, dtype::f32, 1, s); });
  EXPECT_TRUE(has(m, "the recv view is null")) << m;
}

TEST(comm_checks, overlapping_send_and_recv_must_be_the_in_place_layout) {
  host_ranks g(2);
  device& d = g.dev(1);
  const stream s = d.make_stream();
  const buffer buf = d.alloc_device(1024);
  std::string m = logic_message(
      [&] { g[1].all_reduce(buf.view(0, 400), buf.view(4, 400), 100, dtype::f32, reduce_op::sum, s); });
  EXPECT_TRUE(has(m, "overlap without being the same memory")) << m;
  // In place, an all-gather's send is this rank's part of recv: rank 1's starts 100 elements in.
  m = logic_message([&] { g[1].all_gather(buf.view(0, 400), buf.view(0, 800), 100, dtype::f32, s); });
  EXPECT_TRUE(has(m, "all_gather on rank 1: send")) << m;
  EXPECT_TRUE(has(m, "is not this rank's part of it")) << m;
}

TEST(comm_checks, a_stream_of_another_device_is_refused) {
  host_ranks g(2);
  const stream other = g.dev(1).make_stream();
  const buffer buf = g.dev(0).alloc_device(64);
  const std::string m = logic_message([&] { g[0].barrier(other); });
  EXPECT_TRUE(has(m, "barrier on rank 0 of 2: the stream belongs to another device")) << m;
}

// The checks run before a collective is numbered, so a refused call does not shift the matching of the
// ranks' later collectives.
TEST(comm_checks, refused_calls_leave_the_group_usable) {
  host_ranks g(2);
  on_every_rank(2, [&](int r) {
    device& d = g.dev(r);
    const stream s = d.make_stream();
    const buffer buf = d.alloc_device(8);
    if (r == 0) {
      EXPECT_THROW(g[r].all_reduce(buf, buf, 3, dtype::f32, reduce_op::sum, s), logic_error);
    }
    std::vector<float> v{static_cast<float>(r + 1), 10.0F};
    d.copy(buf, pageable_view(v.data(), 8), s);
    g[r].all_reduce(buf, buf, 2, dtype::f32, reduce_op::sum, s).synchronize();
    d.copy(pageable_view(v.data(), 8), buf, s);
    EXPECT_EQ(v, (std::vector<float>{3.0F, 20.0F})) << "rank " << r;
  });
}

// Records the reduction each all-reduce reaches the backend with; the other collectives do nothing.
class recording : public communicator {
 public:
  recording(device& dev, int size) : communicator(dev, 0, size) {}
  [[nodiscard]] std::string_view backend_name() const noexcept override { return "recording"; }
  void abort(const std::string&) noexcept override {}
  [[nodiscard]] bool aborted() const noexcept override { return false; }
  std::vector<reduce_op> ops;

 protected:
  void do_all_reduce(const void*, void*, std::size_t, dtype, reduce_op op, stream_view) override {
    ops.push_back(op);
  }
  void do_all_gather(const void*, void*, std::size_t, dtype, stream_view) override {}
  void do_broadcast(const void*, void*, std::size_t, dtype, int, stream_view) override {}
  void do_barrier(stream_view) override {}
};

TEST(comm_group, a_group_of_one_averages_by_summing_in_place_by_nothing_and_a_larger_group_still_averages) {
  host_ranks g(1);
  device& d = g.dev(0);
  const stream s = d.make_stream();
  const buffer buf = d.alloc_device(16);
  const buffer other = d.alloc_device(16);
  for (const int size : {1, 2}) {
    recording c(d, size);
    for (const dtype t : {dtype::f32, dtype::f16, dtype::bf16}) {
      static_cast<void>(c.all_reduce(buf, buf, 2, t, reduce_op::avg, s));
      static_cast<void>(c.all_reduce(buf, buf, 2, t, reduce_op::sum, s));
    }
    static_cast<void>(c.all_reduce(buf, other, 2, dtype::f32, reduce_op::avg, s));
    // In place over one rank there is nothing to do (not even a copy); out of place, the sum copies.
    const std::vector<reduce_op> want =
        size == 1 ? std::vector<reduce_op>{reduce_op::sum}
                  : std::vector<reduce_op>{reduce_op::avg, reduce_op::sum, reduce_op::avg, reduce_op::sum,
                                           reduce_op::avg, reduce_op::sum, reduce_op::avg};
    EXPECT_EQ(c.ops, want) << "group of " << size;
  }
  // The host group of one still returns the values, as a mean over one rank must.
  std::vector<float> v{1.5F, -2.25F, 3.0F, 1e30F};
  d.copy(buf, pageable_view(v.data(), 16), s);
  g[0].all_reduce(buf, buf, 4, dtype::f32, reduce_op::avg, s).synchronize();
  std::vector<float> back(4);
  d.copy(pageable_view(back.data(), 16), buf, s);
  EXPECT_EQ(back, v);
}

TEST(comm_group, make_host_group_refuses_no_devices_a_repeated_device_and_bad_options) {
  const auto d0 = make_host_device();
  const auto d1 = make_host_device();
  EXPECT_TRUE(
      has(logic_message([] { static_cast<void>(make_host_group({})); }), "make_host_group of no devices"));
  std::vector<device*> twice{d0.get(), d1.get(), d0.get()};
  EXPECT_TRUE(has(logic_message([&] { static_cast<void>(make_host_group(twice)); }),
                  "device 2 (rank 2) is already an earlier rank's"));
  std::vector<device*> with_null{d0.get(), nullptr};
  EXPECT_TRUE(has(logic_message([&] { static_cast<void>(make_host_group(with_null)); }),
                  "device 1 (rank 1) is null"));
  std::vector<device*> two{d0.get(), d1.get()};
  comm_options o;
  o.timeout = std::chrono::milliseconds(0);
  EXPECT_TRUE(has(logic_message([&] { static_cast<void>(make_host_group(two, o)); }), "timeout = 0 ms"));
  o = {};
  o.link.bus_gbps = -3;
  EXPECT_TRUE(has(logic_message([&] { static_cast<void>(make_host_group(two, o)); }), "bus_gbps = -3"));
  o.link.model = false;  // an unmodelled link's figures are not used
  const auto ranks = make_host_group(two, o);
  ASSERT_EQ(ranks.size(), 2u);
  EXPECT_EQ(ranks[1]->rank(), 1);
  EXPECT_EQ(ranks[1]->size(), 2);
  EXPECT_EQ(&ranks[1]->dev(), d1.get());
  EXPECT_EQ(ranks[0]->backend_name(), "host");
  EXPECT_FALSE(ranks[0]->aborted());
  EXPECT_EQ(ranks[0]->abort_reason(), "");
}

TEST(comm_group, nccl_availability_is_reported_with_a_reason_when_absent) {
  std::string reason;
  if (!nccl_available(&reason)) {
    EXPECT_FALSE(reason.empty());
  }
}

}  // namespace
}  // namespace ferry::comm
