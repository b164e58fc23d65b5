// `ferry bench egress` and `ferry bench ingest`: the device-to-host and host-to-device ladders. The
// ladders, their tables and their JSON live in ferry_bench; this file maps flags onto their configs.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <array>
#include <charconv>
#include <cstdio>
#include <iostream>
#include <sstream>

#include "commands.hpp"
#include "exit_status.hpp"
#include "ferry/bench/egress_bench.hpp"
#include "ferry/bench/ingest_bench.hpp"
#include "ferry/core/atomic_file.hpp"
#include "ferry/core/error.hpp"
#include "ferry/core/text.hpp"
#include "ferry/core/units.hpp"
#include "flags.hpp"
#include "level_traces.hpp"
#include "memory_check.hpp"
#include "run_control.hpp"

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
  std::string output;  // --output: the table or JSON goes to this file instead of stdout
  trace_flags trace;
};

// Checks, before any work, every file the run will write: --output and each traced level's trace and
// report.
void check_outputs(const ladder_flags& f, const std::vector<std::string>& levels) {
  check_output(f.output, "--output");
  check_trace_outputs(f.trace, levels);
}

struct egress_flags : ladder_flags {
  std::size_t pool_buffers = 0;
  std::uint64_t slot_bytes = 0;
  std::size_t slots = 0;
  int pure_copy = 0;
  double probed_d2h = 0;
  bool inject_wrong_byte = false;
};

struct ingest_flags : ladder_flags {
  std::size_t host_slots = 0;
  std::size_t depth = 0;
  double probed_h2d = 0;
  int pure_copy = 0;
  int both_ways = 0;
  std::size_t egress_workers = 0;
  std::uint64_t egress_slot_bytes = 0;
  std::size_t egress_slots = 0;
};

// BxCxHxW: four whole numbers from 1 to 2^24, whose product of fp32 values fits in the host's memory.
std::array<std::size_t, 4> parse_shape(const std::string& text) {
  constexpr std::uint64_t max_dim = std::uint64_t{1} << 24;
  const std::string shown = escape_control(text);
  std::vector<std::size_t> dims;
  std::stringstream in(text);
  std::string part;
  __extension__ unsigned __int128 bytes = sizeof(float);
  while (std::getline(in, part, 'x')) {
    std::uint64_t v = 0;
    const auto [end, ec] = std::from_chars(part.data(), part.data() + part.size(), v);
    if (part.empty() || ec != std::errc{} || end != part.data() + part.size() || v < 1 || v > max_dim)
      throw flag_error(
          fmt::format("--shape {}: \"{}\" is not a dimension; expected BxCxHxW, each a whole "
                      "number from 1 to {}",
                      shown, escape_control(part), max_dim));
    dims.push_back(static_cast<std::size_t>(v));
    bytes *= v;
  }
  if (dims.size() != 4)
    throw flag_error(fmt::format("--shape {}: {} dimensions; expected 4 (BxCxHxW)", shown, dims.size()));
  if (bytes > max_host_buffer_bytes())
    throw flag_error(out_of_range("--shape", text,
                                  fmt::format("one step of fp32 values must fit in the host's memory ({})",
                                              format_bytes(max_host_buffer_bytes()))));
  return {dims[0], dims[1], dims[2], dims[3]};
}

// Ranges of the ladders' flags (flags.hpp has those shared with other subcommands).
constexpr double max_compute_ms = 3'600'000;           // an hour per step
constexpr std::int64_t max_buffers = 65'536;           // pool buffers, slots, depth
constexpr std::int64_t max_both_ways_ms = 86'400'000;  // a day

// Progress lines on stderr; on a terminal, a status line under them counts the seconds of each step.
progress_fn progress_to(status_line& status) {
  return [&status](const std::string& line) {
    status.line("bench: " + line);
    status.set("bench: " + line);
  };
}

