#include "ferry/bench/egress_bench.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <string>

#include "ferry/core/error.hpp"

namespace {

ferry::bench::egress_options tiny() {
  ferry::bench::egress_options c = ferry::bench::default_egress_options(ferry::backend::host);
  c.batch = 2;
  c.classes = 3;
  c.height = 64;
  c.width = 64 + 3;  // an odd row, so outputs are not a multiple of the slot
  c.compute = std::chrono::milliseconds(10);
  c.warmup = 1;
  c.steps = 4;
  c.workers = 2;
  c.pool_buffers = 2;
  c.slot_bytes = 16 * 1024;
  c.slots = 4;
  c.probed_gbps = 10;  // skip the probe: the test checks the ladder, not the link
  return c;
}

TEST(egress_bench, every_level_delivers_and_checks_every_byte) {
  ferry::host_device_options o;
  o.jitter_probability = 0.2;
  o.jitter_max = std::chrono::microseconds(200);
  o.seed = 11;
  auto dev = ferry::make_host_device(o);
  const auto cfg = tiny();
  const auto r = ferry::bench::run_egress(*dev, cfg);
  ASSERT_EQ(r.rows.size(), cfg.levels.size());
  for (const auto& row : r.rows) {
    SCOPED_TRACE(row.level);
    EXPECT_EQ(row.wrong, 0u);
    EXPECT_EQ(row.steps, cfg.steps);
    EXPECT_GT(row.steps_per_s, 0.0);
    EXPECT_GE(row.gpu_idle, 0.0);
    EXPECT_LE(row.gpu_idle, 1.0);
    if (row.level == "ideal") {
      EXPECT_DOUBLE_EQ(row.ratio_to_ideal, 1.0);
      EXPECT_EQ(row.bytes, 0u);
    } else {
      EXPECT_EQ(row.bytes, cfg.output_bytes() * cfg.steps);
      EXPECT_EQ(row.checked, cfg.output_bytes() * (cfg.steps + cfg.warmup));
      EXPECT_GT(row.gbps, 0.0);
    }
  }
  // Every level queues the model's compute (a spin) once per step on one stream after its window opens,
  // and the emulator never ends a spin before its modelled end: no level can beat steps x compute, on an
  // idle machine or a busy one. (How close each comes to it is speed, which the bench itself reports.)
  const double ceiling = 1.0 / std::chrono::duration<double>(cfg.compute).count();
  for (const auto& row : r.rows) EXPECT_LE(row.steps_per_s, ceiling * (1 + 1e-9)) << row.level;
  const std::string table = ferry::bench::format_table(r);
  for (const auto& level : cfg.levels) EXPECT_NE(table.find(level), std::string::npos) << level;
}

TEST(egress_bench, pure_copy_checks_every_output) {
  auto dev = ferry::make_host_device();
  const auto r = ferry::bench::run_egress_pure_copy(*dev, tiny(), 6);
  EXPECT_EQ(r.mismatches, 0u);
  EXPECT_EQ(r.outputs, 6);
  EXPECT_GT(r.gbps, 0.0);
  EXPECT_GT(r.copy_gbps, 0.0);
}

TEST(egress_bench, a_window_that_ends_at_its_start_still_times_one_output) {
  // A busy machine can make a run's set-up outlast the window it shares with another: the window then
  // still holds one output, so its figures are never those of an empty window.
  auto dev = ferry::make_host_device();
  ferry::bench::start_line line(1, std::chrono::nanoseconds(0));
  const auto r = ferry::bench::run_egress_pure_copy(*dev, tiny(), 6, {}, &line);
  EXPECT_EQ(r.outputs, 1);
  EXPECT_EQ(r.mismatches, 0u);
  EXPECT_GT(r.gbps, 0.0);
}

TEST(egress_bench, bad_configuration_names_the_value) {
  auto dev = ferry::make_host_device();
  auto cfg = tiny();
  cfg.levels = {"ideal", "L9"};
  try {
    (void)ferry::bench::run_egress(*dev, cfg);
    FAIL() << "unknown level accepted";
  } catch (const ferry::logic_error& e) {
    EXPECT_NE(std::string(e.what()).find("\"L9\""), std::string::npos) << e.what();
  }
  cfg = tiny();
  cfg.steps = 0;
  EXPECT_THROW((void)ferry::bench::run_egress(*dev, cfg), ferry::logic_error);
  cfg = tiny();
  cfg.height = 0;
  EXPECT_THROW((void)ferry::bench::run_egress(*dev, cfg), ferry::logic_error);
}

}  // namespace
