#include "ferry/bench/ingest_bench.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <string>

#include "ferry/core/error.hpp"

namespace {

ferry::bench::ingest_options tiny() {
  ferry::bench::ingest_options c = ferry::bench::default_ingest_options(ferry::backend::host);
  c.batch = 4;
  c.height = 32;
  c.width = 33;
  c.compute = std::chrono::milliseconds(10);
  c.warmup = 1;
  c.steps = 5;
  c.workers = 2;
  c.host_slots = 2;
  c.probed_gbps = 10;  // skip the probe: the test checks the ladder, not the link
  return c;
}

TEST(ingest_bench, every_level_delivers_every_batch_intact) {
  ferry::host_device_options o;
  o.jitter_probability = 0.2;
  o.jitter_max = std::chrono::microseconds(200);
  o.seed = 5;
  auto dev = ferry::make_host_device(o);
  const auto cfg = tiny();
  const auto r = ferry::bench::run_ingest(*dev, cfg);
  ASSERT_EQ(r.rows.size(), cfg.levels.size());
  for (const auto& row : r.rows) {
    SCOPED_TRACE(row.level);
    EXPECT_EQ(row.wrong, 0u);
    EXPECT_EQ(row.checked, static_cast<std::uint64_t>(cfg.warmup + cfg.steps));
    EXPECT_GT(row.steps_per_s, 0.0);
    // The model's compute is a spin per step on one stream, never shorter than modelled: no level can
    // beat steps x compute, however busy the machine (how close each comes is the bench's to report).
    EXPECT_LE(row.steps_per_s, 1.0 / std::chrono::duration<double>(cfg.compute).count() * (1 + 1e-9));
    EXPECT_EQ(row.bytes, row.level == "ideal" ? 0u : cfg.batch_bytes() * cfg.steps);
  }
  const std::string table = ferry::bench::format_table(r);
  for (const auto& level : cfg.levels) EXPECT_NE(table.find(level), std::string::npos) << level;
}

TEST(ingest_bench, pure_copy_and_both_ways_check_every_batch) {
  auto dev = ferry::make_host_device();
  auto cfg = tiny();
  const auto r = ferry::bench::run_ingest_pure_copy(*dev, cfg, 9);  // more batches than slots: reused slots
  EXPECT_EQ(r.mismatches, 0u);
  EXPECT_EQ(r.batches, 9);
  EXPECT_GT(r.gbps, 0.0);
  ferry::bench::egress_options out = ferry::bench::default_egress_options(ferry::backend::host);
  out.batch = 1;
  out.classes = 2;
  out.height = 32;
  out.width = 32;
  out.slot_bytes = 4096;
  out.slots = 4;
  out.probed_gbps = 10;
  // A short window: on a busy machine one side's set-up can outlast it. Both sides still start their
  // windows together and time at least one item each.
  const auto b = ferry::bench::run_both_ways(*dev, cfg, out, std::chrono::milliseconds(30));
  EXPECT_EQ(b.ingest.mismatches + b.egress.mismatches, 0u);
  EXPECT_GT(b.total_gbps, 0.0);
  EXPECT_GT(b.probed_duplex_gbps, 0.0);
  EXPECT_GT(b.ingest.batches, 0);
  EXPECT_GT(b.egress.outputs, 0);
  EXPECT_EQ(b.ingest.window_start, b.egress.window_start);
  EXPECT_GT(b.overlap, 0.0);
}

TEST(ingest_bench, a_window_that_ends_at_its_start_still_times_one_batch) {
  auto dev = ferry::make_host_device();
  ferry::bench::start_line line(1, std::chrono::nanoseconds(0));
  const auto r = ferry::bench::run_ingest_pure_copy(*dev, tiny(), 9, {}, &line);
  EXPECT_EQ(r.batches, 1);
  EXPECT_EQ(r.mismatches, 0u);
  EXPECT_GT(r.gbps, 0.0);
}

TEST(ingest_bench, bad_configuration_names_the_value) {
  auto dev = ferry::make_host_device();
  auto cfg = tiny();
  cfg.levels = {"L7"};
  try {
    (void)ferry::bench::run_ingest(*dev, cfg);
    FAIL() << "unknown level accepted";
  } catch (const ferry::logic_error& e) {
    EXPECT_NE(std::string(e.what()).find("\"L7\""), std::string::npos) << e.what();
  }
  cfg = tiny();
  cfg.workers = 0;
  EXPECT_THROW((void)ferry::bench::run_ingest(*dev, cfg), ferry::logic_error);
}

}  // namespace