// A ladder's steps on the status line: done of total, and the time left.
template <class Config>
void count_steps_on(status_line& status, Config& cfg) {
  cfg.on_step = [&status](std::uint64_t begun, std::uint64_t total) { status.steps(begun, total); };
}

// Applies the flags every ladder shares to its config.
template <class Config>
void apply_ladder_flags(const ladder_flags& f, Config& cfg) {
  if (!f.shape.empty()) cfg.set_shape(parse_shape(f.shape));
  if (f.compute_ms >= 0)
    cfg.compute = std::chrono::nanoseconds(static_cast<std::int64_t>(f.compute_ms * 1e6));
  if (f.steps != 0) cfg.steps = f.steps;
  cfg.stop = &interrupt_flag();
  if (f.warmup >= 0) cfg.warmup = f.warmup;
  if (f.workers != 0) cfg.workers = f.workers;
  if (!f.levels.empty()) {
    cfg.levels.clear();
    std::stringstream in(f.levels);
    std::string level;
    while (std::getline(in, level, ',')) cfg.levels.push_back(level);
  }
  cfg.check = !f.no_check;
  apply_trace_flags(f.trace, cfg.trace);
}

// "A on cuda, B on host", or "A" where the two backends' defaults agree: a flag's default in its help.
template <class Config, class Show>
std::string per_backend(const Config& cuda, const Config& host, Show show) {
  const std::string c = fmt::format("{}", show(cuda));
  const std::string h = fmt::format("{}", show(host));
  return c == h ? c : fmt::format("{} on cuda, {} on host", c, h);
}

// Adds the flags every ladder shares to its subcommand; help defaults come from the two backends' default
// configs. `shape_what` and `workers_what` name what the shape and the workers are in this ladder.
template <class Config>
void add_ladder_flags(CLI::App& app, ladder_flags& f, const Config& cuda, const Config& host,
                      const std::string& shape_what, const std::string& workers_what) {
  auto defaults = [&](auto show) { return per_backend(cuda, host, show); };
  add_device_options(app, f.dev);
  app.add_option("--shape", f.shape,
                 fmt::format("{} BxCxHxW (default {})", shape_what, defaults([](const Config& c) {
                               return fmt::format("{}", fmt::join(c.shape(), "x"));
                             })));
  add_double_flag(app, "--compute-ms", f.compute_ms, 0, max_compute_ms,
                  fmt::format("Compute time per step in ms (default {})", defaults([](const Config& c) {
                                return std::chrono::duration<double, std::milli>(c.compute).count();
                              })));
  add_int_flag(
      app, "--steps", f.steps, 1, max_count,
      fmt::format("Timed steps per level (default {})", defaults([](const Config& c) { return c.steps; })));
  add_int_flag(app, "--warmup", f.warmup, 0, max_count,
               fmt::format("Untimed steps per level (default {})",
                           defaults([](const Config& c) { return c.warmup; })));
  add_int_flag(
      app, "--workers", f.workers, 1, max_threads,
      fmt::format("{} (default {})", workers_what, defaults([](const Config& c) { return c.workers; })));
  app.add_option("--levels", f.levels,
                 fmt::format("Comma-separated levels (default {})", defaults([](const Config& c) {
                               return fmt::format("{}", fmt::join(c.levels, ","));
                             })));
  app.add_flag("--no-check", f.no_check, "Skip checking the delivered bytes (egress checksums them instead)");
  app.add_flag("--json", f.json, "Print JSON on stdout instead of the table");
  app.add_option("--output,-o", f.output,
                 "Write the table (or with --json the JSON) to this file instead of stdout; it appears only "
                 "once complete");
  add_trace_flags(app, f.trace, defaults([](const Config& c) { return c.trace.capacity; }));
}

