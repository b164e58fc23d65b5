// The store bootstrap (a job over a key-value store, as torch.distributed's) and the host group over the
// processes of a job, with threads standing in for the processes and a memory store between them: the
// collectives' bytes, a process that never arrives or gives up failing the others with its name, and
// a reducer over the processes averaging exactly.
#include <gtest/gtest.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "ferry/comm/bootstrap.hpp"
#include "ferry/comm/communicator.hpp"
#include "ferry/comm/group.hpp"
#include "ferry/comm/reducer.hpp"
#include "ferry/core/error.hpp"
#include "ferry/device/device.hpp"
#include "support/test_support.hpp"

namespace ferry::comm {
namespace {

using namespace std::chrono_literals;
using testing::message_of;

// Runs fn(rank) on `n` threads, one per process of the job; rethrows the first failure.
void each_process(int n, const std::function<void(int)>& fn) {
  std::vector<std::thread> threads;
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      try {
        fn(r);
      } catch (...) {
        errors[static_cast<std::size_t>(r)] = std::current_exception();
      }
    });
  for (std::thread& t : threads) t.join();
  for (const std::exception_ptr& e : errors)
    if (e) std::rethrow_exception(e);
}

std::vector<std::byte> bytes_of(std::string_view s) {
  std::vector<std::byte> out(s.size());
  std::memcpy(out.data(), s.data(), s.size());
  return out;
}

TEST(store_bootstrap, broadcasts_gathers_and_places_processes_like_any_bootstrap) {
  const auto store = make_memory_store();
  each_process(3, [&](int r) {
    const auto job = make_store_bootstrap(store, r, 3, "ferry/t", 10s);
    EXPECT_EQ(job->rank(), r);
    EXPECT_EQ(job->size(), 3);
    EXPECT_EQ(job->name(), "store");
    std::vector<std::byte> b = bytes_of(r == 1 ? "one" : "???");
    job->broadcast(b, 1);
    EXPECT_EQ(b, bytes_of("one"));
    const std::vector<std::byte> all = job->all_gather(bytes_of(std::to_string(r)));
    EXPECT_EQ(all, bytes_of("012"));
    EXPECT_EQ(all_gather_text(*job, std::string(static_cast<std::size_t>(r), 'x')),
              (std::vector<std::string>{"", "x", "xx"}));
    const host_place place = place_on_host(*job);
    EXPECT_EQ(place.local_rank, r);
    EXPECT_EQ(place.local_size, 3);
    // Many collectives in a row: each process erases its old keys, and nothing is read twice.
    for (int i = 0; i < 50; ++i) EXPECT_EQ(job->all_gather(bytes_of(std::to_string(r))), bytes_of("012"));
  });
}

TEST(store_bootstrap, agree_ready_names_the_process_that_is_not_ready_on_every_process) {
  const auto store = make_memory_store();
  each_process(2, [&](int r) {
    const auto job = make_store_bootstrap(store, r, 2, "ferry/ready", 10s);
    const std::string why =
        message_of<comm_error>([&] { agree_ready(*job, "opening", r == 1 ? "no GPU on host h" : ""); });
    EXPECT_MESSAGE_HAS(why, "opening over 2 processes failed on 1 of them: process 1 of 2: no GPU on host h");
  });
}

TEST(store_bootstrap, a_process_that_never_writes_fails_the_others_at_the_timeout_naming_it_and_the_key) {
  const auto store = make_memory_store();
  const auto job = make_store_bootstrap(store, 0, 2, "ferry/late", 300ms);
  const auto start = std::chrono::steady_clock::now();
  const std::string why = message_of<comm_error>([&] { static_cast<void>(job->all_gather(bytes_of("a"))); });
  EXPECT_GE(std::chrono::steady_clock::now() - start, 300ms);
  EXPECT_MESSAGE_HAS(why,
                     "bootstrap all_gather #0 on process 0 of 2: process 1 did not write its part within "
                     "300 ms (key 'ferry/late/0/1' is not in the store)");
}

TEST(store_bootstrap, a_process_that_aborts_fails_the_others_at_once_with_its_reason) {
  const auto store = make_memory_store();
  const auto waiting = make_store_bootstrap(store, 0, 2, "ferry/abort", 60s);
  const auto giving_up = make_store_bootstrap(store, 1, 2, "ferry/abort", 60s);
  std::thread t([&] {
    std::this_thread::sleep_for(50ms);
    giving_up->abort("KeyboardInterrupt in the training loop");
  });
  // A 60 s timeout: the abort's reason in the message, not the timeout's, shows it was seen at once.
  const std::string why =
      message_of<comm_error>([&] { static_cast<void>(waiting->all_gather(bytes_of("a"))); });
  t.join();
  EXPECT_MESSAGE_HAS(why, "the job was aborted by process 1 of 2: KeyboardInterrupt in the training loop");
}

