// What the egress tests share: the backends under test (FERRY_TEST_BACKENDS, as in the device
// conformance suite), a producer that writes verifiable outputs on the device, and a watchdog that turns
// a deadlock into a failure.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <future>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ferry/core/error.hpp"
#include "ferry/device/device.hpp"
#include "ferry/egress/egress.hpp"
#include "support/test_support.hpp"

namespace ferry::egress::testing {

using namespace std::chrono_literals;

using ferry::testing::backends_under_test;
using ferry::testing::message_of;

using ferry::testing::backend_test_name;

/// The device of an egress test: seeded random delays and no link model on the host backend.
inline std::unique_ptr<device> make_device_under_test(backend b) {
  return ferry::testing::make_device_under_test(b, ferry::testing::jittery_host_options(20261122));
}

/// A fixture parameterized by backend, with its device.
class on_backend : public ::testing::TestWithParam<backend> {
 protected:
  void SetUp() override {
    try {
      dev_ = make_device_under_test(GetParam());
    } catch (const std::exception& e) {
      FAIL() << "cannot make a " << to_string(GetParam()) << " device: " << e.what();
    }
  }
  device& dev() { return *dev_; }
  std::unique_ptr<device> dev_;
};

/// Fills `out` with bytes that depend on `seed` and their position, 8 at a time.
inline void fill_bytes(std::span<std::byte> out, std::uint64_t seed) {
  std::uint64_t x = seed * 0x9E3779B97F4A7C15ULL + 0x632BE59BD9B4E019ULL;
  std::size_t i = 0;
  for (; i + 8 <= out.size(); i += 8) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    std::memcpy(out.data() + i, &x, 8);
  }
  x ^= x << 13;
  for (; i < out.size(); ++i) out[i] = std::byte{static_cast<std::uint8_t>(x >> (8 * (i % 8)))};
}

/// Writes outputs on the device for a pipeline: `buffers` device buffers used in rotation, each filled on
/// the producer stream by a copy from its own pinned staging buffer. A device buffer is written again only
/// after the producer stream waited on the event submit returned for its previous output, and a staging
/// buffer only after the copy out of it completed, so every byte the pipeline delivers is the pattern
/// of its output unless the pipeline's event or its reads are early.
class producer {
 public:
  producer(device& dev, std::size_t buffers, std::size_t max_bytes) : dev_(dev), stream_(dev.make_stream()) {
    for (std::size_t i = 0; i < buffers; ++i) {
      device_.push_back(dev.alloc_device(max_bytes));
      staging_.push_back(dev.alloc_pinned(max_bytes));
      staged_.push_back(dev.make_event());
      copied_.emplace_back();
    }
  }

  struct output {
    mem_view view;               // device bytes to submit
    std::uint64_t checksum = 0;  // checksum_of the bytes written
    std::size_t buffer = 0;      // pass to copied()
  };

  /// The next output: `bytes` bytes of the pattern of `seed`, queued on the producer stream.
  output next(std::size_t bytes, std::uint64_t seed) {
    const std::size_t b = next_++ % device_.size();
    if (staged_[b].recorded()) staged_[b].synchronize();
    const std::span<std::byte> host(staging_[b].host_bytes(), bytes);
    fill_bytes(host, seed);
    output o{device_[b].view(0, bytes), checksum_of(host), b};
    if (!copied_[b].empty()) stream_.wait(copied_[b]);
    dev_.copy_async(device_[b], staging_[b], bytes, stream_);
    staged_[b].record(stream_);
    return o;
  }

  /// Hands over the event submit returned for the output written into `buffer`.
  void copied(std::size_t buffer, event e) { copied_[buffer] = std::move(e); }

  [[nodiscard]] stream_view producer_stream() const { return stream_.view(); }

 private:
  device& dev_;
  stream stream_;
  std::vector<buffer> device_;
  std::vector<buffer> staging_;
  std::vector<event> staged_;
  std::vector<event> copied_;
  std::size_t next_ = 0;
};

/// Runs `body` on another thread and fails the test, ending the process, if it has not returned within
/// `limit`: a deadlock would otherwise hang the suite (and the future's destructor would wait forever).
template <class F>
void with_watchdog(std::chrono::seconds limit, F&& body) {
  auto done = std::async(std::launch::async, std::forward<F>(body));
  if (done.wait_for(limit) == std::future_status::timeout) {
    ADD_FAILURE() << "deadlock: the test body did not finish within " << limit.count() << " s";
    std::fprintf(stderr, "egress test watchdog: %s did not finish within %lld s; aborting\n",
                 ::testing::UnitTest::GetInstance()->current_test_info()->name(),
                 static_cast<long long>(limit.count()));
    std::fflush(stderr);
    std::_Exit(3);
  }
  done.get();
}

}  // namespace ferry::egress::testing
