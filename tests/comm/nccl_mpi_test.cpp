// NCCL over the processes of an mpirun job (make_nccl_group over the MPI bootstrap): one GPU per process,
// the process's local rank. Run by ctest 'comm_nccl_mpi' (label multigpu) as `mpirun -n 2 ferry_comm_tests
// --gtest_filter=nccl_mpi.*`; every process runs every test in the same order. The checks of the
// one-process suites: the collectives' results, and the reducer's buckets within each codec's bound and
// byte for byte the same on every process (compared through the bootstrap), and a process that never calls
// failing every process with comm_error within the timeout. Outside mpirun they skip.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <chrono>
#include <cstddef>
#include <cstring>
#include <exception>
#include <iostream>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "ferry/comm/bootstrap.hpp"
#include "ferry/comm/communicator.hpp"
#include "ferry/comm/f32_ops.hpp"
#include "ferry/comm/reducer.hpp"
#include "ferry/cuda/cuda.hpp"
#include "reducer_steps.hpp"

namespace ferry::comm {
namespace {

using testing::sizes;
using testing::small_buckets;

class nccl_mpi : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!launched_by_mpi()) GTEST_SKIP() << "not started by mpirun (ctest 'comm_nccl_mpi' runs these)";
    job_ = make_mpi_bootstrap();
    const host_place place = place_on_host(*job_);
    // A process without a GPU of its own passes none: make_nccl_group then fails on every process alike.
    std::vector<device*> raw;
    if (place.local_rank < cuda_device_count()) {
      dev_ = make_cuda_device(place.local_rank);
      raw.push_back(dev_.get());
    }
    comm_options o;
    o.timeout = std::chrono::seconds(60);
    comms_ = make_nccl_group(*job_, raw, o);
    ASSERT_EQ(comms_.size(), 1U);
  }
  void TearDown() override { comms_.clear(); }

  bootstrap& job() { return *job_; }
  device& dev() { return *dev_; }
  communicator& comm() { return *comms_.front(); }

 private:
  std::unique_ptr<bootstrap> job_;
  std::unique_ptr<device> dev_;
  std::vector<std::unique_ptr<communicator>> comms_;
};

TEST_F(nccl_mpi, ranks_follow_the_processes_and_collectives_reduce_real_values) {
  EXPECT_EQ(comm().rank(), job().rank());
  EXPECT_EQ(comm().size(), job().size());
  EXPECT_EQ(comm().backend_name(), "nccl");
  const int n = comm().size();
  const std::size_t count = (std::size_t{1} << 20) + 3;
  const stream s = dev().make_stream();
  buffer send = dev().alloc_device(count * sizeof(float));
  buffer recv = dev().alloc_device(count * sizeof(float));
  const f32_fill mine{0.25F, 1.0F, 7 + static_cast<std::uint64_t>(comm().rank()), 1};
  const f32_fill mean{0.25F, 1.0F, 7, static_cast<std::uint32_t>(n)};
  fill_f32_async(send.view(), count, mine, s);
  static_cast<void>(comm().all_reduce(send.view(), recv.view(), count, dtype::f32, reduce_op::avg, s));
  EXPECT_EQ(
      compare_f32(recv.view(), mean, count, static_cast<float>(error_bound(codec_kind::none, n, 1.0)), s)
          .wrong,
      0U);
  // Broadcast from the last rank: every process ends with its values.
  const f32_fill last{0.25F, 1.0F, 99 + static_cast<std::uint64_t>(n - 1), 1};
  fill_f32_async(send.view(), count, f32_fill{0.25F, 1.0F, 99 + static_cast<std::uint64_t>(comm().rank()), 1},
                 s);
  static_cast<void>(comm().broadcast(send.view(), recv.view(), count, dtype::f32, n - 1, s));
  EXPECT_EQ(compare_f32(recv.view(), last, count, 0.0F, s).wrong, 0U);
  comm().barrier(s).synchronize();
}

