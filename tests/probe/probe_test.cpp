#include "ferry/probe/probe.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <string>

#include "ferry/core/error.hpp"
#include "ferry/core/units.hpp"

namespace {

ferry::probe::options small_options() {
  ferry::probe::options o;
  o.copy_bytes = 8 * ferry::MiB;
  o.warmup = 1;
  o.iterations = 3;
  o.pin_bytes = 1 * ferry::MiB;
  return o;
}

TEST(probe, measures_every_link_and_checks_its_bytes) {
  auto dev = ferry::make_host_device();
  const auto r = ferry::probe::run(*dev, small_options());
  for (const char* name : {"pinned H2D", "pinned D2H", "pageable H2D", "pageable D2H", "D2D"}) {
    const auto* l = r.find(name);
    ASSERT_NE(l, nullptr) << name;
    EXPECT_TRUE(l->checked) << name;
    EXPECT_GT(l->median_gbps, 0.0) << name;
    EXPECT_LE(l->min_gbps, l->median_gbps) << name;
    EXPECT_LE(l->median_gbps, l->max_gbps) << name;
    EXPECT_EQ(l->bytes, 8 * ferry::MiB);
    EXPECT_EQ(l->iterations, 3);
  }
  EXPECT_EQ(r.find("pinned H2D")->direction, ferry::copy_direction::host_to_device);
  EXPECT_EQ(r.find("pageable D2H")->direction, ferry::copy_direction::device_to_host);
  EXPECT_EQ(r.find("pageable D2H")->host_memory, ferry::memory_kind::pageable);
  EXPECT_GT(r.duplex.total_gbps, 0.0);
  EXPECT_EQ(r.pin_cost.bytes, 1 * ferry::MiB);
  EXPECT_GT(r.pin_cost.seconds_per_gib(), 0.0);
  EXPECT_EQ(r.device.kind, ferry::backend::host);
  // Every buffer the probe pinned was given back.
  EXPECT_EQ(dev->pinned().bytes, 0u);
}

// The GB/s of one copy of `bytes` on a modelled link of `gbps` with `latency` before the first byte.
double modelled_gbps(std::size_t bytes, double gbps, std::chrono::nanoseconds latency) {
  const double ns = static_cast<double>(latency.count()) + static_cast<double>(bytes) / gbps;
  return static_cast<double>(bytes) / ns;
}

TEST(probe, reports_the_modelled_link_of_the_emulated_device) {
  // The emulator's events measure modelled time, and the probe queues its pinned copies behind a gate,
  // so the pinned figures are the model's exactly, however busy the machine is.
  ferry::host_device_options hopts;
  hopts.h2d_gbps = 1.0;
  hopts.d2h_gbps = 2.0;
  hopts.pageable_h2d_gbps = 0.5;
  hopts.pageable_d2h_gbps = 0.5;
  hopts.duplex_gbps = 2.0;
  hopts.latency = std::chrono::microseconds(10);
  auto dev = ferry::make_host_device(hopts);
  auto o = small_options();
  o.copy_bytes = 4 * ferry::MiB;
  o.measure_pin_cost = false;
  const auto r = ferry::probe::run(*dev, o);
  const auto model = [&](double gbps) { return modelled_gbps(o.copy_bytes, gbps, hopts.latency); };
  constexpr double rel = 1e-6;  // rounding to whole nanoseconds
  for (const char* name : {"pinned H2D", "pinned D2H"}) {
    const auto* l = r.find(name);
    const double expected = model(l->direction == ferry::copy_direction::host_to_device ? 1.0 : 2.0);
    EXPECT_NEAR(l->min_gbps, expected, expected * rel) << name;
    EXPECT_NEAR(l->max_gbps, expected, expected * rel) << name;
  }
  // A pageable copy returns only once done, so it cannot be queued behind a gate: its time holds the
  // host's moments between record and copy too. It never beats its model, and stays below the pinned one.
  for (const char* name : {"pageable H2D", "pageable D2H"}) {
    const auto* l = r.find(name);
    EXPECT_GT(l->min_gbps, 0.0) << name;
    EXPECT_LE(l->max_gbps, model(0.5) * (1 + rel)) << name;
  }
  // Both directions share the duplex budget: H2D's 1 GB/s fits within half of it, so H2D keeps its rate;
  // D2H runs between 1 GB/s (half the budget, while H2D runs) and its own 2 GB/s. The window is H2D's.
  EXPECT_NEAR(r.duplex.h2d_gbps, model(1.0), model(1.0) * rel);
  EXPECT_GE(r.duplex.d2h_gbps, model(1.0) * (1 - rel));
  EXPECT_LE(r.duplex.d2h_gbps, model(2.0) * (1 + rel));
  EXPECT_NEAR(r.duplex.total_gbps, 2 * model(1.0), 2 * model(1.0) * rel);
}

TEST(probe, timing_ignores_a_stream_thread_run_late) {
  // Jitter delays every operation of the emulator's streams by up to 20 ms of wall time, as a busy
  // machine does; the probe's pinned figures are modelled time and so do not change.
  ferry::host_device_options hopts;
  hopts.h2d_gbps = 4.0;
  hopts.d2h_gbps = 4.0;
  hopts.latency = std::chrono::microseconds(5);
  hopts.jitter_probability = 1.0;
  hopts.jitter_max = std::chrono::milliseconds(20);
  hopts.seed = 3;
  auto dev = ferry::make_host_device(hopts);
  auto o = small_options();
  o.copy_bytes = 1 * ferry::MiB;
  o.measure_pin_cost = false;
  const auto r = ferry::probe::run(*dev, o);
  const double expected = modelled_gbps(o.copy_bytes, 4.0, hopts.latency);
  for (const char* name : {"pinned H2D", "pinned D2H"}) {
    EXPECT_NEAR(r.find(name)->min_gbps, expected, expected * 1e-6) << name;
    EXPECT_NEAR(r.find(name)->max_gbps, expected, expected * 1e-6) << name;
  }
}

TEST(probe, rejects_a_zero_size_and_zero_iterations_with_the_value) {
  auto dev = ferry::make_host_device();
  auto o = small_options();
  o.copy_bytes = 0;
  try {
    (void)ferry::probe::run(*dev, o);
    FAIL() << "a probe of 0 bytes ran";
  } catch (const ferry::logic_error& e) {
    EXPECT_NE(std::string(e.what()).find("size is 0"), std::string::npos) << e.what();
  }
  o = small_options();
  o.iterations = 0;
  try {
    (void)ferry::probe::run(*dev, o);
    FAIL() << "a probe of 0 iterations ran";
  } catch (const ferry::logic_error& e) {
    EXPECT_NE(std::string(e.what()).find("iterations is 0"), std::string::npos) << e.what();
  }
}

TEST(probe, table_names_every_link) {
  auto dev = ferry::make_host_device();
  auto o = small_options();
  o.copy_bytes = 1 * ferry::MiB;
  const std::string table = ferry::probe::format_table(ferry::probe::run(*dev, o));
  for (const char* name : {"pinned H2D", "pinned D2H", "pageable H2D", "pageable D2H", "D2D", "both ways",
                           "RLIMIT_MEMLOCK", "pinning"}) {
    EXPECT_NE(table.find(name), std::string::npos) << name << " missing from:\n" << table;
  }
}

}  // namespace
