// The words a refused GPU is told about the code this build carries (the load check itself needs a GPU
// the build does not serve: docs/perf/2026-11-26/h200-arch/ records that run).
#include <gtest/gtest.h>

#include "ferry/cuda/cuda.hpp"
#include "ferry/cuda/detail/architectures.hpp"

namespace {

using ferry::detail::describe_cuda_architectures;

TEST(cuda_architectures, real_entries_are_machine_code_and_a_bare_number_adds_its_ptx) {
  EXPECT_EQ(describe_cuda_architectures("80-real;86-real;89-real;90"),
            "sm_80, sm_86, sm_89, sm_90 and PTX compute_90");
  EXPECT_EQ(describe_cuda_architectures("80-real,90-virtual"), "sm_80 and PTX compute_90");
  EXPECT_EQ(describe_cuda_architectures("86"), "sm_86 and PTX compute_86");
}

TEST(cuda_architectures, unknown_entries_are_kept_and_empty_lists_say_so) {
  EXPECT_EQ(describe_cuda_architectures(" native "), "native");
  EXPECT_EQ(describe_cuda_architectures("90-foo;80-real"), "sm_80 and 90-foo");
  EXPECT_EQ(describe_cuda_architectures(""), "no GPU code");
  EXPECT_EQ(describe_cuda_architectures(";,"), "no GPU code");
}

TEST(cuda_architectures, the_build_names_what_it_carries) {
  const std::string carried = ferry::cuda_architectures();
#if FERRY_TEST_HAVE_CUDA
  EXPECT_NE(carried.find("sm_"), std::string::npos) << carried;
#else
  EXPECT_EQ(carried, "") << "a build without the cuda backend carries no GPU code";
#endif
}

}  // namespace
