// ferry::shim's cuBLAS: opened at run time, or reported missing with what dlopen said. This machine's
// toolkit has libcublas.so.13 in /usr/local/cuda/lib64; where it is there, cuBLAS must load with every
// entry point PowerSGD uses (loading needs no GPU: nothing here makes a handle).
#include "ferry/shim/cublas.hpp"

#include <gtest/gtest.h>

#include <filesystem>
#include <iostream>
#include <string>

namespace ferry::shim {
namespace {

TEST(cublas_shim, the_soname_is_tried_first_then_the_toolkit_by_absolute_path) {
  const auto& names = cublas_library_names();
  ASSERT_FALSE(names.empty());
  EXPECT_EQ(names.front(), "libcublas.so.13");
  for (std::size_t i = 1; i < names.size(); ++i) {
    EXPECT_EQ(names[i].front(), '/') << names[i];
    EXPECT_TRUE(names[i].ends_with("/libcublas.so.13")) << names[i];
  }
}

TEST(cublas_shim, a_library_that_is_not_there_is_reported_with_what_dlopen_said) {
  const cublas_api api = load_cublas({"libcublas-ferry-test-absent.so.13"});
  EXPECT_FALSE(api.ok());
  EXPECT_EQ(api.sgemm_batched, nullptr);
  EXPECT_EQ(
      api.error.rfind("cuBLAS not available: dlopen(\"libcublas-ferry-test-absent.so.13\") failed: ", 0), 0u)
      << api.error;
}

TEST(cublas_shim, cublas_loads_with_every_entry_point_or_says_why_not) {
  const cublas_api& api = cublas();
  const bool toolkit_has_it = std::filesystem::exists("/usr/local/cuda/lib64/libcublas.so.13");
  if (!api.ok()) {
    EXPECT_EQ(api.error.rfind("cuBLAS not available: ", 0), 0u) << api.error;
    if (toolkit_has_it) {
      ADD_FAILURE() << "/usr/local/cuda/lib64/libcublas.so.13 exists but did not load: " << api.error;
    } else {
      GTEST_SKIP() << "no cuBLAS on this machine: " << api.error;
    }
    return;
  }
  EXPECT_NE(api.create, nullptr);
  EXPECT_NE(api.destroy, nullptr);
  EXPECT_NE(api.set_stream, nullptr);
  EXPECT_NE(api.set_workspace, nullptr);
  EXPECT_NE(api.set_math_mode, nullptr);
  EXPECT_NE(api.sgemm_batched, nullptr);
  EXPECT_NE(api.error_string(7).find("(cuBLAS 7)"), std::string::npos) << api.error_string(7);
  std::cout << "cuBLAS from " << api.library.path() << "\n";
}

}  // namespace
}  // namespace ferry::shim
