// `--trace FILE` of the ladders (`bench egress`, `ingest`, `ddp`): each level's timed steps recorded and
// analyzed, written as FILE's stem.<level>.json (Chrome/Perfetto trace) and .html (report) per level.
#pragma once

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "ferry/bench/bench_trace.hpp"
#include "ferry/bench/ladder.hpp"

namespace ferry::cli {

/// The recorder's capacity per level: the largest --trace-events takes.
inline constexpr std::int64_t max_trace_events = 100'000'000;

/// --trace FILE and --trace-events N, as given.
struct trace_flags {
  std::string file;        // per-level trace files: <stem>.<level><ext> (+ .html reports); "" = no tracing
  std::size_t events = 0;  // recorder capacity per level; 0 = the default
};

/// Adds --trace and --trace-events to a ladder's subcommand; `default_events` is the capacity the help
/// shows.
void add_trace_flags(CLI::App& app, trace_flags& f, const std::string& default_events);

/// Turns on the config's tracing when --trace was given (with --trace-events' capacity when given).
void apply_trace_flags(const trace_flags& f, bench::trace_options& opts);

/// Checks, before any work, every file --trace will write for these levels (its directory is created
/// first, as the run would): throws flag_error naming the file that cannot be written.
void check_trace_outputs(const trace_flags& f, const std::vector<std::string>& levels);

/// Writes each traced level's Chrome trace and HTML report next to --trace's file; returns their JSON
/// summary. Unless `quiet`, names each file on stderr.
nlohmann::json write_level_traces(const std::vector<bench::level_trace>& traces, const trace_flags& f,
                                  const std::vector<bench::level_info>& levels, bool quiet);

}  // namespace ferry::cli