TEST_F(nccl_mpi, ten_reducer_steps_stay_within_each_codecs_bound_and_every_process_holds_the_same_bytes) {
  reducer r(comm(), sizes, small_buckets(codec_kind::bf16));
  const std::vector<float> flat = testing::ten_steps_with_every_codec(r, comm().size());
  EXPECT_EQ(r.generation(), 1U);  // the rebuild after step 1; new codecs alone keep the layout
  const std::vector<std::byte> all = job().all_gather(std::as_bytes(std::span(flat)));
  const std::size_t each = flat.size() * sizeof(float);
  for (int p = 1; p < job().size(); ++p)
    EXPECT_EQ(std::memcmp(all.data() + static_cast<std::size_t>(p) * each, all.data(), each), 0)
        << "process " << p << "'s buckets differ from process 0's";
}

// Waits (bounded) until `c`'s group is aborted; true when it was.
bool aborted_within(const communicator& c, std::chrono::seconds limit) {
  const auto start = std::chrono::steady_clock::now();
  while (!c.aborted() && std::chrono::steady_clock::now() - start < limit)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  return c.aborted();
}

TEST_F(nccl_mpi, a_process_that_never_calls_leaves_no_other_waiting_and_every_process_gets_comm_error) {
  // A group of its own, with a short timeout. The last process never issues the first all-reduce: every
  // other process's watchdog aborts its communicator within the timeout and names the collective; then the
  // last process issues it alone and its own watchdog does the same (at that all-reduce, or at the next
  // collective when that one completed on what the others left). Nobody waits forever, and every later
  // call fails with comm_error naming its rank and operation.
  comm_options o;
  o.timeout = std::chrono::seconds(3);
  std::vector<device*> raw{&dev()};
  std::vector<std::unique_ptr<communicator>> group = make_nccl_group(job(), raw, o);
  communicator& c = *group.front();
  const int last = c.size() - 1;
  const stream s = dev().make_stream();
  const buffer buf = dev().alloc_device(1 << 20);
  const auto lone_all_reduce = [&] {
    try {
      static_cast<void>(c.all_reduce(buf, buf, 1 << 18, dtype::f32, reduce_op::sum, s));
    } catch (const comm_error& e) {
      EXPECT_EQ(e.op(), collective::all_reduce);
    }
    EXPECT_TRUE(aborted_within(c, std::chrono::seconds(120))) << "rank " << c.rank() << " still waits";
    try {
      s.synchronize();  // the aborted collective's kernel has ended
    } catch (const std::exception& e) {
      std::cout << "rank " << c.rank() << ": synchronize after the abort: " << e.what() << "\n";
    }
  };
  if (c.rank() != last) {
    lone_all_reduce();
    const std::string why = c.abort_reason();
    EXPECT_NE(why.find(fmt::format("all_reduce #0 on rank {} of {}", c.rank(), c.size())), std::string::npos)
        << why;
    EXPECT_NE(why.find("ranks of other processes are not seen from this one"), std::string::npos) << why;
  }
  // Every process meets on the bootstrap (MPI, not NCCL) once the others have given up.
  static_cast<void>(job().all_gather(std::as_bytes(std::span(&last, 1))));
  if (c.rank() == last) {
    // Alone now. Its all-reduce may still complete on what the others sent before they gave up (the
    // connections were made at creation, and their part reached its buffers); then the next collective
    // has nobody to meet, and its own watchdog aborts that one within the timeout.
    try {
      static_cast<void>(c.all_reduce(buf, buf, 1 << 18, dtype::f32, reduce_op::sum, s));
      if (!aborted_within(c, std::chrono::seconds(9)))  // 3 x the timeout
        static_cast<void>(c.barrier(s));
    } catch (const comm_error& e) {
      EXPECT_TRUE(e.op() == collective::all_reduce || e.op() == collective::barrier) << e.what();
    }
    EXPECT_TRUE(aborted_within(c, std::chrono::seconds(120))) << "rank " << c.rank() << " still waits";
    try {
      s.synchronize();  // the aborted collective's kernel has ended
    } catch (const std::exception& e) {
      std::cout << "rank " << c.rank() << ": synchronize after the abort: " << e.what() << "\n";
    }
  }
  try {
    static_cast<void>(c.barrier(s));
    ADD_FAILURE() << "rank " << c.rank() << ": no comm_error after the abort";
  } catch (const comm_error& e) {
    EXPECT_EQ(e.rank(), c.rank());
    EXPECT_EQ(e.op(), collective::barrier);
  }
  group.clear();  // an aborted group is destroyed without waiting on any rank
  static_cast<void>(job().all_gather(std::as_bytes(std::span(&last, 1))));
}

}  // namespace
}  // namespace ferry::comm
