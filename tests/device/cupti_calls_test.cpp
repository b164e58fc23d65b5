// Which CUDA runtime calls the CUPTI recorder leaves out by default (cupti::quiet_runtime_call): the
// queries an eager framework makes around every kernel, never a call that waits, copies or starts work.
#include <gtest/gtest.h>

#if FERRY_TEST_HAVE_CUDA
#include <string_view>

#include "ferry/cuda/detail/cupti_tracer.hpp"

namespace {

using ferry::cupti::quiet_runtime_call;

TEST(cupti_calls, the_queries_around_every_kernel_are_quiet) {
  for (std::string_view name :
       {"cudaGetDevice", "cudaGetLastError", "cudaPeekAtLastError", "cudaDeviceGetAttribute",
        "cudaStreamIsCapturing", "cudaStreamGetCaptureInfo", "cudaStreamGetCaptureInfo_v2",
        "cudaGetDriverEntryPoint", "cudaGetDriverEntryPointByVersion",
        "cudaOccupancyMaxActiveBlocksPerMultiprocessor", "cudaGetDeviceCount"})
    EXPECT_TRUE(quiet_runtime_call(name)) << name;
}

TEST(cupti_calls, calls_that_wait_copy_allocate_or_launch_are_kept) {
  for (std::string_view name : {"cudaLaunchKernel",
                                "cudaLaunchKernelExC",
                                "cudaGraphLaunch",
                                "cudaMemcpy",
                                "cudaMemcpyAsync",
                                "cudaMemsetAsync",
                                "cudaStreamSynchronize",
                                "cudaDeviceSynchronize",
                                "cudaEventSynchronize",
                                "cudaStreamWaitEvent",
                                "cudaEventRecord",
                                "cudaEventQuery",
                                "cudaStreamQuery",
                                "cudaMalloc",
                                "cudaFree",
                                "cudaHostAlloc",
                                "cudaHostRegister",
                                "cudaSetDevice",
                                "cudaGetDeviceProperties",
                                "cudaLaunchHostFunc",
                                "cudaMemGetInfo"})
    EXPECT_FALSE(quiet_runtime_call(name)) << name;
}

TEST(cupti_calls, only_whole_names_or_the_listed_families_match) {
  EXPECT_FALSE(quiet_runtime_call(""));
  EXPECT_FALSE(quiet_runtime_call("cudaGetDev"));
  EXPECT_FALSE(quiet_runtime_call("cudaGetDeviceX"));
  EXPECT_FALSE(quiet_runtime_call("GetDevice"));
}

}  // namespace
#endif
