// The host communicator when something goes wrong: a rank that never calls, abort() from another thread, a
// group destroyed while a rank waits, ranks that disagree. Nothing hangs, every rank learns why.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>

#include "ferry/comm/communicator.hpp"
#include "host_ranks.hpp"

namespace ferry::comm {
namespace {

using testing::host_ranks;
using testing::on_every_rank;
using testing::unmodelled;
using clock_type = std::chrono::steady_clock;

// A bound no healthy wait comes near, far below the 60 s timeout the tests that use it set: a wait that
// ended only by its timeout would exceed it.
constexpr auto not_the_timeout = std::chrono::seconds(30);

// Runs `body`, expecting comm_error; returns it.
template <typename F>
comm_error expect_comm_error(F&& body) {
  try {
    body();
  } catch (const comm_error& e) {
    return e;
  }
  ADD_FAILURE() << "no comm_error";
  return comm_error("none", collective::barrier, -1);
}

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

TEST(host_faults, a_rank_that_never_calls_fails_the_others_within_the_timeout_naming_it) {
  constexpr auto timeout = std::chrono::milliseconds(300);
  host_ranks g(3, unmodelled(timeout));
  const auto start = clock_type::now();  // before either rank's wait began
  on_every_rank(2, [&](int r) {          // rank 2 never calls
    device& d = g.dev(r);
    const stream s = d.make_stream();
    const buffer buf = d.alloc_device(400);
    const event done = g[r].all_reduce(buf, buf, 100, dtype::f32, reduce_op::sum, s);
    const comm_error e = expect_comm_error([&] { done.synchronize(); });
    EXPECT_EQ(e.op(), collective::all_reduce);
    EXPECT_EQ(e.rank(), r);
    const std::string what = e.what();
    EXPECT_TRUE(has(what, "all_reduce #0 on rank " + std::to_string(r))) << what;
    EXPECT_TRUE(has(what, "waiting for rank 2") || has(what, "rank 2 had not arrived")) << what;
    s.synchronize();  // the error was reported once
  });
  EXPECT_GE(clock_type::now() - start, timeout) << "the ranks gave up before the timeout";
  // Every rank, the absent one included, now sees an aborted group and refuses new work at once.
  for (int r = 0; r < 3; ++r) {
    EXPECT_TRUE(g[r].aborted()) << "rank " << r;
    EXPECT_TRUE(has(g[r].abort_reason(), "timed out after 300 ms waiting for rank 2")) << g[r].abort_reason();
  }
  device& d = g.dev(2);
  const stream s = d.make_stream();
  const comm_error later = expect_comm_error([&] { static_cast<void>(g[2].barrier(s)); });
  EXPECT_EQ(later.op(), collective::barrier);
  EXPECT_EQ(later.rank(), 2);
  EXPECT_TRUE(has(later.what(), "barrier on rank 2 of 3: the group was aborted: all_reduce #0"))
      << later.what();
}

TEST(host_faults, abort_from_another_thread_ends_a_waiting_collective_with_its_reason) {
  host_ranks g(2);  // 60 s timeout
  device& d = g.dev(0);
  const stream s = d.make_stream();
  const buffer buf = d.alloc_device(8);
  const auto start = clock_type::now();
  const event done = g[0].all_reduce(buf, buf, 2, dtype::bf16, reduce_op::avg, s);  // rank 1 never joins
  std::thread stopper([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    g[1].abort("the job was cancelled");
  });
  const comm_error e = expect_comm_error([&] { done.synchronize(); });
  stopper.join();
  EXPECT_LT(clock_type::now() - start, not_the_timeout);
  EXPECT_EQ(e.rank(), 0);
  EXPECT_TRUE(has(e.what(),
                  "all_reduce #0 on rank 0 of 2 failed: the group was aborted (abort() on rank 1: the "
                  "job was cancelled); rank 1 had not arrived"))
      << e.what();
  g[0].abort("again");  // idempotent: the first cause stays
  EXPECT_EQ(g[0].abort_reason(), "abort() on rank 1: the job was cancelled");
}

TEST(host_faults, destroying_the_group_while_a_rank_waits_ends_the_wait) {
  host_ranks g(2);  // 60 s timeout
  device& d = g.dev(0);
  const stream s = d.make_stream();
  const buffer buf = d.alloc_device(64);
  const auto start = clock_type::now();
  const event done = g[0].all_gather(buf.view(0, 32), buf, 8, dtype::f32, s);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // rank 0 is waiting in the rendezvous now
  g.comms.clear();
  const comm_error e = expect_comm_error([&] { s.synchronize(); });
  EXPECT_LT(clock_type::now() - start, not_the_timeout);
  EXPECT_EQ(e.op(), collective::all_gather);
  EXPECT_TRUE(has(e.what(), "the group was aborted (the communicator of rank ")) << e.what();
  EXPECT_TRUE(has(e.what(), " was destroyed)")) << e.what();
}

TEST(host_faults, ranks_that_issue_different_collectives_both_fail_naming_both) {
  host_ranks g(2);
  on_every_rank(2, [&](int r) {
    device& d = g.dev(r);
    const stream s = d.make_stream();
    const buffer buf = d.alloc_device(800);
    const event done = g[r].all_reduce(buf, buf, r == 0 ? 100 : 200, dtype::f32, reduce_op::sum, s);
    const comm_error e = expect_comm_error([&] { done.synchronize(); });
    EXPECT_EQ(e.rank(), r);
    EXPECT_TRUE(has(e.what(), "collective #0 differs between ranks")) << e.what();
    EXPECT_TRUE(has(e.what(), "all_reduce sum of 100 f32")) << e.what();
    EXPECT_TRUE(has(e.what(), "all_reduce sum of 200 f32")) << e.what();
  });
}

TEST(host_faults, a_failed_collective_leaves_later_work_on_the_stream_running) {
  host_ranks g(2, unmodelled(std::chrono::milliseconds(100)));
  device& d = g.dev(0);
  const stream s = d.make_stream();
  const buffer buf = d.alloc_device(16);
  static_cast<void>(g[0].barrier(s));  // rank 1 never comes
  d.memset_async(buf, 7, s);
  EXPECT_THROW(s.synchronize(), comm_error);
  std::vector<std::byte> out(16);
  d.copy(pageable_view(out.data(), 16), buf, s);
  EXPECT_EQ(out, std::vector<std::byte>(16, std::byte{7}));
}

}  // namespace
}  // namespace ferry::comm
