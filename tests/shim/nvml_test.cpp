// ferry::shim::nvml_library where the driver's NVML may be missing (CI machines have no GPU driver).
#include "ferry/shim/nvml.hpp"

#include <dlfcn.h>
#include <gtest/gtest.h>

#include <string>
#include <utility>

namespace ferry::shim {
namespace {

// Whether this machine has the driver's NVML at all (the test asserts what ferry reports either way).
bool nvml_present() {
  void* h = ::dlopen(nvml_library_name, RTLD_NOW | RTLD_LOCAL);
  if (h == nullptr) return false;
  ::dlclose(h);
  return true;
}

TEST(nvml, a_missing_nvml_is_reported_not_available_with_what_dlopen_said) {
  if (nvml_present()) GTEST_SKIP() << nvml_library_name << " is installed on this machine";
  const nvml_library nvml;
  EXPECT_FALSE(nvml.ok());
  EXPECT_EQ(nvml.by_bus_id, nullptr);
  EXPECT_EQ(nvml.nvlink_state, nullptr);
  const std::string& e = nvml.error();
  // The message ferry probe --topology has always printed.
  EXPECT_EQ(e.rfind("NVML not available: dlopen(\"libnvidia-ml.so.1\") failed: ", 0), 0u) << e;
  EXPECT_NE(e.find("cannot open shared object file"), std::string::npos) << e;
}

TEST(nvml, an_nvml_that_opens_is_either_initialized_or_says_why_not) {
  const nvml_library nvml;
  if (nvml.ok()) {
    EXPECT_TRUE(nvml.error().empty());
    EXPECT_NE(nvml.by_bus_id, nullptr);
  } else {
    EXPECT_EQ(nvml.error().rfind("NVML not available: ", 0), 0u) << nvml.error();
  }
  EXPECT_NE(nvml.error_string(999).find("(NVML 999)"), std::string::npos);
}

TEST(nvml, a_moved_from_nvml_is_not_ok_and_the_session_moves_with_it) {
  nvml_library nvml;
  const bool was_ok = nvml.ok();
  nvml_library moved(std::move(nvml));
  EXPECT_FALSE(nvml.ok());  // NOLINT(bugprone-use-after-move): the moved-from state is the property
  EXPECT_EQ(moved.ok(), was_ok);
}

}  // namespace
}  // namespace ferry::shim
