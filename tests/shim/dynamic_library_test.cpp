// ferry::shim::dynamic_library: opening, symbol lookup, the errors that name what was tried, ownership.
#include "ferry/shim/dynamic_library.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <utility>

#include "ferry/core/error.hpp"

namespace ferry::shim {
namespace {

using cos_fn = double (*)(double);

TEST(dynamic_library, opens_the_first_name_that_loads_and_its_functions_compute) {
  const dynamic_library lib = dynamic_library::open({"libferry-no-such-library.so.7", "libm.so.6"});
  ASSERT_TRUE(lib.loaded()) << lib.error();
  EXPECT_EQ(lib.name(), "libm.so.6");
  EXPECT_TRUE(lib.error().empty());
  // The loader resolved the bare soname to a file of that name.
  EXPECT_NE(lib.path().find("libm.so.6"), std::string::npos) << lib.path();
  ASSERT_NE(lib.find("cos"), nullptr);
  const auto cos = lib.function<cos_fn>("cos");
  EXPECT_EQ(cos(0.0), 1.0);
  EXPECT_DOUBLE_EQ(cos(M_PI), -1.0);
  EXPECT_EQ(lib.optional_function<cos_fn>("cos"), cos);
}

TEST(dynamic_library, a_library_that_does_not_load_names_every_name_tried_and_what_dlopen_said) {
  const dynamic_library lib =
      dynamic_library::open({"libferry-missing-a.so.1", "/nonexistent/ferry/libferry-missing-b.so"});
  EXPECT_FALSE(lib.loaded());
  EXPECT_TRUE(lib.name().empty());
  EXPECT_TRUE(lib.path().empty());
  const std::string& e = lib.error();
  const std::size_t a = e.find("dlopen(\"libferry-missing-a.so.1\") failed: ");
  const std::size_t b = e.find("dlopen(\"/nonexistent/ferry/libferry-missing-b.so\") failed: ");
  ASSERT_NE(a, std::string::npos) << e;
  ASSERT_NE(b, std::string::npos) << e;
  EXPECT_LT(a, b) << "names are reported in the order tried: " << e;
  EXPECT_NE(e.find("cannot open shared object file"), std::string::npos) << e;
  EXPECT_EQ(lib.find("cos"), nullptr);
  EXPECT_EQ(lib.optional_function<cos_fn>("cos"), nullptr);
  try {
    static_cast<void>(lib.function<cos_fn>("cos"));
    FAIL() << "looking up a symbol in a library that did not load must throw";
  } catch (const logic_error& ex) {
    const std::string what = ex.what();
    EXPECT_NE(what.find("cos"), std::string::npos) << what;
    EXPECT_NE(what.find("libferry-missing-a.so.1"), std::string::npos) << what;
  }
}

TEST(dynamic_library, no_name_gives_an_error_rather_than_a_library) {
  const dynamic_library lib = dynamic_library::open({});
  EXPECT_FALSE(lib.loaded());
  EXPECT_FALSE(lib.error().empty());
}

TEST(dynamic_library, a_missing_symbol_throws_naming_the_library_and_the_symbol) {
  const dynamic_library lib = dynamic_library::open({"libm.so.6"});
  ASSERT_TRUE(lib.loaded()) << lib.error();
  EXPECT_EQ(lib.find("ferry_no_such_symbol"), nullptr);
  EXPECT_EQ(lib.optional_function<cos_fn>("ferry_no_such_symbol"), nullptr);
  try {
    static_cast<void>(lib.function<cos_fn>("ferry_no_such_symbol"));
    FAIL() << "a missing symbol must throw";
  } catch (const logic_error& ex) {
    const std::string what = ex.what();
    EXPECT_NE(what.find("libm.so.6"), std::string::npos) << what;
    EXPECT_NE(what.find("ferry_no_such_symbol"), std::string::npos) << what;
  }
}

TEST(dynamic_library, a_moved_from_library_is_empty_and_the_moved_to_one_keeps_working) {
  dynamic_library lib = dynamic_library::open({"libm.so.6"});
  ASSERT_TRUE(lib.loaded()) << lib.error();
  const auto cos = lib.function<cos_fn>("cos");

  dynamic_library moved(std::move(lib));
  EXPECT_FALSE(lib.loaded());  // NOLINT(bugprone-use-after-move): the moved-from state is the property
  EXPECT_EQ(lib.find("cos"), nullptr);
  EXPECT_TRUE(lib.path().empty());
  ASSERT_TRUE(moved.loaded());
  EXPECT_EQ(moved.function<cos_fn>("cos"), cos);

  dynamic_library assigned;
  EXPECT_FALSE(assigned.loaded());
  assigned = std::move(moved);
  EXPECT_FALSE(moved.loaded());  // NOLINT(bugprone-use-after-move)
  ASSERT_TRUE(assigned.loaded());
  EXPECT_EQ(assigned.function<cos_fn>("cos")(0.0), 1.0);
}

}  // namespace
}  // namespace ferry::shim