// Prints a ladder run (table or JSON, with its traces written when asked). Exit status: interrupted when
// Ctrl-C stopped it (what finished is printed), else wrong_data when a level got wrong bytes, else ok.
int report_ladder(const ladder_flags& f, const bench::ladder_result& r, const bench::run_stamp& stamp) {
  const bool interrupted = r.interrupted || interrupt_flag().load();
  if (f.json) {
    nlohmann::json json = bench::ladder_json(r, stamp);
    if (interrupted) json["interrupted"] = true;
    if (!f.trace.file.empty()) json["traces"] = write_level_traces(r.traces, f.trace, r.spec->levels, true);
    emit(f.output, json.dump(2) + "\n");
  } else {
    std::string text = escape_control(bench::format_table(r), true);
    if (interrupted)
      text += fmt::format("\ninterrupted: the {} level(s) above finished; the others did not run\n",
                          r.rows.size());
    emit(f.output, text);
    if (!f.trace.file.empty())
      static_cast<void>(write_level_traces(r.traces, f.trace, r.spec->levels, false));
  }
  if (interrupted) return exit_status::interrupted;
  return r.wrong() == 0 ? exit_status::ok : exit_status::wrong_data;
}

// Prints a one-shot result: JSON or its line of text; wrong_data when bytes arrived wrong.
int report_once(const ladder_flags& f, const nlohmann::json& j, const std::string& text,
                std::uint64_t mismatches) {
  emit(f.output, f.json ? j.dump(2) + "\n" : text);
  return mismatches == 0 ? exit_status::ok : exit_status::wrong_data;
}

// The levels a run will record: those asked for, or the ladder's default list.
template <class Config>
std::vector<std::string> levels_of(const ladder_flags& f, const Config& defaults) {
  Config cfg = defaults;
  apply_ladder_flags(f, cfg);
  return cfg.levels;
}

// --levels: every name a level of the ladder, checked before the work.
void check_levels(const bench::ladder_spec& spec, const std::vector<std::string>& levels) {
  for (const auto& level : levels) {
    try {
      static_cast<void>(bench::level_index(spec, level));
    } catch (const logic_error& e) {
      throw flag_error(fmt::format("--levels: {}", escape_control(e.what())));
    }
  }
}

int run_egress(const egress_flags& f, const std::string& command) {
  FERRY_EXPECTS(
      f.trace.file.empty() || f.pure_copy == 0,
      "--trace records the ladder's levels; it does not apply to --pure-copy (drop one of the two)");
  if (f.inject_wrong_byte && f.no_check)
    throw flag_error("--inject-wrong-byte tests the check that --no-check turns off; drop one of the two");
  check_levels(bench::egress_spec(), levels_of(f, bench::default_egress_options(backend::host)));
  check_outputs(f, levels_of(f, bench::default_egress_options(backend::host)));
  const bench::run_stamp stamp = bench::stamp_now(command);
  auto dev = open_device(f.dev, f.pure_copy > 0 ? host_device_options{} : bench::ladder_host_options());
  bench::egress_options cfg = f.pure_copy > 0 ? bench::default_pure_copy_options(dev->kind())
                                              : bench::default_egress_options(dev->kind());
  apply_ladder_flags(f, cfg);
  if (f.pool_buffers != 0) cfg.pool_buffers = f.pool_buffers;
  if (f.slot_bytes != 0) cfg.slot_bytes = f.slot_bytes;
  if (f.slots != 0) cfg.slots = f.slots;
  cfg.probed_gbps = f.probed_d2h;
  cfg.inject_wrong_byte = f.inject_wrong_byte;
  check_egress_memory(*dev, cfg, f.pure_copy > 0);

  status_line status;
  if (f.pure_copy > 0) {
    const bench::pure_copy_result r =
        bench::run_egress_pure_copy(*dev, cfg, f.pure_copy, progress_to(status));
    return report_once(f, bench::to_json(r, cfg, stamp), bench::format_text(r), r.mismatches);
  }
  graceful_interrupts(true);
  count_steps_on(status, cfg);
  cfg.emulator = bench::ladder_host_options();
  const bench::egress_result r = bench::run_egress(*dev, cfg, progress_to(status));
  return report_ladder(f, r, stamp);
}

