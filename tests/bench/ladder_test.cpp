// The harness every ladder shares: its table and JSON say the same of every row, every JSON result is
// stamped with date, device, command and version, unknown levels are refused naming the known ones, and
// the shared figures follow from what a level did.
#include "ferry/bench/ladder.hpp"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "ferry/bench/egress_bench.hpp"
#include "ferry/bench/ingest_bench.hpp"
#include "ferry/core/error.hpp"
#include "ferry/core/units.hpp"

namespace {

using namespace ferry;

bench::ingest_options tiny_ingest() {
  bench::ingest_options c = bench::default_ingest_options(backend::host);
  c.batch = 2;
  c.height = 16;
  c.width = 17;
  c.compute = std::chrono::milliseconds(2);
  c.warmup = 1;
  c.steps = 3;
  c.workers = 2;
  c.host_slots = 2;
  c.make_ms_per_mib = 0;
  c.probed_gbps = 10;  // skip the probe
  return c;
}

bench::egress_options tiny_egress() {
  bench::egress_options c = bench::default_egress_options(backend::host);
  c.batch = 1;
  c.classes = 2;
  c.height = 16;
  c.width = 17;
  c.compute = std::chrono::milliseconds(2);
  c.warmup = 1;
  c.steps = 3;
  c.workers = 2;
  c.pool_buffers = 2;
  c.slot_bytes = 1024;
  c.slots = 4;
  c.process_ms_per_mib = 0;
  c.probed_gbps = 10;
  return c;
}

// The JSON key of each table column: the table and the JSON must say the same of every row.
const std::map<std::string, std::string>& key_of_column() {
  static const std::map<std::string, std::string> keys{{"steps/s", "steps_per_s"},
                                                       {"x ideal", "ratio_to_ideal"},
                                                       {"H2D GB/s", "gbps"},
                                                       {"D2H GB/s", "gbps"},
                                                       {"% link", "link_fraction"},
                                                       {"GPU idle", "gpu_idle"},
                                                       {"mismatch", "wrong"},
                                                       {"steps", "steps"},
                                                       {"workers", "worker_threads"},
                                                       {"CPU ms/step", "cpu_ms_per_step"},
                                                       {"CPU ms/batch", "cpu_ms_per_batch_made"},
                                                       {"make ms/batch", "make_cpu_ms_per_batch"}};
  return keys;
}

// Reads the table's row lines (after the header line, up to the first blank line) and checks every
// cell against the same row's JSON value, to the precision the table prints.
void expect_table_matches_json(const std::string& table, const nlohmann::json& j,
                               const bench::ladder_spec& spec) {
  std::istringstream in(table);
  std::string line;
  while (std::getline(in, line) && line.rfind("level", 0) != 0) {
  }
  ASSERT_FALSE(in.eof()) << table;
  std::size_t row = 0;
  while (std::getline(in, line) && !line.empty()) {
    ASSERT_LT(row, j["rows"].size()) << table;
    const nlohmann::json& r = j["rows"][row];
    std::istringstream cells(line);
    std::string level;
    cells >> level;
    EXPECT_EQ(level, r["level"].get<std::string>());
    for (const auto& c : spec.columns) {
      SCOPED_TRACE(level + " " + c.header);
      std::string text;
      cells >> text;
      const auto key = key_of_column().find(c.header);
      ASSERT_NE(key, key_of_column().end()) << "a column the test does not know: " << c.header;
      ASSERT_TRUE(r.contains(key->second)) << r.dump();
      if (text == "-") {  // the column does not apply to the row: null in the JSON, and only there
        EXPECT_TRUE(r[key->second].is_null()) << r.dump();
        continue;
      }
      if (c.percent) {
        ASSERT_EQ(text.back(), '%');
        text.pop_back();
      }
      const double want = r[key->second].get<double>() * (c.percent ? 100 : 1);
      EXPECT_LE(std::abs(std::stod(text) - want), 0.5 * std::pow(10.0, -c.precision) + 1e-9)
          << text << " vs " << want;
    }
    ++row;
  }
  EXPECT_EQ(row, j["rows"].size()) << table;
}

void expect_stamped(const nlohmann::json& j, const std::string& command) {
  EXPECT_TRUE(std::regex_match(j.at("date").get<std::string>(),
                               std::regex(R"(\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z)")))
      << j.at("date");
  EXPECT_EQ(j.at("command"), command);
  EXPECT_EQ(j.at("version"), std::string(bench::ferry_version()));
  EXPECT_FALSE(j.at("device").at("name").get<std::string>().empty());
  EXPECT_EQ(j.at("device").at("backend"), "host");
  EXPECT_FALSE(j.at("tool").get<std::string>().empty());
}

TEST(ladder, the_version_is_known) { EXPECT_FALSE(bench::ferry_version().empty()); }

TEST(ladder, an_ingest_run_reads_the_same_in_its_table_and_its_json_and_is_stamped) {
  auto dev = make_host_device();
  const auto cfg = tiny_ingest();
  const auto r = bench::run_ingest(*dev, cfg);
  const std::string command = "ferry bench ingest --backend host --steps 3 --shape '2x3x16x17'";
  const nlohmann::json j = bench::ladder_json(r, bench::stamp_now(command));
  expect_stamped(j, command);
  EXPECT_EQ(j.at("tool"), "ferry bench ingest");
  EXPECT_EQ(j.at("ladder"), "ingest");
  EXPECT_EQ(j.at("direction"), "host_to_device");
  EXPECT_EQ(j.at("probed_h2d_gbps"), j.at("probed_gbps"));
  EXPECT_EQ(j.at("config").at("batch_bytes"), cfg.batch_bytes());
  ASSERT_EQ(j.at("rows").size(), cfg.levels.size());
  for (const auto& row : j.at("rows")) {
    SCOPED_TRACE(row.at("level").get<std::string>());
    // The keys earlier results used stay, with the shared keys' values.
    EXPECT_EQ(row.at("h2d_gbps"), row.at("gbps"));
    EXPECT_EQ(row.at("mismatches"), row.at("wrong"));
    EXPECT_EQ(row.at("checked_batches"), row.at("checked"));
    EXPECT_EQ(row.at("cpu_ms_per_batch"), row.at("cpu_ms_per_step"));
    EXPECT_TRUE(row.at("worker_threads").is_number_unsigned());
    EXPECT_EQ(row.at("checked"), static_cast<std::uint64_t>(cfg.warmup + cfg.steps));
    EXPECT_EQ(row.at("wrong"), 0u);
  }
  expect_table_matches_json(bench::format_table(r), j, bench::ingest_spec());
}

TEST(ladder, an_egress_run_reads_the_same_in_its_table_and_its_json_and_is_stamped) {
  auto dev = make_host_device();
  const auto cfg = tiny_egress();
  const auto r = bench::run_egress(*dev, cfg);
  const nlohmann::json j = bench::ladder_json(r, bench::stamp_now("ferry bench egress"));
  expect_stamped(j, "ferry bench egress");
  EXPECT_EQ(j.at("ladder"), "egress");
  EXPECT_EQ(j.at("probed_d2h_gbps"), j.at("probed_gbps"));
  EXPECT_EQ(j.at("config").at("output_bytes"), cfg.output_bytes());
  ASSERT_EQ(j.at("rows").size(), cfg.levels.size());
  for (const auto& row : j.at("rows")) {
    SCOPED_TRACE(row.at("level").get<std::string>());
    EXPECT_EQ(row.at("d2h_gbps"), row.at("gbps"));
    EXPECT_EQ(row.at("checked_bytes"), row.at("checked"));
    EXPECT_TRUE(row.contains("pin_seconds"));
    if (row.at("checked") == 0u) {
      EXPECT_EQ(row.at("level"), "ideal");  // only the ceiling, which has no output, checks nothing
      EXPECT_TRUE(row.at("wrong").is_null());
      EXPECT_TRUE(row.at("mismatches").is_null());
    } else {
      EXPECT_EQ(row.at("wrong"), 0u);
    }
  }
  expect_table_matches_json(bench::format_table(r), j, bench::egress_spec());
}

TEST(ladder, one_shot_results_are_stamped_too) {
  auto dev = make_host_device();
  const auto out = tiny_egress();
  const auto e = bench::run_egress_pure_copy(*dev, out, 2);
  expect_stamped(bench::to_json(e, out, bench::stamp_now("egress pure copy")), "egress pure copy");
  const auto i = bench::run_ingest_pure_copy(*dev, tiny_ingest(), 2);
  expect_stamped(bench::to_json(i, bench::stamp_now("ingest pure copy")), "ingest pure copy");
  EXPECT_NE(bench::format_text(i).find("0 mismatches"), std::string::npos) << bench::format_text(i);
}

TEST(ladder, an_unknown_level_is_refused_naming_every_known_level) {
  auto dev = make_host_device();
  auto in = tiny_ingest();
  in.levels = {"ideal", "L9"};
  try {
    (void)bench::run_ingest(*dev, in);
    FAIL() << "unknown ingest level accepted";
  } catch (const logic_error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("\"L9\""), std::string::npos) << what;
    for (const auto& l : bench::ingest_levels()) EXPECT_NE(what.find(l.name), std::string::npos) << what;
    EXPECT_NE(what.find("L4 or ferry"), std::string::npos) << what;
  }
  auto out = tiny_egress();
  out.levels = {"L4-unpinned"};
  try {
    (void)bench::run_egress(*dev, out);
    FAIL() << "unknown egress level accepted";
  } catch (const logic_error& e) {
    const std::string what = e.what();
    for (const auto& l : bench::egress_levels()) EXPECT_NE(what.find(l.name), std::string::npos) << what;
  }
}

