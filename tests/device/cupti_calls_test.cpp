// Which CUDA runtime calls the CUPTI recorder leaves out by default (cupti::quiet_runtime_call), by their
// CUPTI callback names: the queries an eager framework makes around every kernel, never a call that waits,
// copies, allocates, starts work or may load a module.
#include <gtest/gtest.h>

#if FERRY_TEST_HAVE_CUDA
#include <string_view>

#include "ferry/cupti/cupti_tracer.hpp"

namespace {

using ferry::cupti::quiet_runtime_call;

TEST(cupti_calls, the_queries_around_every_kernel_are_quiet_whatever_their_suffixes) {
  for (std::string_view name :
       {"cudaGetDevice_v3020", "cudaGetLastError_v3020", "cudaPeekAtLastError_v3020",
        "cudaDeviceGetAttribute_v5000", "cudaStreamIsCapturing_v10000", "cudaStreamIsCapturing_ptsz_v10000",
        "cudaStreamGetCaptureInfo_v10010", "cudaStreamGetCaptureInfo_v2_ptsz_v11030",
        "cudaGetDeviceCount_v3020", "cudaGetErrorString_v3020", "cudaGetDevice"})
    EXPECT_TRUE(quiet_runtime_call(name)) << name;
}

TEST(cupti_calls, calls_that_wait_copy_allocate_launch_or_may_load_a_module_are_kept) {
  for (std::string_view name : {"cudaLaunchKernel_v7000",
                                "cudaLaunchKernel_ptsz_v7000",
                                "cudaLaunchKernelExC_v11060",
                                "cudaGraphLaunch_v10000",
                                "cudaMemcpy_v3020",
                                "cudaMemcpyAsync_v3020",
                                "cudaMemsetAsync_v3020",
                                "cudaStreamSynchronize_v3020",
                                "cudaDeviceSynchronize_v3020",
                                "cudaEventSynchronize_v3020",
                                "cudaStreamWaitEvent_v3020",
                                "cudaEventRecord_v3020",
                                "cudaEventQuery_v3020",
                                "cudaStreamQuery_v3020",
                                "cudaMalloc_v3020",
                                "cudaFree_v3020",
                                "cudaHostAlloc_v3020",
                                "cudaHostRegister_v4000",
                                "cudaSetDevice_v3020",
                                "cudaGetDeviceProperties_v3020",
                                "cudaLaunchHostFunc_v10000",
                                "cudaMemGetInfo_v3020",
                                "cudaFuncGetAttributes_v3020",
                                "cudaOccupancyMaxActiveBlocksPerMultiprocessor_v6000",
                                "cudaGetDriverEntryPoint_v11030",
                                "cudaGetFuncBySymbol_v11000",
                                "cudaGetKernel_v12000"})
    EXPECT_FALSE(quiet_runtime_call(name)) << name;
}

TEST(cupti_calls, only_whole_names_or_the_capture_info_family_match) {
  EXPECT_FALSE(quiet_runtime_call(""));
  EXPECT_FALSE(quiet_runtime_call("cudaGetDev"));
  EXPECT_FALSE(quiet_runtime_call("cudaGetDeviceX_v3020"));
  EXPECT_FALSE(quiet_runtime_call("GetDevice"));
}

}  // namespace
#endif
