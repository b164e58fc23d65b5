// `ferry bench ... --trace` on the host backend: every level of both ladders is recorded, and the
// analyzer names the bottleneck that the next level removes (level_info::expected_finding), both on the
// recorded timeline and on the Chrome trace written to disk and read back (what `ferry analyze` does).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <string>

#include "ferry/analyze/analyze.hpp"
#include "ferry/bench/egress_bench.hpp"
#include "ferry/bench/ingest_bench.hpp"
#include "ferry/trace/trace_io.hpp"

namespace {

using namespace ferry;

// The ladders' host settings (ladder_host_options, default_*_options) with every modelled duration
// `time_scale` times longer: link bandwidths divided, copy latency, compute and the modelled CPU costs
// (process_ms_per_mib, make_ms_per_mib) multiplied. Every proportion the ladder's expected findings rest on
// is kept (copy against compute, processing against compute, pageable against pinned), so each level is
// bound by the same thing as at the demo's scale. What does not scale is the emulator's own real cost,
// which a trace of the host backend records as device time (real memcpy, page faults, stream threads
// woken late on a busy machine: docs/DEVICE.md): a few milliseconds per step whatever the scale. At the
// demo's scale (20 ms of compute per egress step, 10 ms per ingest step) that is enough on a loaded 2-core
// machine to turn a level's first finding into GPU idle; at 6x it stays a small fraction of each step, and
// the test still ends in well under a minute.
constexpr double time_scale = 6;

host_device_options scaled_link() {
  host_device_options o = bench::ladder_host_options();
  for (double* gbps :
       {&o.h2d_gbps, &o.d2h_gbps, &o.pageable_h2d_gbps, &o.pageable_d2h_gbps, &o.duplex_gbps, &o.d2d_gbps})
    *gbps /= time_scale;
  o.latency = std::chrono::nanoseconds(
      static_cast<std::int64_t>(static_cast<double>(o.latency.count()) * time_scale));
  return o;
}

std::chrono::nanoseconds scaled(std::chrono::nanoseconds d) {
  return std::chrono::nanoseconds(static_cast<std::int64_t>(static_cast<double>(d.count()) * time_scale));
}

// Checks one level's trace: it holds the timed steps, and live and read back it names the expected rule.
void check_level(const bench::level_trace& t, const std::string& expected, int steps,
                 const std::string& bench) {
  SCOPED_TRACE(bench + " " + t.level);
  ASSERT_TRUE(t.analysis.has_value()) << t.analysis_error;
  EXPECT_EQ(t.timeline.dropped, 0u);
  EXPECT_EQ(t.analysis->steps.size(), static_cast<std::size_t>(steps));
  EXPECT_EQ(t.analysis->bottleneck(), expected) << trace::format_text(*t.analysis);

  const auto path = std::filesystem::path(::testing::TempDir()) / (bench + "." + t.level + ".json");
  trace::write_chrome_trace(t.timeline, path);
  const trace::timeline back = trace::read_trace(path);
  EXPECT_EQ(back.events.size(), t.timeline.events.size());
  const trace::analysis again = trace::analyze(back);
  EXPECT_EQ(again.bottleneck(), expected) << trace::format_text(again);
  std::filesystem::remove(path);
}

TEST(bench_trace, every_egress_level_names_the_bottleneck_the_next_level_removes) {
  const host_device_options link = scaled_link();
  auto dev = make_host_device(link);
  bench::egress_options cfg = bench::default_egress_options(backend::host);
  cfg.compute = scaled(cfg.compute);
  cfg.process_ms_per_mib *= time_scale;
  cfg.probed_gbps = link.d2h_gbps;  // the modelled pinned D2H: skip the probe
  cfg.steps = 6;
  cfg.trace.enabled = true;
  const auto r = bench::run_egress(*dev, cfg);
  ASSERT_EQ(r.traces.size(), cfg.levels.size());
  for (std::size_t i = 0; i < r.rows.size(); ++i) {
    EXPECT_EQ(r.rows[i].wrong, 0u);
    EXPECT_EQ(r.traces[i].level, r.rows[i].level);
    check_level(r.traces[i], bench::expected_finding_of(bench::egress_levels(), r.rows[i].level), cfg.steps,
                "egress");
    EXPECT_EQ(r.rows[i].bottleneck, bench::expected_finding_of(bench::egress_levels(), r.rows[i].level));
    if (r.rows[i].level == "L0" && r.traces[i].analysis) {
      // Behind the blocking copy, what the next level (L1) removes: the GPU idles while the main thread
      // processes the output.
      const auto& fs = r.traces[i].analysis->findings;
      const auto idle =
          std::find_if(fs.begin(), fs.end(), [](const auto& f) { return f.rule == "gpu_idle"; });
      ASSERT_NE(idle, fs.end()) << trace::format_text(*r.traces[i].analysis);
      EXPECT_NE(idle->evidence.find("'process output'"), std::string::npos) << idle->evidence;
    }
  }
  const std::string table = bench::format_table(r);
  EXPECT_NE(table.find("trace analysis"), std::string::npos) << table;
  EXPECT_EQ(table.find("ladder expects"), std::string::npos) << table;
}

TEST(bench_trace, every_ingest_level_names_the_bottleneck_the_next_level_removes) {
  const host_device_options link = scaled_link();
  auto dev = make_host_device(link);
  bench::ingest_options cfg = bench::default_ingest_options(backend::host);
  cfg.compute = scaled(cfg.compute);
  cfg.make_ms_per_mib *= time_scale;
  cfg.probed_gbps = link.h2d_gbps;
  cfg.steps = 6;
  cfg.trace.enabled = true;
  const auto r = bench::run_ingest(*dev, cfg);
  ASSERT_EQ(r.traces.size(), cfg.levels.size());
  for (std::size_t i = 0; i < r.rows.size(); ++i) {
    EXPECT_EQ(r.rows[i].wrong, 0u);
    check_level(r.traces[i], bench::expected_finding_of(bench::ingest_levels(), r.rows[i].level), cfg.steps,
                "ingest");
  }
}

TEST(bench_trace, a_ladder_without_tracing_records_nothing) {
  auto dev = make_host_device();
  bench::egress_options cfg = bench::default_egress_options(backend::host);
  cfg.probed_gbps = 54.8;
  cfg.levels = {"ideal", "ferry"};
  cfg.steps = 2;
  const auto r = bench::run_egress(*dev, cfg);
  EXPECT_TRUE(r.traces.empty());
  for (const auto& row : r.rows) EXPECT_TRUE(row.bottleneck.empty());
}

TEST(bench_trace, a_full_recorder_reports_its_drops) {
  auto dev = make_host_device();
  bench::ingest_options cfg = bench::default_ingest_options(backend::host);
  cfg.probed_gbps = 53.6;
  cfg.levels = {"L2"};
  cfg.steps = 4;
  cfg.trace.enabled = true;
  cfg.trace.capacity = 10;
  const auto r = bench::run_ingest(*dev, cfg);
  ASSERT_EQ(r.traces.size(), 1u);
  EXPECT_EQ(r.traces[0].timeline.events.size(), 10u);
  EXPECT_GT(r.traces[0].timeline.dropped, 0u);
  if (r.traces[0].analysis) {
    EXPECT_EQ(r.traces[0].analysis->dropped, r.traces[0].timeline.dropped);
  }
}

}  // namespace