// Both ways: ingest and egress pure copies at once, each sized to move about the same bytes.
int run_both_ways(const ingest_flags& f, device& dev, const bench::ingest_options& in,
                  const bench::run_stamp& stamp) {
  bench::egress_options out = bench::default_both_ways_egress_options(dev.kind());
  if (f.egress_slot_bytes != 0) out.slot_bytes = f.egress_slot_bytes;
  if (f.egress_slots != 0) out.slots = f.egress_slots;
  if (f.egress_workers != 0) out.workers = f.egress_workers;
  check_egress_memory(dev, out, true);
  status_line status;
  const bench::both_ways_result r =
      bench::run_both_ways(dev, in, out, std::chrono::milliseconds(f.both_ways), progress_to(status));
  return report_once(f, bench::to_json(r, stamp), bench::format_text(r),
                     r.ingest.mismatches + r.egress.mismatches);
}

int run_ingest(const ingest_flags& f, const std::string& command) {
  FERRY_EXPECTS(f.trace.file.empty() || (f.pure_copy == 0 && f.both_ways == 0),
                "--trace records the ladder's levels; it does not apply to --pure-copy or --both-ways");
  FERRY_EXPECTS(f.pure_copy == 0 || f.both_ways == 0,
                "--pure-copy and --both-ways are two different runs; give one of them");
  check_levels(bench::ingest_spec(), levels_of(f, bench::default_ingest_options(backend::host)));
  check_outputs(f, levels_of(f, bench::default_ingest_options(backend::host)));
  const bench::run_stamp stamp = bench::stamp_now(command);
  auto dev = open_device(
      f.dev, f.pure_copy > 0 || f.both_ways > 0 ? host_device_options{} : bench::ladder_host_options());
  bench::ingest_options cfg = f.both_ways > 0 ? bench::default_both_ways_ingest_options(dev->kind())
                                              : bench::default_ingest_options(dev->kind());
  apply_ladder_flags(f, cfg);
  if (f.host_slots != 0) cfg.host_slots = f.host_slots;
  if (f.depth != 0) cfg.depth = f.depth;
  cfg.probed_gbps = f.probed_h2d;
  check_ingest_memory(*dev, cfg, f.pure_copy > 0 || f.both_ways > 0);
  if (f.both_ways > 0) return run_both_ways(f, *dev, cfg, stamp);
  status_line status;
  if (f.pure_copy > 0) {
    const bench::ingest_pure_copy_result r =
        bench::run_ingest_pure_copy(*dev, cfg, f.pure_copy, progress_to(status));
    return report_once(f, bench::to_json(r, stamp), bench::format_text(r), r.mismatches);
  }
  graceful_interrupts(true);
  count_steps_on(status, cfg);
  cfg.emulator = bench::ladder_host_options();
  const bench::ingest_result r = bench::run_ingest(*dev, cfg, progress_to(status));
  return report_ladder(f, r, stamp);
}

}  // namespace