TEST(store_bootstrap, refuses_bad_arguments_naming_them) {
  const auto store = make_memory_store();
  EXPECT_MESSAGE_HAS(
      message_of<logic_error>([&] { static_cast<void>(make_store_bootstrap(store, 2, 2, "p", 1s)); }),
      "rank 2 of a job of 2 processes: ranks are 0 to 1");
  EXPECT_MESSAGE_HAS(
      message_of<logic_error>([&] { static_cast<void>(make_store_bootstrap(store, 0, 0, "p", 1s)); }),
      "a job of 0 processes");
  EXPECT_MESSAGE_HAS(
      message_of<logic_error>([&] { static_cast<void>(make_store_bootstrap(store, 0, 1, "", 1s)); }),
      "the key prefix is empty");
  EXPECT_MESSAGE_HAS(
      message_of<logic_error>([&] { static_cast<void>(make_store_bootstrap(store, 0, 1, "p", 0s)); }),
      "timeout 0 ms must be positive");
  EXPECT_MESSAGE_HAS(
      message_of<logic_error>([&] { static_cast<void>(make_store_bootstrap(nullptr, 0, 1, "p", 1s)); }),
      "the store is null");
}

comm_options unmodelled(std::chrono::milliseconds timeout = 60s) {
  comm_options o;
  o.timeout = timeout;
  o.link.model = false;
  return o;
}

// Device memory of the host backend is host memory.
std::vector<float> read_floats(const buffer& b, std::size_t n) {
  std::vector<float> out(n);
  std::memcpy(out.data(), b.data(), n * sizeof(float));
  return out;
}

class process_host_group_sizes : public ::testing::TestWithParam<int> {};

// 3 processes, and 8 as a data-parallel job on every GPU of a host has.
INSTANTIATE_TEST_SUITE_P(processes, process_host_group_sizes, ::testing::Values(3, 8));

TEST_P(process_host_group_sizes, collectives_over_processes_give_every_process_the_same_bytes) {
  const auto store = make_memory_store();
  const int n = GetParam();
  constexpr std::size_t count = 1000;
  std::vector<std::vector<float>> results(static_cast<std::size_t>(n));
  each_process(n, [&](int r) {
    std::shared_ptr<bootstrap> job = make_store_bootstrap(store, r, n, "ferry/g", 20s);
    const auto dev = make_host_device();
    const auto comm = open_group(job, *dev, unmodelled());
    EXPECT_EQ(comm->rank(), r);
    EXPECT_EQ(comm->size(), n);
    EXPECT_EQ(comm->backend_name(), "host");
    stream s = dev->make_stream();
    buffer x = dev->alloc_device(count * sizeof(float));
    std::vector<float> mine(count);
    for (std::size_t i = 0; i < count; ++i) mine[i] = 0.1F * static_cast<float>(i) + static_cast<float>(r);
    std::memcpy(static_cast<std::byte*>(x.data()), mine.data(), count * sizeof(float));
    comm->all_reduce(x.view(), x.view(), count, dtype::f32, reduce_op::avg, s.view());
    buffer ints = dev->alloc_device(4 * sizeof(std::int64_t));
    const std::int64_t v[4] = {r, -r, std::int64_t{1} << 40, 7};
    std::memcpy(static_cast<std::byte*>(ints.data()), v, sizeof v);
    comm->all_reduce(ints.view(), ints.view(), 4, dtype::i64, reduce_op::sum, s.view());
    buffer gathered = dev->alloc_device(static_cast<std::size_t>(n) * sizeof(std::int32_t));
    const auto me = static_cast<std::int32_t>(r * 10);
    std::memcpy(static_cast<std::byte*>(gathered.data()) + static_cast<std::size_t>(r) * 4, &me, 4);
    comm->all_gather(gathered.view(static_cast<std::size_t>(r) * 4, 4), gathered.view(), 1, dtype::i32,
                     s.view());
    buffer b = dev->alloc_device(8);
    const std::uint64_t root_value = r == 2 ? 0xfeedULL : 0;  // root 2: not the first process
    std::memcpy(static_cast<std::byte*>(b.data()), &root_value, 8);
    comm->broadcast(b.view(), b.view(), 1, dtype::u64, 2, s.view());
    comm->barrier(s.view());
    s.synchronize();
    results[static_cast<std::size_t>(r)] = read_floats(x, count);
    std::int64_t sums[4];
    std::memcpy(sums, static_cast<std::byte*>(ints.data()), sizeof sums);
    const std::int64_t ranks_sum = std::int64_t{n} * (n - 1) / 2;
    EXPECT_EQ(sums[0], ranks_sum);
    EXPECT_EQ(sums[1], -ranks_sum);
    EXPECT_EQ(sums[2], n * (std::int64_t{1} << 40));
    EXPECT_EQ(sums[3], 7 * n);
    std::vector<std::int32_t> all(static_cast<std::size_t>(n));
    std::memcpy(all.data(), static_cast<std::byte*>(gathered.data()), all.size() * sizeof(std::int32_t));
    for (int q = 0; q < n; ++q) EXPECT_EQ(all[static_cast<std::size_t>(q)], q * 10);
    std::uint64_t got = 0;
    std::memcpy(&got, static_cast<std::byte*>(b.data()), 8);
    EXPECT_EQ(got, 0xfeedULL);
  });
  for (std::size_t i = 0; i < count; ++i) {
    const float expected = 0.1F * static_cast<float>(i) + static_cast<float>(n - 1) / 2.0F;
    EXPECT_NEAR(results[0][i], expected, 1e-5F * (1.0F + expected));
    // Every process reduced the same gathered parts in the same order: the same bits.
    for (int q = 1; q < n; ++q)
      EXPECT_EQ(std::memcmp(&results[0][i], &results[static_cast<std::size_t>(q)][i], 4), 0)
          << "process " << q;
  }
}