TEST(ladder, default_levels_are_every_level_of_the_table_in_order) {
  EXPECT_EQ(bench::default_ingest_options(backend::host).levels, bench::names_of(bench::ingest_levels()));
  EXPECT_EQ(bench::default_egress_options(backend::cuda).levels, bench::names_of(bench::egress_levels()));
  EXPECT_EQ(bench::ingest_spec().levels.size(), bench::ingest_levels().size());
}

// A ladder of two levels over the harness alone: "ideal" computes, "copy" computes and copies a buffer
// back each step. The shared fields follow from the window and the step bytes.
TEST(ladder, the_harness_fills_the_shared_fields_from_what_a_level_did) {
  auto dev = make_host_device();
  bench::ladder_spec spec;
  spec.name = "toy";
  spec.direction = copy_direction::device_to_host;
  spec.step_bytes_name = "buffer";
  spec.checked_unit = "steps";
  spec.levels = {{"ideal", "compute", "the ceiling", "compute_bound"},
                 {"copy", "compute, copy back", "", ""}};
  spec.columns = bench::standard_columns(spec.direction);
  bench::ladder_options cfg;
  cfg.compute = std::chrono::milliseconds(2);
  cfg.warmup = 1;
  cfg.steps = 3;
  cfg.levels = {"copy", "ideal"};
  cfg.probed_gbps = 4;
  std::vector<std::pair<std::uint64_t, std::uint64_t>> begun;  // (steps begun, total) as reported
  cfg.on_step = [&begun](std::uint64_t n, std::uint64_t total) { begun.emplace_back(n, total); };
  constexpr std::size_t bytes = 4096;
  std::vector<std::size_t> ran;
  auto run = [&](std::size_t index, bench::level_window& window, bench::ladder_row& row) {
    ran.push_back(index);
    stream s = dev->make_stream();
    buffer src = dev->alloc_device(bytes);
    buffer dst = dev->alloc_pageable(bytes);
    for (int step = 0; step < window.total_steps(); ++step) {
      if (step == cfg.warmup) window.begin();
      window.compute_started(step, s);
      dev->spin_async(cfg.compute, s);
      window.compute_done(step, s);
      if (index == 1) dev->copy(dst, src, s);
      ++row.checked;
    }
    window.end(row);
  };
  const bench::ladder_result r = bench::run_ladder(*dev, spec, cfg, bytes, nlohmann::json::object(), run);
  EXPECT_EQ(ran, (std::vector<std::size_t>{1, 0}));
  ASSERT_EQ(r.rows.size(), 2u);
  EXPECT_EQ(r.probed_gbps, 4.0);
  const bench::ladder_row* copy = r.find("copy");
  const bench::ladder_row* ideal = r.find("ideal");
  ASSERT_NE(copy, nullptr);
  ASSERT_NE(ideal, nullptr);
  EXPECT_EQ(copy->bytes, bytes * 3);
  EXPECT_EQ(ideal->bytes, 0u);
  EXPECT_EQ(copy->steps, 3);
  EXPECT_EQ(copy->checked, 4u);
  EXPECT_EQ(copy->direction, copy_direction::device_to_host);
  EXPECT_DOUBLE_EQ(copy->gbps, gb_per_s(copy->bytes, copy->seconds));
  EXPECT_DOUBLE_EQ(copy->link_fraction, copy->gbps / 4.0);
  EXPECT_DOUBLE_EQ(copy->steps_per_s, 3 / copy->seconds);
  EXPECT_DOUBLE_EQ(ideal->ratio_to_ideal, 1.0);
  EXPECT_DOUBLE_EQ(copy->ratio_to_ideal, copy->steps_per_s / ideal->steps_per_s);
  for (const auto& row : r.rows) {
    EXPECT_GE(row.gpu_idle, 0.0);
    EXPECT_LE(row.gpu_idle, 1.0);
    EXPECT_GE(row.extra("cpu_ms_per_step"), 0.0);
  }
  EXPECT_EQ(r.wrong(), 0u);
  const nlohmann::json j = bench::ladder_json(r, bench::stamp_now("toy"));
  EXPECT_EQ(j.at("tool"), "ferry bench toy");
  EXPECT_EQ(j.at("rows").at(0).at("d2h_gbps"), j.at("rows").at(0).at("gbps"));
  EXPECT_EQ(j.at("rows").at(0).at("checked_steps"), 4u);
  // The ceiling moves no bytes: no bandwidth and no share of the link, "-" in the table and null here.
  EXPECT_TRUE(j.at("rows").at(1).at("gbps").is_null()) << j.dump();
  EXPECT_TRUE(j.at("rows").at(1).at("link_fraction").is_null()) << j.dump();
  EXPECT_TRUE(j.at("rows").at(1).at("d2h_gbps").is_null()) << j.dump();
  EXPECT_TRUE(j.at("emulated_link").is_null());  // not asked to say what the emulator models
  expect_table_matches_json(bench::format_table(r), j, spec);
  // Every step of both levels (1 warm-up + 3 timed each) was reported once, in order, against the total.
  std::vector<std::pair<std::uint64_t, std::uint64_t>> want;
  for (std::uint64_t n = 1; n <= 8; ++n) want.emplace_back(n, 8);
  EXPECT_EQ(begun, want);
}

