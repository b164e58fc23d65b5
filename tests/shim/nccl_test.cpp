// ferry::shim's NCCL: opened at run time, or reported missing with what dlopen said. This machine's toolkit
// has libnccl.so.2 in /usr/local/cuda/lib64; where it is there, NCCL must load and answer ncclGetVersion.
#include "ferry/shim/nccl.hpp"

#include <gtest/gtest.h>

#include <climits>
#include <filesystem>
#include <iostream>
#include <string>

namespace ferry::shim {
namespace {

TEST(nccl_shim, the_soname_is_tried_first_then_the_toolkit_by_absolute_path) {
  const auto& names = nccl_library_names();
  ASSERT_FALSE(names.empty());
  EXPECT_EQ(names.front(), "libnccl.so.2");
  for (std::size_t i = 1; i < names.size(); ++i) {
    EXPECT_EQ(names[i].front(), '/') << names[i];
    EXPECT_TRUE(names[i].ends_with("/libnccl.so.2")) << names[i];
  }
}

TEST(nccl_shim, a_library_that_is_not_there_is_reported_with_what_dlopen_said) {
  const nccl_api api = load_nccl({"libnccl-ferry-test-absent.so.2"});
  EXPECT_FALSE(api.ok());
  EXPECT_EQ(api.all_reduce, nullptr);
  EXPECT_EQ(api.error.rfind("NCCL not available: dlopen(\"libnccl-ferry-test-absent.so.2\") failed: ", 0), 0u)
      << api.error;
}

TEST(nccl_shim, nccl_loads_and_tells_its_version_or_says_why_not) {
  const nccl_api& api = nccl();
  const bool toolkit_has_it = std::filesystem::exists("/usr/local/cuda/lib64/libnccl.so.2");
  if (!api.ok()) {
    EXPECT_EQ(api.error.rfind("NCCL not available: ", 0), 0u) << api.error;
    if (toolkit_has_it) {
      ADD_FAILURE() << "/usr/local/cuda/lib64/libnccl.so.2 exists but did not load: " << api.error;
    } else {
      GTEST_SKIP() << "no NCCL on this machine: " << api.error;
    }
    return;
  }
  EXPECT_TRUE(api.error.empty());
  int version = 0;
  ASSERT_EQ(api.get_version(&version), nccl_success);
  EXPECT_EQ(version, api.version);
  EXPECT_GE(version, 21400);
  EXPECT_EQ(api.version_string().front(), '2') << api.version_string();
  EXPECT_NE(api.error_string(nccl_invalid_usage).find("(NCCL 5)"), std::string::npos);
  std::cout << "NCCL " << api.version_string() << " from " << api.library.path() << "\n";
}

TEST(nccl_shim, the_config_initializer_leaves_every_field_to_ncclS_defaults) {
  const nccl_config c = nccl_config_initializer();
  EXPECT_EQ(c.size, sizeof(nccl_config));
  EXPECT_EQ(c.magic, 0xcafebeefU);
  EXPECT_EQ(c.version, 22809U);
  EXPECT_EQ(c.blocking, INT_MIN);
  EXPECT_EQ(c.nvlink_centric_sched, INT_MIN);
  EXPECT_EQ(c.net_name, nullptr);
}

}  // namespace
}  // namespace ferry::shim
