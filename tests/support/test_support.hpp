// Helpers every backend-parameterized test suite shares: which backends to run (FERRY_TEST_BACKENDS)
// and checks on exception messages.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/core/error.hpp"
#include "ferry/cuda/cuda.hpp"
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

/// "host" or "cuda": the parameter's part of a test's name.
inline std::string backend_test_name(const ::testing::TestParamInfo<backend>& info) {
  return std::string(to_string(info.param));
}

/// Host-device options for tests: seeded random delays before stream operations, so that a premature read
/// or reuse shows up as wrong bytes, and no link model, so that tests run at memcpy speed.
inline host_device_options jittery_host_options(
    std::uint64_t seed, double probability = 0.2,
    std::chrono::nanoseconds max_delay = std::chrono::microseconds(100)) {
  host_device_options o;
  o.seed = seed;
  o.jitter_probability = probability;
  o.jitter_max = max_delay;
  o.model_link = false;
  return o;
}

/// The device of a test: GPU 0 on cuda (an exception, so a failure, when there is none), else an emulated
/// device with `host` options.
inline std::unique_ptr<device> make_device_under_test(backend b, const host_device_options& host) {
  if (b == backend::cuda) return make_cuda_device(0);
  return make_host_device(host);
}

/// A one-way gate: threads that pass() wait until some thread open()s it (e.g. to hold a sink or a fill
/// inside its callback while a test checks back-pressure).
class gate {
 public:
  void open() {
    {
      const std::lock_guard lock(mu_);
      open_ = true;
    }
    cv_.notify_all();
  }
  void pass() {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return open_; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = false;
};

/// Holds a stream at a host function until open() (or destruction), so that the work a test queues
/// behind it starts at one moment, however slowly a busy machine lets the test queue it.
class held_stream {
 public:
  held_stream(device& dev, stream_view s) : gate_(std::make_shared<gate>()) {
    dev.launch_host_func(s, [g = gate_] { g->pass(); });
  }
  held_stream(const held_stream&) = delete;
  held_stream& operator=(const held_stream&) = delete;
  ~held_stream() { gate_->open(); }
  void open() { gate_->open(); }

 private:
  std::shared_ptr<gate> gate_;  // shared with the host function, which may run after the holder is gone
};

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

/// Expects `message` to contain `text`, printing the message when it does not. `message` is evaluated once.
#define EXPECT_MESSAGE_HAS(message, text)                                          \
  do {                                                                             \
    const std::string ferry_message_ = (message);                                  \
    EXPECT_NE(std::string_view(ferry_message_).find(text), std::string_view::npos) \
        << "message: " << ferry_message_;                                          \
  } while (0)
