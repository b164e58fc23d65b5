#include "ferry/core/error.hpp"

#include <gtest/gtest.h>

#include <string>

namespace {

void expects_positive(int v) { FERRY_EXPECTS(v > 0, "value " + std::to_string(v) + " must be positive"); }

TEST(error, expects_throws_logic_error_with_message_first) {
  try {
    expects_positive(-3);
    FAIL() << "FERRY_EXPECTS did not throw";
  } catch (const ferry::logic_error& e) {
    const std::string what = e.what();
    EXPECT_EQ(what.rfind("value -3 must be positive", 0), 0U) << what;
    EXPECT_NE(what.find("error_test.cpp:"), std::string::npos) << what;
  }
}

TEST(error, expects_does_not_evaluate_message_on_success) {
  int evaluated = 0;
  auto message = [&] {
    ++evaluated;
    return std::string("never");
  };
  FERRY_EXPECTS(1 + 1 == 2, message());
  EXPECT_EQ(evaluated, 0);
  EXPECT_THROW(FERRY_EXPECTS(false, message()), ferry::logic_error);
  EXPECT_EQ(evaluated, 1);
}

TEST(error, logic_error_is_a_std_logic_error) { EXPECT_THROW(expects_positive(0), std::logic_error); }

TEST(error, cuda_error_keeps_code) {
  const ferry::cuda_error e(2, "cudaMalloc failed: out of memory");
  EXPECT_EQ(e.code(), 2);
  EXPECT_STREQ(e.what(), "cudaMalloc failed: out of memory");
}

void report_from_one_site(int i) { FERRY_ASSERT_NOTHROW(i < 0, "destructor saw " + std::to_string(i)); }

TEST(error, report_destructor_error_prints_once_per_call_site_and_never_throws) {
  ferry::detail::forget_reported_destructor_errors();
  ::testing::internal::CaptureStderr();
  for (int i = 0; i < 5; ++i) report_from_one_site(i);
  FERRY_ASSERT_NOTHROW(false, "second site");
  FERRY_ASSERT_NOTHROW(true, "not reported");
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("destructor saw 0"), std::string::npos) << err;
  EXPECT_EQ(err.find("destructor saw 1"), std::string::npos) << err;
  EXPECT_NE(err.find("second site"), std::string::npos) << err;
  EXPECT_EQ(err.find("not reported"), std::string::npos) << err;
  EXPECT_NE(err.find("error_test.cpp:"), std::string::npos) << err;

  ferry::detail::forget_reported_destructor_errors();
  ::testing::internal::CaptureStderr();
  report_from_one_site(7);
  const std::string again = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(again.find("destructor saw 7"), std::string::npos) << again;
}

}  // namespace
