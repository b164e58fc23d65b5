#include "ferry/trace/names.hpp"

#include <gtest/gtest.h>

namespace {

using ferry::trace::contains_ignoring_case;
using ferry::trace::is_comm_kernel;

TEST(names, nccl_kernels_are_comm_in_any_case) {
  EXPECT_TRUE(is_comm_kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL"));
  EXPECT_TRUE(is_comm_kernel("ncclKernel_AllGather_RING_LL_Sum_int8_t"));
  EXPECT_TRUE(is_comm_kernel("NCCL AllReduce"));
  EXPECT_TRUE(is_comm_kernel("void NcclReduceScatter"));
  EXPECT_TRUE(is_comm_kernel("nCcL"));  // the case of every letter is free, not only three spellings
}

TEST(names, other_kernels_are_not_comm) {
  EXPECT_FALSE(is_comm_kernel("ampere_sgemm_128x64_nn"));
  EXPECT_FALSE(is_comm_kernel("ncl_reduce"));  // a near miss
  EXPECT_FALSE(is_comm_kernel("ncc"));         // a prefix of the word
  EXPECT_FALSE(is_comm_kernel(""));
}

TEST(names, contains_ignoring_case_compares_ascii_letters_only_without_case) {
  EXPECT_TRUE(contains_ignoring_case("Make Batch", "make batch"));
  EXPECT_TRUE(contains_ignoring_case("cudaDeviceSynchronize", "DEVICE"));
  EXPECT_TRUE(contains_ignoring_case("anything", ""));
  EXPECT_TRUE(contains_ignoring_case("", ""));
  EXPECT_FALSE(contains_ignoring_case("", "a"));
  EXPECT_FALSE(contains_ignoring_case("load", "loader"));    // longer than the text
  EXPECT_FALSE(contains_ignoring_case("step_1", "step 1"));  // '_' and ' ' are not letters: compared exactly
  EXPECT_FALSE(contains_ignoring_case("\xC3\x89tape", "\xC3\xA9tape"));  // non-ASCII bytes compared exactly
}

}  // namespace
