// ferry::shim's Open MPI: opened at run time, or reported missing with what dlopen said. Where the build
// found mpirun (CMake sets FERRY_TEST_EXPECT_MPI=1 for this test), MPI must load; calls that need MPI
// started are tested under mpirun (tests/comm/mpi_job_test.cpp).
#include "ferry/shim/mpi.hpp"

#include <gtest/gtest.h>

#include <cstdlib>
#include <iostream>
#include <string>

namespace ferry::shim {
namespace {

bool expect_mpi() {
  const char* v =
      std::getenv("FERRY_TEST_EXPECT_MPI");  // NOLINT(concurrency-mt-unsafe): tests change no environment
  return v != nullptr && std::string(v) == "1";
}

TEST(mpi_shim, the_soname_is_tried_first_then_known_folders_by_absolute_path) {
  if (std::getenv("FERRY_MPI_LIBRARY") != nullptr)  // NOLINT(concurrency-mt-unsafe)
    GTEST_SKIP() << "FERRY_MPI_LIBRARY is set, so it comes first";
  const auto names = mpi_library_names();
  ASSERT_GE(names.size(), 2u);
  EXPECT_EQ(names.front(), "libmpi.so.40");
  for (std::size_t i = 1; i < names.size(); ++i) {
    EXPECT_EQ(names[i].front(), '/') << names[i];
    EXPECT_TRUE(names[i].ends_with("/libmpi.so.40")) << names[i];
  }
}

TEST(mpi_shim, a_library_that_is_not_there_is_reported_with_what_dlopen_said) {
  const mpi_api api = load_mpi({"libmpi-ferry-test-absent.so.40"});
  EXPECT_FALSE(api.ok());
  EXPECT_EQ(api.bcast, nullptr);
  EXPECT_EQ(api.error.rfind("MPI not available: dlopen(\"libmpi-ferry-test-absent.so.40\") failed: ", 0), 0u)
      << api.error;
  EXPECT_NE(api.error.find("openmpi-bin"), std::string::npos) << api.error;
}

TEST(mpi_shim, a_library_that_is_not_open_mpi_is_reported_with_the_symbols_it_lacks) {
  // libz is no MPI: every entry point and handle is missing, and named.
  const mpi_api api = load_mpi({"libz.so.1"});
  ASSERT_TRUE(api.library.loaded()) << api.library.error();
  EXPECT_FALSE(api.ok());
  EXPECT_NE(api.error.find("lacks MPI_Initialized"), std::string::npos) << api.error;
  EXPECT_NE(api.error.find("ompi_mpi_comm_world"), std::string::npos) << api.error;
}

TEST(mpi_shim, open_mpi_loads_and_tells_its_version_or_says_why_not) {
  const mpi_api& api = mpi();
  if (!api.ok()) {
    EXPECT_EQ(api.error.rfind("MPI not available: ", 0), 0u) << api.error;
    if (expect_mpi()) {
      ADD_FAILURE() << "the build found mpirun, but Open MPI did not load: " << api.error;
    } else {
      GTEST_SKIP() << "no Open MPI on this machine: " << api.error;
    }
    return;
  }
  EXPECT_NE(api.comm_world, nullptr);
  EXPECT_NE(api.byte, nullptr);
  EXPECT_NE(api.errors_return, nullptr);
  // MPI_Get_library_version may be called before MPI_Init.
  EXPECT_EQ(api.version_string().rfind("Open MPI v", 0), 0u) << api.version_string();
  std::cout << api.version_string() << " from " << api.library.path() << "\n";
}

}  // namespace
}  // namespace ferry::shim
