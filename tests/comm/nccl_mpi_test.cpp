// NCCL over the processes of an mpirun job (make_nccl_group over the MPI bootstrap): one GPU per process,
// the process's local rank. Run by ctest 'comm_nccl_mpi' (label multigpu) as `mpirun -n 2 ferry_comm_tests
// --gtest_filter=nccl_mpi.*`; every process runs every test in the same order. The checks of the
// one-process suites: the collectives' results, and the reducer's buckets within each codec's bound and
// byte for byte the same on every process (compared through the bootstrap). Outside mpirun they skip.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstring>
#include <memory>
#include <string>
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

}  // namespace
}  // namespace ferry::comm
