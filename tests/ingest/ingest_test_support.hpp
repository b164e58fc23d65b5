// What the ingest tests share: the device of a backend (seeded jitter on host), a fill that writes the
// verification pattern of each sample, a check of a batch read back, and a watchdog against deadlocks.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <memory>
#include <span>
#include <string>
#include <utility>

#include "ferry/core/pattern.hpp"
#include "ferry/core/pattern_word.hpp"
#include "ferry/device/device.hpp"
#include "ferry/ingest/ingest.hpp"
#include "support/test_support.hpp"

namespace ferry::ingest::testing {

using namespace std::chrono_literals;
using ferry::testing::backends_under_test;
using ferry::testing::message_of;

using ferry::testing::backend_test_name;

/// GPU 0 on cuda; on host, seeded random delays (so early reuse shows up as wrong bytes) and, unless
/// `slow_h2d_gbps` is set, no link model.
inline std::unique_ptr<device> make_device_under_test(backend b, double slow_h2d_gbps = 0) {
  host_device_options o = ferry::testing::jittery_host_options(20261123);
  if (slow_h2d_gbps > 0) {
    o.model_link = true;
    o.h2d_gbps = slow_h2d_gbps;
    o.latency = std::chrono::nanoseconds(0);
  }
  return ferry::testing::make_device_under_test(b, o);
}

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

/// The pattern seed of field `f` of a sample of seed `seed`.
inline std::uint64_t field_seed(std::uint64_t seed, std::size_t f) {
  return mix64(seed + 0x51ED27 * (f + 1));
}

/// Writes the pattern of each field of the sample.
inline void pattern_fill(const sample& s, sample_fields out) {
  for (std::size_t f = 0; f < out.size(); ++f) fill_pattern(out[f], field_seed(s.seed, f));
}

/// Small batches: 8 samples of a 3 KiB image and an 8-byte label.
inline loader_options small_options(std::uint64_t dataset, std::uint64_t epochs, bool shuffle,
                                    bool drop_last) {
  loader_options o;
  o.fields = {{"image", 3 * 1024}, {"label", 8}};
  o.sampling.dataset_size = dataset;
  o.sampling.batch_size = 8;
  o.sampling.shuffle = shuffle;
  o.sampling.seed = 7;
  o.sampling.drop_last = drop_last;
  o.workers = 3;
  o.slots = 3;
  o.epochs = epochs;
  o.seed = 99;
  return o;
}

/// Checks every byte of a batch whose fields are laid out as the loader's: `field_bytes(f)` gives the
/// bytes of field f (samples * sample_bytes). Returns a description of the first mismatch, or "".
template <class FieldBytes>
std::string check_batch(const loader& l, std::uint64_t epoch, std::uint64_t batch, std::size_t samples,
                        FieldBytes field_bytes) {
  const auto& o = l.options();
  for (std::size_t f = 0; f < o.fields.size(); ++f) {
    const std::span<const std::byte> bytes = field_bytes(f);
    const std::size_t sb = o.fields[f].sample_bytes;
    if (bytes.size() != samples * sb) return "field " + std::to_string(f) + " has the wrong size";
    for (std::size_t j = 0; j < samples; ++j) {
      const std::uint64_t index = l.batches().index(epoch, static_cast<std::size_t>(batch), j);
      const std::uint64_t seed = field_seed(sample_seed(o.seed, epoch, index), f);
      if (auto bad = find_pattern_mismatch(bytes.subspan(j * sb, sb), seed)) {
        return "epoch " + std::to_string(epoch) + " batch " + std::to_string(batch) + " sample " +
               std::to_string(j) + " field " + std::to_string(f) + ": byte " + std::to_string(*bad) +
               " is wrong";
      }
    }
  }
  return {};
}

/// Runs `body` on another thread; fails and ends the process if it has not returned within `limit`.
template <class F>
void with_watchdog(std::chrono::seconds limit, F&& body) {
  auto done = std::async(std::launch::async, std::forward<F>(body));
  if (done.wait_for(limit) == std::future_status::timeout) {
    ADD_FAILURE() << "deadlock: the test body did not finish within " << limit.count() << " s";
    std::fprintf(stderr, "ingest test watchdog: %s did not finish within %lld s; aborting\n",
                 ::testing::UnitTest::GetInstance()->current_test_info()->name(),
                 static_cast<long long>(limit.count()));
    std::fflush(stderr);
    std::_Exit(3);
  }
  done.get();
}

}  // namespace ferry::ingest::testing
