#include "level_traces.hpp"

#include <fmt/format.h>

#include <cstdio>
#include <filesystem>
#include <system_error>

#include "ferry/core/text.hpp"
#include "ferry/report/report_html.hpp"
#include "ferry/trace/trace_io.hpp"
#include "flags.hpp"
#include "run_control.hpp"

namespace ferry::cli {
namespace {

// "out/run.json" + "L0" -> "out/run.L0.json"
std::filesystem::path level_path(const std::filesystem::path& base, const std::string& level,
                                 const std::string& ext) {
  std::filesystem::path p = base;
  p.replace_filename(base.stem().string() + "." + level + ext);
  return p;
}

std::string trace_extension(const std::filesystem::path& base) {
  return base.has_extension() ? base.extension().string() : std::string(".json");
}

}  // namespace

void add_trace_flags(CLI::App& app, trace_flags& f, const std::string& default_events) {
  app.add_option(
      "--trace", f.file,
      "Record each level's timed steps (CUPTI on cuda) and analyze them: writes FILE's stem.<level>.json "
      "(Chrome/Perfetto trace) and .html (report) per level, and names each level's bottleneck");
  add_int_flag(app, "--trace-events", f.events, 1, max_trace_events,
               fmt::format("Events the recorder keeps per level (default {})", default_events));
}

void apply_trace_flags(const trace_flags& f, bench::trace_options& opts) {
  if (f.file.empty()) return;
  opts.enabled = true;
  if (f.events != 0) opts.capacity = f.events;
}

void check_trace_outputs(const trace_flags& f, const std::vector<std::string>& levels) {
  if (f.file.empty()) return;
  const std::filesystem::path b(f.file);
  const std::string ext = trace_extension(b);
  if (b.has_parent_path()) {
    std::error_code ec;
    std::filesystem::create_directories(b.parent_path(), ec);
    if (ec)
      throw flag_error(fmt::format("--trace {}: cannot create directory {}: {}", escape_control(f.file),
                                   escape_control(b.parent_path().string()), ec.message()));
  }
  for (const auto& level : levels) {
    check_output(level_path(b, level, ext).string(), "--trace");
    check_output(level_path(b, level, ".html").string(), "--trace");
  }
}

nlohmann::json write_level_traces(const std::vector<bench::level_trace>& traces, const trace_flags& f,
                                  const std::vector<bench::level_info>& levels, bool quiet) {
  nlohmann::json out = nlohmann::json::array();
  const std::filesystem::path b(f.file);
  const std::string ext = trace_extension(b);
  for (const auto& t : traces) {
    const auto trace_file = level_path(b, t.level, ext);
    trace::write_chrome_trace(t.timeline, trace_file);
    nlohmann::json j{{"level", t.level},
                     {"trace_file", trace_file.string()},
                     {"events", t.timeline.events.size()},
                     {"dropped", t.timeline.dropped}};
    j["expected_finding"] = bench::expected_finding_of(levels, t.level);
    if (t.analysis) {
      const auto html_file = level_path(b, t.level, ".html");
      trace::write_html_report(t.timeline, *t.analysis, html_file);
      j["html_file"] = html_file.string();
      j["bottleneck"] = t.analysis->bottleneck();
      j["analysis"] = nlohmann::json::parse(trace::to_json(*t.analysis));
      if (!quiet)
        fmt::print(stderr, "bench: {} trace {} and report {}\n", t.level, escape_control(trace_file.string()),
                   escape_control(html_file.string()));
    } else {
      j["analysis_error"] = t.analysis_error;
      if (!quiet)
        fmt::print(stderr, "bench: {} trace {} (not analyzed: {})\n", t.level,
                   escape_control(trace_file.string()), escape_control(t.analysis_error));
    }
    out.push_back(std::move(j));
  }
  return out;
}

}  // namespace ferry::cli
