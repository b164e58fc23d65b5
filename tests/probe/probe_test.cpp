#include "ferry/probe/probe.hpp"

#include <gtest/gtest.h>

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

#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
// Sanitizers slow memcpy by an order of magnitude, so the modelled link is slowed as much to stay slower.
constexpr double model_scale = 0.1;
#else
constexpr double model_scale = 1.0;
#endif

TEST(probe, reports_the_modelled_link_of_the_emulated_device) {
  // A slow modelled link dominates memcpy time, so the probe must find the modelled figures.
  constexpr double k = model_scale;
  ferry::host_device_options hopts;
  hopts.h2d_gbps = 1.0 * k;
  hopts.d2h_gbps = 2.0 * k;
  hopts.pageable_h2d_gbps = 0.5 * k;
  hopts.pageable_d2h_gbps = 0.5 * k;
  hopts.duplex_gbps = 2.0 * k;
  hopts.latency = std::chrono::microseconds(10);
  auto dev = ferry::make_host_device(hopts);
  auto o = small_options();
  o.copy_bytes = 4 * ferry::MiB;
  o.measure_pin_cost = false;
  const auto r = ferry::probe::run(*dev, o);
  EXPECT_NEAR(r.find("pinned H2D")->median_gbps, 1.0 * k, 0.15 * k);
  EXPECT_NEAR(r.find("pinned D2H")->median_gbps, 2.0 * k, 0.3 * k);
  EXPECT_NEAR(r.find("pageable H2D")->median_gbps, 0.5 * k, 0.08 * k);
  // Both directions share the duplex budget: together they cannot beat it by more than noise. The lower
  // bound is loose, since two memcpys at once on a loaded 2-core machine (or under a sanitizer) can fall
  // below a 2 GB/s model; that both directions moved at all is what it checks.
  EXPECT_LT(r.duplex.total_gbps, 2.0 * k * 1.15);
  EXPECT_GT(r.duplex.total_gbps, 2.0 * k * 0.2);
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
