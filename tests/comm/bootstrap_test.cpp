// The bootstraps' contract on a job of one process (the MPI bootstrap's over several processes is
// tests/comm/mpi_job_test.cpp, run under mpirun): rank and size, the byte collectives, the text gather,
// the place on the host, the readiness vote and the NCCL group over a bootstrap refusing what cannot be.
#include "ferry/comm/bootstrap.hpp"

#include <gtest/gtest.h>

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "ferry/comm/communicator.hpp"
#include "ferry/core/error.hpp"
#include "ferry/device/device.hpp"
#include "support/test_support.hpp"

namespace ferry::comm {
namespace {

using testing::message_of;

TEST(single_process_bootstrap, is_rank_0_of_1_and_its_collectives_copy) {
  const auto job = make_single_process_bootstrap();
  EXPECT_EQ(job->rank(), 0);
  EXPECT_EQ(job->size(), 1);
  EXPECT_EQ(job->name(), "single");
  std::vector<std::byte> bytes{std::byte{1}, std::byte{2}, std::byte{3}};
  job->broadcast(bytes, 0);
  EXPECT_EQ(bytes[2], std::byte{3});
  EXPECT_EQ(job->all_gather(bytes), bytes);
  EXPECT_MESSAGE_HAS(message_of<logic_error>([&] { job->broadcast(bytes, 1); }), "root 1");
}

TEST(single_process_bootstrap, texts_gather_and_the_host_place_is_0_of_1) {
  const auto job = make_single_process_bootstrap();
  EXPECT_EQ(all_gather_text(*job, "hello"), std::vector<std::string>{"hello"});
  EXPECT_EQ(all_gather_text(*job, ""), std::vector<std::string>{""});
  const host_place place = place_on_host(*job);
  EXPECT_EQ(place.local_rank, 0);
  EXPECT_EQ(place.local_size, 1);
  EXPECT_FALSE(place.host.empty());
}

TEST(single_process_bootstrap, agree_ready_passes_when_ready_and_names_the_process_that_is_not) {
  const auto job = make_single_process_bootstrap();
  agree_ready(*job, "a step", "");
  const std::string why = message_of<comm_error>([&] { agree_ready(*job, "a step", "disk full"); });
  EXPECT_MESSAGE_HAS(why, "a step over 1 process failed on 1 of them: process 0 of 1: disk full");
}

TEST(bootstrap_choice, names_are_single_mpi_or_auto_and_another_is_refused_by_name) {
  EXPECT_EQ(make_bootstrap("single")->name(), "single");
  const std::string why = message_of<logic_error>([] { static_cast<void>(make_bootstrap("tcp")); });
  EXPECT_MESSAGE_HAS(why, "bootstrap 'tcp': expected single, mpi or auto");
  if (!launched_by_mpi()) {
    EXPECT_EQ(make_bootstrap("auto")->name(), "single");
  }
}

TEST(nccl_over_a_bootstrap, refuses_devices_that_are_not_gpus_on_every_process_with_each_reason) {
  const auto job = make_single_process_bootstrap();
  auto dev = make_host_device();
  device* devices[] = {dev.get()};
  const std::string why = message_of<comm_error>([&] { static_cast<void>(make_nccl_group(*job, devices)); });
  EXPECT_MESSAGE_HAS(why, "make_nccl_group over 1 process failed on 1 of them: process 0 of 1: ");
  const std::string none = message_of<comm_error>([&] { static_cast<void>(make_nccl_group(*job, {})); });
  // A build without the CUDA toolkit (the sanitizer builds) has no NCCL backend at all, and says that.
  if (why.find("built without the CUDA toolkit") != std::string::npos) {
    EXPECT_MESSAGE_HAS(none, "built without the CUDA toolkit");
    return;
  }
  EXPECT_MESSAGE_HAS(why, "device 0 is on the host backend");
  EXPECT_MESSAGE_HAS(none, "no devices");
}

}  // namespace
}  // namespace ferry::comm
