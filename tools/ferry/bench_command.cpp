// `ferry bench egress` and `ferry bench ingest`: the device-to-host and host-to-device ladders.
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <filesystem>
#include <iostream>
#include <sstream>
#include <thread>
#include <algorithm>

#include "commands.hpp"
#include "ferry/bench/egress_bench.hpp"
#include "ferry/bench/ingest_bench.hpp"
#include "ferry/core/error.hpp"
#include "ferry/core/units.hpp"
#include "ferry/report/report_html.hpp"
#include "ferry/trace/trace_io.hpp"

namespace ferry::cli {
namespace {

// Flags every ladder takes.
struct ladder_flags {
  device_options dev;
  std::string shape;  // BxCxHxW
  double compute_ms = -1;
  int steps = 0;
  int warmup = -1;
  std::size_t workers = 0;
  std::string levels;
  bool no_check = false;
  bool json = false;
  std::string trace;             // per-level trace files: <stem>.<level><ext> (+ .html reports)
  std::size_t trace_events = 0;  // recorder capacity per level
};

// "out/run.json" + "L0" -> "out/run.L0.json"
std::filesystem::path level_path(const std::filesystem::path& base, const std::string& level,
                                 const std::string& ext) {
  std::filesystem::path p = base;
  p.replace_filename(base.stem().string() + "." + level + ext);
  return p;
}

// Writes each traced level's Chrome trace and HTML report next to `base`; returns their JSON summary.
nlohmann::json write_level_traces(const std::vector<bench::level_trace>& traces, const std::string& base,
                                  const std::vector<bench::level_info>& levels, bool quiet) {
  nlohmann::json out = nlohmann::json::array();
  const std::filesystem::path b(base);
  const std::string ext = b.has_extension() ? b.extension().string() : std::string(".json");
  if (b.has_parent_path()) std::filesystem::create_directories(b.parent_path());
  for (const auto& t : traces) {
    const auto trace_file = level_path(b, t.level, ext);
    trace::write_chrome_trace(t.timeline, trace_file);
    nlohmann::json j{{"level", t.level}, {"trace_file", trace_file.string()}, {"events", t.timeline.events.size()},
                     {"dropped", t.timeline.dropped}};
    j["expected_finding"] = bench::expected_finding_of(levels, t.level);
    if (t.analysis) {
      const auto html_file = level_path(b, t.level, ".html");
      trace::write_html_report(t.timeline, *t.analysis, html_file);
      j["html_file"] = html_file.string();
      j["bottleneck"] = t.analysis->bottleneck();
      j["analysis"] = nlohmann::json::parse(trace::to_json(*t.analysis));
      if (!quiet) fmt::print(stderr, "bench: {} trace {} and report {}\n", t.level, trace_file.string(), html_file.string());
    } else {
      j["analysis_error"] = t.analysis_error;
      if (!quiet) fmt::print(stderr, "bench: {} trace {} (not analyzed: {})\n", t.level, trace_file.string(), t.analysis_error);
    }
    out.push_back(std::move(j));
  }
  return out;
}

struct egress_flags : ladder_flags {
  std::size_t pool_buffers = 0;
  std::string slot_bytes;
  std::size_t slots = 0;
  int pure_copy = 0;
  double probed_d2h = 0;
};

std::vector<std::size_t> parse_shape(const std::string& text) {
  std::vector<std::size_t> dims;
  std::stringstream in(text);
  std::string part;
  while (std::getline(in, part, 'x')) {
    std::size_t used = 0;
    unsigned long long v = 0;
    try {
      v = std::stoull(part, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    FERRY_EXPECTS(used == part.size() && !part.empty() && v > 0,
                  fmt::format("--shape \"{}\": \"{}\" is not a positive dimension; expected BxCxHxW", text, part));
    dims.push_back(static_cast<std::size_t>(v));
  }
  FERRY_EXPECTS(dims.size() == 4,
                fmt::format("--shape \"{}\" has {} dimensions; expected 4 (batch x classes x height x width)", text,
                            dims.size()));
  return dims;
}

void progress_line(const std::string& line) { fmt::print(stderr, "bench: {}\n", line); }

nlohmann::json config_json(const bench::egress_config& c) {
  return {{"batch", c.batch},
          {"classes", c.classes},
          {"height", c.height},
          {"width", c.width},
          {"input_channels", c.input_channels},
          {"output_bytes", c.output_bytes()},
          {"compute_ms", std::chrono::duration<double, std::milli>(c.compute).count()},
          {"warmup", c.warmup},
          {"steps", c.steps},
          {"workers", c.workers},
          {"pool_buffers", c.pool_buffers},
          {"slot_bytes", c.slot_bytes},
          {"slots", c.slots},
          {"check", c.check}};
}

nlohmann::json device_json(const device_info& d) {
  return {{"name", d.name}, {"backend", to_string(d.kind)}, {"pci_bus_id", d.pci_bus_id}};
}

// Applies the flags every ladder shares to its config; `set_shape` takes the four dimensions.
template <class Config, class SetShape>
void apply_ladder_flags(const ladder_flags& f, Config& cfg, SetShape set_shape) {
  if (!f.shape.empty()) set_shape(parse_shape(f.shape));
  if (f.compute_ms >= 0) cfg.compute = std::chrono::nanoseconds(static_cast<std::int64_t>(f.compute_ms * 1e6));
  if (f.steps != 0) cfg.steps = f.steps;
  if (f.warmup >= 0) cfg.warmup = f.warmup;
  if (f.workers != 0) cfg.workers = f.workers;
  if (!f.levels.empty()) {
    cfg.levels.clear();
    std::stringstream in(f.levels);
    std::string level;
    while (std::getline(in, level, ',')) cfg.levels.push_back(level);
  }
  cfg.check = !f.no_check;
  if (!f.trace.empty()) {
    cfg.trace.enabled = true;
    if (f.trace_events != 0) cfg.trace.capacity = f.trace_events;
  }
}

// Adds the flags every ladder shares to its subcommand.
void add_ladder_flags(CLI::App& app, ladder_flags& f, const std::string& shape_help, const std::string& compute_help,
                      const std::string& workers_help, const std::string& levels_help) {
  add_device_options(app, f.dev);
  app.add_option("--shape", f.shape, shape_help);
  app.add_option("--compute-ms", f.compute_ms, compute_help);
  app.add_option("--steps", f.steps, "Timed steps per level (default 10)");
  app.add_option("--warmup", f.warmup, "Untimed steps per level (default 2)");
  app.add_option("--workers", f.workers, workers_help);
  app.add_option("--levels", f.levels, levels_help);
  app.add_flag("--no-check", f.no_check, "Skip checking the delivered bytes (egress checksums them instead)");
  app.add_flag("--json", f.json, "Print JSON on stdout instead of the table");
  app.add_option("--trace", f.trace,
                 "Record each level's timed steps (CUPTI on cuda) and analyze them: writes FILE's stem.<level>.json "
                 "(Chrome/Perfetto trace) and .html (report) per level, and names each level's bottleneck");
  app.add_option("--trace-events", f.trace_events, "Events the recorder keeps per level (default 1048576)");
}

int run_egress(const egress_flags& f) {
  auto dev = open_device(f.dev, f.pure_copy > 0 ? host_device_options{} : bench::ladder_host_options());
  bench::egress_config cfg = bench::default_egress_config(dev->kind());
  apply_ladder_flags(f, cfg, [&cfg](const std::vector<std::size_t>& d) {
    cfg.batch = d[0];
    cfg.classes = d[1];
    cfg.height = d[2];
    cfg.width = d[3];
  });
  if (f.pool_buffers != 0) cfg.pool_buffers = f.pool_buffers;
  if (!f.slot_bytes.empty()) cfg.slot_bytes = parse_bytes(f.slot_bytes);
  if (f.slots != 0) cfg.slots = f.slots;
  cfg.probed_d2h_gbps = f.probed_d2h;

  FERRY_EXPECTS(f.trace.empty() || f.pure_copy == 0,
                "--trace records the ladder's levels; it does not apply to --pure-copy (drop one of the two)");
  if (f.pure_copy > 0) {
    // Pure copy is bound by how fast the host checks what arrives: small slots keep each chunk in the
    // CPU's last-level cache between the copy that writes it and the check that reads it, and every core
    // but one checks (measured on the H200 machine: docs/PERFORMANCE.md).
    if (dev->kind() == backend::cuda) {
      if (f.slot_bytes.empty()) cfg.slot_bytes = 8 * MiB;
      if (f.slots == 0) cfg.slots = 48;
      const unsigned cores = std::thread::hardware_concurrency();
      if (f.workers == 0) cfg.workers = cores > 1 ? cores - 1 : 1;
    }
    const bench::pure_copy_result r = bench::run_egress_pure_copy(*dev, cfg, f.pure_copy, progress_line);
    if (f.json) {
      nlohmann::json j{{"tool", "ferry bench egress --pure-copy"},
                       {"device", device_json(r.device)},
                       {"config", config_json(cfg)},
                       {"outputs", r.outputs},
                       {"output_bytes", r.output_bytes},
                       {"seconds", r.seconds},
                       {"gbps", r.gbps},
                       {"copy_gbps", r.copy_gbps},
                       {"probed_d2h_gbps", r.probed_d2h_gbps},
                       {"link_fraction", r.link_fraction},
                       {"mismatches", r.mismatches}};
      std::cout << j.dump(2) << '\n';
    } else {
      fmt::print("pure copy on {}: {} x {} in {:.3f} s = {:.2f} GB/s end to end ({:.2f} GB/s of copies), "
                 "{:.1f}% of the probed pinned D2H {:.2f} GB/s; {} mismatches\n",
                 r.device.name, r.outputs, format_bytes(r.output_bytes), r.seconds, r.gbps, r.copy_gbps,
                 r.link_fraction * 100, r.probed_d2h_gbps, r.mismatches);
    }
    return r.mismatches == 0 ? 0 : 2;
  }

  const bench::egress_result r = bench::run_egress(*dev, cfg, progress_line);
  std::uint64_t mismatches = 0;
  for (const auto& row : r.rows) mismatches += row.mismatches;
  if (f.json) {
    nlohmann::json rows = nlohmann::json::array();
    for (const auto& row : r.rows) {
      rows.push_back({{"level", row.level},
                      {"steps", row.steps},
                      {"seconds", row.seconds},
                      {"steps_per_s", row.steps_per_s},
                      {"ratio_to_ideal", row.ratio_to_ideal},
                      {"bytes", row.bytes},
                      {"d2h_gbps", row.d2h_gbps},
                      {"link_fraction", row.link_fraction},
                      {"gpu_idle", row.gpu_idle},
                      {"checked_bytes", row.checked_bytes},
                      {"mismatches", row.mismatches},
                      {"pin_seconds", row.pin_seconds},
                      {"bottleneck", row.bottleneck},
                      {"finding", row.finding}});
    }
    nlohmann::json j{{"tool", "ferry bench egress"},
                     {"device", device_json(r.device)},
                     {"config", config_json(cfg)},
                     {"probed_d2h_gbps", r.probed_d2h_gbps},
                     {"rows", rows}};
    if (!f.trace.empty()) j["traces"] = write_level_traces(r.traces, f.trace, bench::egress_levels(), true);
    std::cout << j.dump(2) << '\n';
  } else {
    std::cout << bench::format_table(r);
    if (!f.trace.empty()) static_cast<void>(write_level_traces(r.traces, f.trace, bench::egress_levels(), false));
  }
  return mismatches == 0 ? 0 : 2;
}

struct ingest_flags : ladder_flags {
  std::size_t host_slots = 0;
  std::size_t depth = 0;
  double probed_h2d = 0;
  int pure_copy = 0;
  int both_ways = 0;
  std::size_t egress_workers = 0;
  std::string egress_slot_bytes;
  std::size_t egress_slots = 0;
};

nlohmann::json ingest_pure_copy_json(const bench::ingest_pure_copy_result& r) {
  return {{"batches", r.batches},         {"batch_bytes", r.batch_bytes},
          {"seconds", r.seconds},         {"gbps", r.gbps},
          {"probed_h2d_gbps", r.probed_h2d_gbps}, {"link_fraction", r.link_fraction},
          {"mismatches", r.mismatches}};
}

int run_ingest(const ingest_flags& f);

// Both ways: ingest and egress pure copies at once, each sized to move about the same bytes.
int run_both_ways(const ingest_flags& f, device& dev, const bench::ingest_config& cfg) {
  bench::egress_config out = bench::default_egress_config(dev.kind());
  if (dev.kind() == backend::cuda) {
    out.slot_bytes = 8 * MiB;
    out.slots = 48;
  }
  if (!f.egress_slot_bytes.empty()) out.slot_bytes = parse_bytes(f.egress_slot_bytes);
  if (f.egress_slots != 0) out.slots = f.egress_slots;
  // The egress side checks every byte it receives; the ingest side only rewrites labels, so most cores
  // go to the egress checks.
  const unsigned cores = std::thread::hardware_concurrency();
  out.workers = f.egress_workers != 0 ? f.egress_workers : (cores > 2 ? cores - 2 : 1);
  bench::ingest_config in = cfg;
  if (f.workers == 0) in.workers = 2;
  const bench::both_ways_result r =
      bench::run_both_ways(dev, in, out, std::chrono::milliseconds(f.both_ways), progress_line);
  const std::uint64_t mismatches = r.ingest.mismatches + r.egress.mismatches;
  if (f.json) {
    nlohmann::json j{{"tool", "ferry bench ingest --both-ways"},
                     {"device", device_json(r.ingest.device)},
                     {"ingest", ingest_pure_copy_json(r.ingest)},
                     {"egress",
                      {{"outputs", r.egress.outputs},
                       {"output_bytes", r.egress.output_bytes},
                       {"seconds", r.egress.seconds},
                       {"gbps", r.egress.gbps},
                       {"mismatches", r.egress.mismatches}}},
                     {"overlap", r.overlap},
                     {"total_gbps", r.total_gbps},
                     {"probed_duplex_gbps", r.probed_duplex_gbps},
                     {"link_fraction", r.link_fraction}};
    std::cout << j.dump(2) << '\n';
  } else {
    fmt::print("both ways on {}: ingest {:.2f} GB/s + egress {:.2f} GB/s = {:.2f} GB/s, {:.1f}% of the probed "
               "two-way {:.2f} GB/s (windows overlap {:.0f}%); {} mismatches\n",
               r.ingest.device.name, r.ingest.gbps, r.egress.gbps, r.total_gbps, r.link_fraction * 100,
               r.probed_duplex_gbps, r.overlap * 100, mismatches);
  }
  return mismatches == 0 ? 0 : 2;
}

int run_ingest(const ingest_flags& f) {
  auto dev = open_device(f.dev, f.pure_copy > 0 || f.both_ways > 0 ? host_device_options{} : bench::ladder_host_options());
  bench::ingest_config cfg = bench::default_ingest_config(dev->kind());
  apply_ladder_flags(f, cfg, [&cfg](const std::vector<std::size_t>& d) {
    cfg.batch = d[0];
    cfg.channels = d[1];
    cfg.height = d[2];
    cfg.width = d[3];
  });
  if (f.host_slots != 0) cfg.host_slots = f.host_slots;
  if (f.depth != 0) cfg.depth = f.depth;
  cfg.probed_h2d_gbps = f.probed_h2d;
  FERRY_EXPECTS(f.trace.empty() || (f.pure_copy == 0 && f.both_ways == 0),
                "--trace records the ladder's levels; it does not apply to --pure-copy or --both-ways");
  if (f.both_ways > 0) return run_both_ways(f, *dev, cfg);
  if (f.pure_copy > 0) {
    const bench::ingest_pure_copy_result r = bench::run_ingest_pure_copy(*dev, cfg, f.pure_copy, progress_line);
    if (f.json) {
      nlohmann::json j = ingest_pure_copy_json(r);
      j["tool"] = "ferry bench ingest --pure-copy";
      j["device"] = device_json(r.device);
      std::cout << j.dump(2) << '\n';
    } else {
      fmt::print("ingest pure copy on {}: {} x {} in {:.3f} s = {:.2f} GB/s, {:.1f}% of the probed pinned H2D "
                 "{:.2f} GB/s; {} mismatches\n",
                 r.device.name, r.batches, format_bytes(r.batch_bytes), r.seconds, r.gbps, r.link_fraction * 100,
                 r.probed_h2d_gbps, r.mismatches);
    }
    return r.mismatches == 0 ? 0 : 2;
  }
  const bench::ingest_result r = bench::run_ingest(*dev, cfg, progress_line);
  std::uint64_t mismatches = 0;
  for (const auto& row : r.rows) mismatches += row.mismatches;
  if (f.json) {
    nlohmann::json rows = nlohmann::json::array();
    for (const auto& row : r.rows) {
      rows.push_back({{"level", row.level},
                      {"steps", row.steps},
                      {"seconds", row.seconds},
                      {"steps_per_s", row.steps_per_s},
                      {"ratio_to_ideal", row.ratio_to_ideal},
                      {"bytes", row.bytes},
                      {"h2d_gbps", row.h2d_gbps},
                      {"link_fraction", row.link_fraction},
                      {"gpu_idle", row.gpu_idle},
                      {"worker_threads", row.worker_threads},
                      {"cpu_ms_per_batch", row.cpu_ms_per_batch},
                      {"checked_batches", row.checked_batches},
                      {"mismatches", row.mismatches},
                      {"bottleneck", row.bottleneck},
                      {"finding", row.finding}});
    }
    nlohmann::json j{{"tool", "ferry bench ingest"},
                     {"device", device_json(r.device)},
                     {"config",
                      {{"batch", cfg.batch},
                       {"channels", cfg.channels},
                       {"height", cfg.height},
                       {"width", cfg.width},
                       {"batch_bytes", cfg.batch_bytes()},
                       {"compute_ms", std::chrono::duration<double, std::milli>(cfg.compute).count()},
                       {"warmup", cfg.warmup},
                       {"steps", cfg.steps},
                       {"workers", cfg.workers},
                       {"host_slots", cfg.host_slots},
                       {"depth", cfg.depth},
                       {"check", cfg.check}}},
                     {"probed_h2d_gbps", r.probed_h2d_gbps},
                     {"rows", rows}};
    if (!f.trace.empty()) j["traces"] = write_level_traces(r.traces, f.trace, bench::ingest_levels(), true);
    std::cout << j.dump(2) << '\n';
  } else {
    std::cout << bench::format_table(r);
    if (!f.trace.empty()) static_cast<void>(write_level_traces(r.traces, f.trace, bench::ingest_levels(), false));
  }
  return mismatches == 0 ? 0 : 2;
}

}  // namespace

std::function<int()> add_bench_command(CLI::App& app) {
  auto f = std::make_shared<egress_flags>();
  CLI::App* bench_cmd = app.add_subcommand("bench", "Run a data-path ladder against its compute-only ceiling");
  bench_cmd->require_subcommand(1);
  CLI::App* eg = bench_cmd->add_subcommand("egress", "Device-to-host ladder: ideal, L0..L4, ferry (or --pure-copy)");
  add_ladder_flags(*eg, *f, "Output shape BxCxHxW (default 64x21x512x512 on cuda, 4x21x128x128 on host)",
                   "Compute time per step in ms (default 165 on cuda, 20 on host)",
                   "Host processing threads (default 8)",
                   "Comma-separated levels (default ideal,L0,L1,L2,L3,L4,L4-pinned,ferry)");
  eg->add_option("--pool-buffers", f->pool_buffers, "Whole-output buffers in the L2..L4 pools");
  eg->add_option("--slot-bytes", f->slot_bytes, "ferry's pinned slot size (default 64MiB on cuda)");
  eg->add_option("--slots", f->slots, "ferry's pinned slots (default 32 on cuda: above the chunks of one output)");
  eg->add_option("--pure-copy", f->pure_copy,
                 "Pure-copy mode: drain this many outputs with no compute (on cuda: 8MiB x 48 slots, all cores "
                 "but one checking, unless given)");
  eg->add_option("--probed-d2h", f->probed_d2h, "Pinned D2H GB/s to compare with (default: measured first)");
  auto g = std::make_shared<ingest_flags>();
  CLI::App* in = bench_cmd->add_subcommand("ingest", "Host-to-device ladder: ideal, L0..L4, ferry");
  add_ladder_flags(*in, *g, "Image batch BxCxHxW (default 64x3x512x512 on cuda, 8x3x128x128 on host)",
                   "Compute time per step in ms (default 66 on cuda, 10 on host)",
                   "Sample-making threads (default 8 on cuda, 2 on host)",
                   "Comma-separated levels (default ideal,L0,L1,L2,L3,L4,ferry)");
  in->add_option("--host-slots", g->host_slots, "Pinned batches made ahead (default 4)");
  in->add_option("--depth", g->depth, "Device batches copied ahead (default 2)");
  in->add_option("--probed-h2d", g->probed_h2d, "Pinned H2D GB/s to compare with (default: measured first)");
  in->add_option("--pure-copy", g->pure_copy, "Pure-copy mode: move this many batches with no compute");
  in->add_option("--both-ways", g->both_ways,
                 "Ingest and egress pure copies at once for this many milliseconds, against the probed two-way total");
  in->add_option("--egress-workers", g->egress_workers, "With --both-ways: the egress side's checking threads");
  in->add_option("--egress-slot-bytes", g->egress_slot_bytes, "With --both-ways: the egress side's slot size");
  in->add_option("--egress-slots", g->egress_slots, "With --both-ways: the egress side's slot count");
  return [f, eg, g, in]() -> int {
    if (eg->parsed()) return run_egress(*f);
    if (in->parsed()) return run_ingest(*g);
    return 0;
  };
}

}  // namespace ferry::cli
