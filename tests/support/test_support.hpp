// Helpers every backend-parameterized test suite shares: which backends to run (FERRY_TEST_BACKENDS)
// and checks on exception messages.
#pragma once

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/core/error.hpp"
#include "ferry/device/device.hpp"

namespace ferry::testing {

/// The backends named in FERRY_TEST_BACKENDS (comma-separated "host", "cuda"; default "host"). A name
/// that is not a backend ends the test program, since a suite that tests nothing must not pass.
inline std::vector<backend> backends_under_test() {
  const char* env = std::getenv("FERRY_TEST_BACKENDS");
  const std::string text = env != nullptr && *env != '\0' ? env : "host";
  std::vector<backend> out;
  std::size_t begin = 0;
  while (begin <= text.size()) {
    std::size_t end = text.find(',', begin);
    if (end == std::string::npos) end = text.size();
    std::string name = text.substr(begin, end - begin);
    name.erase(0, name.find_first_not_of(" \t"));
    name.erase(name.find_last_not_of(" \t") + 1);
    if (!name.empty()) {
      try {
        out.push_back(parse_backend(name));
      } catch (const logic_error& e) {
        // Registration runs before main: exit loudly rather than run a suite that tests nothing.
        std::fprintf(stderr, "FERRY_TEST_BACKENDS=\"%s\": %s\n", text.c_str(), e.what());
        std::exit(2);
      }
    }
    begin = end + 1;
  }
  if (out.empty()) {
    std::fprintf(stderr, "FERRY_TEST_BACKENDS=\"%s\" names no backend\n", text.c_str());
    std::exit(2);
  }
  return out;
}

/// The message of the exception of type E that `f` throws; a test failure when it throws nothing or
/// something else.
template <class E, class F>
std::string message_of(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "threw the wrong type: " << e.what();
    return {};
  }
  ADD_FAILURE() << "threw nothing";
  return {};
}

}  // namespace ferry::testing

/// Expects `message` to contain `text`, printing the message when it does not.
#define EXPECT_MESSAGE_HAS(message, text) \
  EXPECT_NE(std::string_view(message).find(text), std::string_view::npos) << "message: " << (message)
