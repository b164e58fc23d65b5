// The MPI bootstrap over several processes: run by ctest 'comm_mpi' as `mpirun -n 3 ferry_comm_tests
// --gtest_filter=mpi_job.*`, every process running every test in the same order (so their collectives
// match). Each process checks its own view; mpirun fails when any process does. Outside mpirun these tests
// skip (the 'comm' test leaves them out).
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "ferry/comm/bootstrap.hpp"
#include "ferry/comm/communicator.hpp"
#include "ferry/core/error.hpp"
#include "ferry/device/device.hpp"

namespace ferry::comm {
namespace {

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

int env_int(const char* name) {
  const char* v = std::getenv(name);        // NOLINT(concurrency-mt-unsafe): tests change no environment
  return v != nullptr ? std::atoi(v) : -1;  // NOLINT(cert-err34-c): a launcher's own number
}

class mpi_job : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!launched_by_mpi()) GTEST_SKIP() << "not started by mpirun (ctest 'comm_mpi' runs these)";
    job_ = make_mpi_bootstrap();
  }
  bootstrap& job() { return *job_; }

 private:
  std::unique_ptr<bootstrap> job_;
};

TEST_F(mpi_job, rank_and_size_are_the_launchers) {
  EXPECT_EQ(job().name(), "mpi");
  EXPECT_EQ(job().size(), env_int("OMPI_COMM_WORLD_SIZE"));
  EXPECT_EQ(job().rank(), env_int("OMPI_COMM_WORLD_RANK"));
  EXPECT_GE(job().size(), 2) << "run these with mpirun -n 2 or more";
  EXPECT_EQ(job().transport().rfind("Open MPI v", 0), 0u) << job().transport();
}

TEST_F(mpi_job, broadcast_gives_every_process_the_roots_bytes_from_every_root) {
  for (int root = 0; root < job().size(); ++root) {
    std::vector<std::byte> bytes(1000);
    for (std::size_t i = 0; i < bytes.size(); ++i)
      bytes[i] = static_cast<std::byte>((i * 7 + static_cast<std::size_t>(job().rank()) * 31) & 0xff);
    job().broadcast(bytes, root);
    for (std::size_t i = 0; i < bytes.size(); ++i)
      ASSERT_EQ(bytes[i], static_cast<std::byte>((i * 7 + static_cast<std::size_t>(root) * 31) & 0xff))
          << "root " << root << ", byte " << i;
  }
}

TEST_F(mpi_job, a_root_out_of_range_is_refused_before_any_process_waits) {
  std::vector<std::byte> bytes(4);
  try {
    job().broadcast(bytes, job().size());
    ADD_FAILURE() << "no logic_error";
  } catch (const logic_error& e) {
    EXPECT_TRUE(has(e.what(), "root " + std::to_string(job().size()))) << e.what();
  }
}

TEST_F(mpi_job, all_gather_puts_each_processs_bytes_in_process_order) {
  const std::vector<std::byte> mine(16, static_cast<std::byte>(job().rank() + 1));
  const std::vector<std::byte> all = job().all_gather(mine);
  ASSERT_EQ(all.size(), mine.size() * static_cast<std::size_t>(job().size()));
  for (std::size_t i = 0; i < all.size(); ++i) ASSERT_EQ(all[i], static_cast<std::byte>(i / 16 + 1)) << i;
}

TEST_F(mpi_job, texts_of_different_lengths_gather_whole_even_when_empty) {
  std::string mine;
  for (int k = 0; k < job().rank(); ++k) mine += "process " + std::to_string(job().rank()) + ";";
  const std::vector<std::string> all = all_gather_text(job(), mine);
  ASSERT_EQ(all.size(), static_cast<std::size_t>(job().size()));
  EXPECT_TRUE(all[0].empty());
  for (int p = 1; p < job().size(); ++p) {
    std::string expected;
    for (int k = 0; k < p; ++k) expected += "process " + std::to_string(p) + ";";
    EXPECT_EQ(all[static_cast<std::size_t>(p)], expected);
  }
}

TEST_F(mpi_job, processes_on_one_host_take_local_ranks_in_order) {
  const host_place place = place_on_host(job());
  EXPECT_EQ(place.local_size, job().size());  // mpirun here starts every process on this host
  EXPECT_EQ(place.local_rank, job().rank());
  if (env_int("OMPI_COMM_WORLD_LOCAL_RANK") >= 0) {
    EXPECT_EQ(place.local_rank, env_int("OMPI_COMM_WORLD_LOCAL_RANK"));
  }
}

TEST_F(mpi_job, one_process_not_ready_fails_every_process_naming_it) {
  agree_ready(job(), "a step", "");  // all ready: nothing thrown
  const std::string problem = job().rank() == 1 ? "disk full" : "";
  try {
    agree_ready(job(), "a step", problem);
    ADD_FAILURE() << "process " << job().rank() << " went on although process 1 was not ready";
  } catch (const comm_error& e) {
    const std::string why = e.what();
    EXPECT_TRUE(has(why, "failed on 1 of them: process 1 of " + std::to_string(job().size()) + ": disk full"))
        << why;
    EXPECT_FALSE(has(why, "process 0 of")) << why;
  }
}

TEST_F(mpi_job, an_nccl_group_that_cannot_be_made_fails_on_every_process_with_every_reason) {
  // Host devices are no GPUs: every process refuses, and every process hears every reason, once with the
  // processes that gave it. Process 1 passes no device at all, a reason of its own.
  auto dev = make_host_device();
  std::vector<device*> devices{dev.get()};
  if (job().rank() == 1) devices.clear();
  try {
    static_cast<void>(make_nccl_group(job(), devices));
    ADD_FAILURE() << "no comm_error";
  } catch (const comm_error& e) {
    const std::string why = e.what();
    const std::string n = std::to_string(job().size());
    EXPECT_TRUE(has(why, "failed on " + n + " of them")) << why;
    const std::string host_processes = job().size() == 3 ? "processes 0, 2 of 3" : "process 0 of " + n;
    EXPECT_TRUE(has(why, host_processes + ": make_nccl_group: device 0 is on the host backend")) << why;
    EXPECT_TRUE(has(why, "process 1 of " + n + ": make_nccl_group of no devices")) << why;
  }
}

TEST_F(mpi_job, bootstraps_may_be_made_and_dropped_while_mpi_stays_up) {
  for (int k = 0; k < 3; ++k) {
    const auto another = make_mpi_bootstrap();
    EXPECT_EQ(another->rank(), job().rank());
    std::vector<std::byte> token(8, static_cast<std::byte>(k));
    if (job().rank() != 0) token.assign(8, std::byte{0xff});
    another->broadcast(token, 0);
    EXPECT_EQ(token[7], static_cast<std::byte>(k));
  }
}

}  // namespace
}  // namespace ferry::comm
