// ferry::shim's CUPTI table (built with the cuda backend only): where libcupti is looked for, the errors
// when it is missing or is not CUPTI, and the table loaded from the toolkit when this machine has one.
// Calls only entry points that need no GPU.
#include <gtest/gtest.h>

#if FERRY_SHIM_TESTS_CUPTI
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "ferry/core/error.hpp"
#include "ferry/shim/cupti.hpp"

namespace ferry::shim {
namespace {

bool contains(const std::vector<std::string>& names, const std::string& name) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

TEST(cupti, the_names_tried_start_with_the_toolkit_soname_then_libcupti_so_then_absolute_paths) {
  const std::vector<std::string>& names = cupti_library_names();
  ASSERT_GE(names.size(), 3u);
  EXPECT_EQ(names.front().rfind("libcupti.so.", 0), 0u) << names.front();
  EXPECT_TRUE(contains(names, "libcupti.so"));
  EXPECT_TRUE(contains(names, "/usr/local/cuda/lib64/libcupti.so"));
  EXPECT_TRUE(contains(names, "/usr/local/cuda/extras/CUPTI/lib64/libcupti.so"));
  // Bare names first, so LD_LIBRARY_PATH and ld.so.cache win over the fixed folders.
  const auto first_path = std::find_if(names.begin(), names.end(),
                                       [](const std::string& n) { return n.find('/') != std::string::npos; });
  EXPECT_TRUE(std::all_of(first_path, names.end(),
                          [](const std::string& n) { return n.find('/') != std::string::npos; }));
}

TEST(cupti, a_missing_libcupti_throws_cuda_error_naming_every_library_tried) {
  try {
    static_cast<void>(load_cupti({"libcupti-ferry-missing.so.13", "/nonexistent/ferry/libcupti.so"}));
    FAIL() << "loading CUPTI from libraries that do not exist must throw";
  } catch (const cuda_error& e) {
    const std::string what = e.what();
    EXPECT_EQ(e.code(), static_cast<int>(CUPTI_ERROR_NOT_INITIALIZED));
    EXPECT_EQ(what.rfind("CUPTI not available: ", 0), 0u) << what;
    EXPECT_NE(what.find("dlopen(\"libcupti-ferry-missing.so.13\") failed: "), std::string::npos) << what;
    EXPECT_NE(what.find("dlopen(\"/nonexistent/ferry/libcupti.so\") failed: "), std::string::npos) << what;
    EXPECT_NE(what.find("LD_LIBRARY_PATH"), std::string::npos) << what;
  }
}

TEST(cupti, a_library_that_is_not_cupti_throws_naming_it_and_the_missing_entry_point) {
  try {
    static_cast<void>(load_cupti({"libm.so.6"}));
    FAIL() << "libm has no CUPTI entry point";
  } catch (const cuda_error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("libm.so.6"), std::string::npos) << what;
    EXPECT_NE(what.find("cuptiGetVersion"), std::string::npos) << what;
  }
}

TEST(cupti, the_table_is_complete_and_names_its_file_or_says_which_libraries_were_tried) {
  const cupti_api* api = nullptr;
  try {
    api = &cupti();
  } catch (const cuda_error& e) {
    // No CUPTI on this machine: the process-wide table reports it, and keeps reporting it.
    EXPECT_NE(std::string(e.what()).find(cupti_library_names().front()), std::string::npos) << e.what();
    EXPECT_THROW(static_cast<void>(cupti()), cuda_error);
    GTEST_SKIP() << "no libcupti here: " << e.what();
  }
  EXPECT_EQ(&cupti(), api) << "loaded once";
  EXPECT_TRUE(api->library.loaded());
  EXPECT_EQ(api->path.front(), '/') << api->path;
  EXPECT_NE(api->path.find("libcupti"), std::string::npos) << api->path;
  for (const void* fn : {reinterpret_cast<const void*>(api->get_version),
                         reinterpret_cast<const void*>(api->get_result_string),
                         reinterpret_cast<const void*>(api->get_timestamp),
                         reinterpret_cast<const void*>(api->get_callback_name),
                         reinterpret_cast<const void*>(api->set_thread_id_type),
                         reinterpret_cast<const void*>(api->activity_register_callbacks),
                         reinterpret_cast<const void*>(api->activity_register_timestamp_callback),
                         reinterpret_cast<const void*>(api->activity_enable),
                         reinterpret_cast<const void*>(api->activity_disable),
                         reinterpret_cast<const void*>(api->activity_flush_all),
                         reinterpret_cast<const void*>(api->activity_get_next_record),
                         reinterpret_cast<const void*>(api->activity_get_num_dropped_records)})
    EXPECT_NE(fn, nullptr);
  // Neither call needs a GPU: the version of the loaded library, and a result in words.
  std::uint32_t version = 0;
  ASSERT_EQ(api->get_version(&version), CUPTI_SUCCESS);
  EXPECT_GE(version, static_cast<std::uint32_t>(CUPTI_API_VERSION))
      << api->path << " is older than the <cupti.h> ferry was built with";
  const char* text = nullptr;
  ASSERT_EQ(api->get_result_string(CUPTI_ERROR_INVALID_PARAMETER, &text), CUPTI_SUCCESS);
  ASSERT_NE(text, nullptr);
  EXPECT_GT(std::string(text).size(), 0u);
}

}  // namespace
}  // namespace ferry::shim
#endif  // without the CUDA toolkit there is no CUPTI shim to test