TEST(process_host_group, a_process_whose_communicator_is_destroyed_fails_the_others_naming_it) {
  const auto store = make_memory_store();
  std::string why;
  each_process(2, [&](int r) {
    std::shared_ptr<bootstrap> job = make_store_bootstrap(store, r, 2, "ferry/d", 60s);
    const auto dev = make_host_device();
    auto comm = open_group(job, *dev, unmodelled());
    stream s = dev->make_stream();
    buffer x = dev->alloc_device(16);
    std::memset(static_cast<std::byte*>(x.data()), 0, 16);
    comm->all_reduce(x.view(), x.view(), 4, dtype::f32, reduce_op::sum, s.view());
    s.synchronize();
    if (r == 1) {
      comm.reset();  // as a process that raised and closed its group
      return;
    }
    std::this_thread::sleep_for(100ms);
    comm->all_reduce(x.view(), x.view(), 4, dtype::f32, reduce_op::sum, s.view());
    why = message_of<comm_error>([&] { s.synchronize(); });
  });
  EXPECT_MESSAGE_HAS(why, "all_reduce sum of 4 f32 #1 on rank 0 of 2 failed");
  EXPECT_MESSAGE_HAS(why, "aborted by process 1 of 2");
  EXPECT_MESSAGE_HAS(why, "the communicator of rank 1 was destroyed");
}

TEST(process_host_group, a_reducer_over_processes_averages_every_gradient_exactly) {
  const auto store = make_memory_store();
  constexpr int n = 2;
  const std::vector<std::size_t> sizes{300, 5, 1200, 64};
  each_process(n, [&](int r) {
    std::shared_ptr<bootstrap> job = make_store_bootstrap(store, r, n, "ferry/red", 20s);
    const auto dev = make_host_device();
    const auto comm = open_group(job, *dev, unmodelled());
    reducer_options o;
    o.plan.first_bucket_bytes = 1024;
    o.plan.bucket_cap_bytes = 4096;
    reducer red(*comm, sizes, o);
    stream compute = dev->make_stream();
    for (int step = 0; step < 4; ++step) {
      red.begin_step();
      for (std::size_t p = sizes.size(); p-- > 0;) {
        compute.synchronize();
        std::vector<float> g(sizes[p]);
        for (std::size_t i = 0; i < g.size(); ++i)
          g[i] = static_cast<float>((r + 1) * (step + 1)) + static_cast<float>(i % 7);
        std::memcpy(red.grad(p).begin(), g.data(), g.size() * sizeof(float));
        red.mark_ready(p, compute.view());
      }
      red.finish(compute.view());
      compute.synchronize();
      for (std::size_t p = 0; p < sizes.size(); ++p) {
        std::vector<float> got(sizes[p]);
        std::memcpy(got.data(), red.grad(p).begin(), got.size() * sizeof(float));
        for (std::size_t i = 0; i < got.size(); ++i)
          ASSERT_EQ(got[i], 1.5F * static_cast<float>(step + 1) + static_cast<float>(i % 7))
              << "step " << step << " parameter " << p << " element " << i << " on process " << r;
      }
    }
  });
}

}  // namespace
}  // namespace ferry::comm