TEST(ladder, on_the_emulator_the_table_and_json_say_what_link_it_models) {
  auto dev = make_host_device();
  auto cfg = tiny_ingest();
  cfg.levels = {"ideal"};
  const host_device_options emulator = bench::ladder_host_options();
  cfg.emulator = emulator;
  const auto r = bench::run_ingest(*dev, cfg);
  EXPECT_DOUBLE_EQ(r.emulated_gbps, emulator.h2d_gbps);
  EXPECT_DOUBLE_EQ(r.reference_gbps, host_device_options{}.h2d_gbps);
  const std::string table = bench::format_table(r);
  EXPECT_NE(
      table.find(fmt::format("emulated link: the emulator models pinned H2D at {:.2f} GB/s, a PCIe gen5 "
                             "x16 link's 53.6 GB/s slowed 24 times",
                             emulator.h2d_gbps)),
      std::string::npos)
      << table;
  const nlohmann::json j = bench::ladder_json(r, bench::stamp_now("ferry bench ingest"));
  EXPECT_NEAR(j.at("emulated_link").at("slowdown").get<double>(), 24, 1e-9);
  EXPECT_DOUBLE_EQ(j.at("emulated_link").at("gbps").get<double>(), emulator.h2d_gbps);
  expect_table_matches_json(table, j, bench::ingest_spec());
}

TEST(ladder, shared_settings_out_of_range_are_refused_naming_the_ladder_and_the_value) {
  auto dev = make_host_device();
  auto cfg = tiny_ingest();
  cfg.warmup = -1;
  try {
    (void)bench::run_ingest(*dev, cfg);
    FAIL() << "negative warm-up accepted";
  } catch (const logic_error& e) {
    EXPECT_NE(std::string(e.what()).find("ingest bench warmup is -1"), std::string::npos) << e.what();
  }
}

}  // namespace
