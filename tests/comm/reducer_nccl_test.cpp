// The reducer and its codecs on GPUs, over the NCCL group of one process (make_nccl_group): one rank per
// GPU, each driven by its own thread. The same checks as the host tests: every element within its
// codec's bound of the exact mean, identical bytes on every rank, the rebuild and an explicit plan with a
// codec per bucket. Labelled multigpu (ctest comm_nccl); FERRY_TEST_GPUS sets the GPU count (default: all).
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "ferry/comm/communicator.hpp"
#include "ferry/comm/reducer.hpp"
#include "ferry/cuda/cuda.hpp"
#include "host_ranks.hpp"
#include "reducer_steps.hpp"

namespace ferry::comm {
namespace {

using testing::expect_reduced;
using testing::on_every_rank;
using testing::sizes;
using testing::small_buckets;

// FERRY_TEST_GPUS, or every GPU of the machine.
int gpus_under_test() {
  const char* env = std::getenv("FERRY_TEST_GPUS");
  return env != nullptr && *env != '\0' ? std::atoi(env) : cuda_device_count();
}

// One cuda device per GPU and an NCCL group over them; the communicators die before the devices.
struct nccl_ranks {
  std::vector<std::unique_ptr<device>> devices;
  std::vector<std::unique_ptr<communicator>> comms;

  explicit nccl_ranks(int n) {
    std::vector<device*> raw;
    for (int r = 0; r < n; ++r) {
      devices.push_back(make_cuda_device(r));
      raw.push_back(devices.back().get());
    }
    comm_options o;
    o.timeout = std::chrono::seconds(60);
    comms = make_nccl_group(raw, o);
  }
  nccl_ranks(const nccl_ranks&) = delete;
  nccl_ranks& operator=(const nccl_ranks&) = delete;
  ~nccl_ranks() { comms.clear(); }
};

TEST(reducer_nccl, ten_steps_on_gpus_stay_within_each_codecs_bound_and_ranks_agree) {
  const int n = gpus_under_test();
  ASSERT_GE(n, 2) << "FERRY_TEST_GPUS=" << n;
  std::string why;
  ASSERT_TRUE(nccl_available(&why)) << why;
  nccl_ranks ranks(n);
  std::vector<std::vector<float>> flats(static_cast<std::size_t>(n));
  std::vector<bucket_plan> plans(static_cast<std::size_t>(n));
  on_every_rank(n, [&](int rank) {
    reducer r(*ranks.comms[static_cast<std::size_t>(rank)], sizes, small_buckets(codec_kind::bf16));
    flats[static_cast<std::size_t>(rank)] = testing::ten_steps_with_every_codec(r, n);
    EXPECT_EQ(r.generation(), 1U);  // the rebuild after step 1; new codecs alone keep the layout
    EXPECT_EQ(r.stats().plan_changes, 2U);
    plans[static_cast<std::size_t>(rank)] = r.plan();
  });
  for (int rank = 1; rank < n; ++rank) {
    EXPECT_EQ(plans[static_cast<std::size_t>(rank)], plans[0]) << "rank " << rank;
    ASSERT_EQ(flats[static_cast<std::size_t>(rank)].size(), flats[0].size());
    EXPECT_EQ(std::memcmp(flats[static_cast<std::size_t>(rank)].data(), flats[0].data(), flats[0].size() * 4),
              0)
        << "rank " << rank << "'s buffer differs from rank 0's";
  }
}

TEST(reducer_nccl, timing_events_order_each_buckets_work_on_the_communication_stream) {
  const int n = gpus_under_test();
  nccl_ranks ranks(n);
  on_every_rank(n, [&](int rank) {
    device& dev = *ranks.devices[static_cast<std::size_t>(rank)];
    reducer_options o = small_buckets(codec_kind::fp16);
    o.timing = true;
    reducer r(*ranks.comms[static_cast<std::size_t>(rank)], sizes, o);
    const stream producer = dev.make_stream();
    testing::run_step(r, 1, testing::reverse_order(sizes.size()), producer, producer);
    expect_reduced(r, 1, n, producer);
    const std::vector<bucket_timing> t = r.last_step_timing();
    ASSERT_EQ(t.size(), r.plan().buckets.size());
    for (std::size_t b = 0; b < t.size(); ++b) {
      EXPECT_LE(t[b].start_ms, t[b].reduce_start_ms);
      EXPECT_LE(t[b].reduce_start_ms, t[b].reduce_end_ms);
      EXPECT_LE(t[b].reduce_end_ms, t[b].end_ms);
      if (b > 0) {
        EXPECT_GE(t[b].start_ms, t[b - 1].end_ms);
      }
    }
  });
}

}  // namespace
}  // namespace ferry::comm
