// What the host communicator's tests share: a group of emulated devices with one rank each, and a way to
// drive every rank from its own thread, as a training process drives each GPU.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "ferry/comm/communicator.hpp"
#include "ferry/device/device.hpp"

namespace ferry::comm::testing {

/// Collectives at memcpy speed (tests of bytes), with a timeout a healthy test never reaches.
inline comm_options unmodelled(std::chrono::milliseconds timeout = std::chrono::seconds(60)) {
  comm_options o;
  o.timeout = timeout;
  o.link.model = false;
  return o;
}

/// Emulated devices with seeded random delays before stream operations (so a rank that reads too early
/// sees wrong bytes) and no link model.
inline host_device_options jittery(std::uint64_t seed) {
  host_device_options o;
  o.seed = seed;
  o.jitter_probability = 0.2;
  o.jitter_max = std::chrono::microseconds(200);
  o.model_link = false;
  return o;
}

/// `n` emulated devices and a host group over them; the communicators die before the devices.
struct host_ranks {
  std::vector<std::unique_ptr<device>> devices;
  std::vector<std::unique_ptr<communicator>> comms;

  explicit host_ranks(int n, const comm_options& options = unmodelled(), std::uint64_t seed = 1) {
    std::vector<device*> raw;
    for (int r = 0; r < n; ++r) {
      devices.push_back(make_host_device(jittery(seed * 100 + static_cast<std::uint64_t>(r))));
      raw.push_back(devices.back().get());
    }
    comms = make_host_group(raw, options);
  }
  host_ranks(const host_ranks&) = delete;
  host_ranks& operator=(const host_ranks&) = delete;
  ~host_ranks() { comms.clear(); }

  [[nodiscard]] int size() const { return static_cast<int>(comms.size()); }
  communicator& operator[](int r) { return *comms[static_cast<std::size_t>(r)]; }
  device& dev(int r) { return *devices[static_cast<std::size_t>(r)]; }
};

/// Runs fn(rank) for rank 0..n-1, each on its own thread; joins them all, then rethrows the first
/// exception one of them threw (gtest failures inside fn are recorded as usual).
inline void on_every_rank(int n, const std::function<void(int)>& fn) {
  std::mutex mu;
  std::exception_ptr first;
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        fn(r);
      } catch (...) {
        const std::lock_guard lock(mu);
        if (!first) first = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  if (first) std::rethrow_exception(first);
}

}  // namespace ferry::comm::testing