std::function<int()> add_bench_command(CLI::App& app, std::string command) {
  CLI::App* bench_cmd =
      app.add_subcommand("bench", "Run a data-path ladder against its compute-only ceiling");
  bench_cmd->require_subcommand(1);

  auto f = std::make_shared<egress_flags>();
  const bench::egress_options eg_cuda = bench::default_egress_options(backend::cuda);
  const bench::egress_options eg_host = bench::default_egress_options(backend::host);
  const bench::egress_options pure = bench::default_pure_copy_options(backend::cuda);
  CLI::App* eg =
      bench_cmd->add_subcommand("egress", "Device-to-host ladder: ideal, L0..L4, ferry (or --pure-copy)");
  add_ladder_flags(*eg, *f, eg_cuda, eg_host, "Output shape", "Host processing threads");
  add_int_flag(*eg, "--pool-buffers", f->pool_buffers, 1, max_buffers,
               fmt::format("Whole-output buffers in the L2..L4 pools (default {})",
                           per_backend(eg_cuda, eg_host, [](const auto& c) { return c.pool_buffers; })));
  add_bytes_flag(
      *eg, "--slot-bytes", f->slot_bytes, 8, max_host_buffer_bytes(),
      fmt::format("ferry's pinned slot size (default {})",
                  per_backend(eg_cuda, eg_host, [](const auto& c) { return format_bytes(c.slot_bytes); })));
  add_int_flag(*eg, "--slots", f->slots, 1, max_buffers,
               fmt::format("ferry's pinned slots (default {}: above the chunks of one output)",
                           per_backend(eg_cuda, eg_host, [](const auto& c) { return c.slots; })));
  add_int_flag(
      *eg, "--pure-copy", f->pure_copy, 1, max_count,
      fmt::format("Pure-copy mode: drain this many outputs with no compute (on cuda unless given: {} x {} "
                  "slots, and all cores but one checking: {} here)",
                  format_bytes(pure.slot_bytes), pure.slots, pure.workers));
  add_double_flag(*eg, "--probed-d2h", f->probed_d2h, 0, max_gbps,
                  "Pinned D2H GB/s to compare with (default: measured first)");
  eg->add_flag(
      "--inject-wrong-byte", f->inject_wrong_byte,
      fmt::format("Self-test of the check: flip one byte of each level's first delivered output; the "
                  "run then counts it and exits with status {}",
                  exit_status::wrong_data));

  auto g = std::make_shared<ingest_flags>();
  const bench::ingest_options in_cuda = bench::default_ingest_options(backend::cuda);
  const bench::ingest_options in_host = bench::default_ingest_options(backend::host);
  const bench::egress_options both = bench::default_both_ways_egress_options(backend::cuda);
  CLI::App* in = bench_cmd->add_subcommand("ingest", "Host-to-device ladder: ideal, L0..L4, ferry");
  add_ladder_flags(*in, *g, in_cuda, in_host, "Image batch", "Sample-making threads");
  add_int_flag(*in, "--host-slots", g->host_slots, 1, max_buffers,
               fmt::format("Pinned batches made ahead (default {})",
                           per_backend(in_cuda, in_host, [](const auto& c) { return c.host_slots; })));
  add_int_flag(*in, "--depth", g->depth, 1, max_buffers,
               fmt::format("Device batches copied ahead (default {})",
                           per_backend(in_cuda, in_host, [](const auto& c) { return c.depth; })));
  add_double_flag(*in, "--probed-h2d", g->probed_h2d, 0, max_gbps,
                  "Pinned H2D GB/s to compare with (default: measured first)");
  add_int_flag(*in, "--pure-copy", g->pure_copy, 1, max_count,
               "Pure-copy mode: move this many batches with no compute");
  add_int_flag(
      *in, "--both-ways", g->both_ways, 1, max_both_ways_ms,
      fmt::format("Ingest and egress pure copies at once for this many milliseconds, against the probed "
                  "two-way total ({} sample-making threads unless given)",
                  bench::default_both_ways_ingest_options(backend::cuda).workers));
  add_int_flag(
      *in, "--egress-workers", g->egress_workers, 1, max_threads,
      fmt::format("With --both-ways: the egress side's checking threads (default all cores but two: {} here)",
                  both.workers));
  add_bytes_flag(*in, "--egress-slot-bytes", g->egress_slot_bytes, 8, max_host_buffer_bytes(),
                 fmt::format("With --both-ways: the egress side's slot size (default {} on cuda)",
                             format_bytes(both.slot_bytes)));
  add_int_flag(
      *in, "--egress-slots", g->egress_slots, 1, max_buffers,
      fmt::format("With --both-ways: the egress side's slot count (default {} on cuda)", both.slots));
  std::function<int()> run_comm = add_comm_bench_commands(*bench_cmd, command);
  return [f, eg, g, in, command, run_comm]() -> int {
    if (eg->parsed()) return run_egress(*f, command);
    if (in->parsed()) return run_ingest(*g, command);
    return run_comm();
  };
}

}  // namespace ferry::cli
