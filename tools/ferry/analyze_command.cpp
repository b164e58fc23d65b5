// `ferry analyze FILE|DIR`: reads a ferry trace (`ferry bench ... --trace`), a PyTorch profiler (Kineto)
// trace, or a directory `ferry trace` recorded (one analysis per GPU-owning process), and says what the GPU
// spent each step on, what the CPU did while the GPU idled, and what to fix.
// --fail-on RULE,... turns a finding into an exit status, so CI can gate on it.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <memory>
#include <set>
#include <sstream>

#include "commands.hpp"
#include "exit_status.hpp"
#include "ferry/analyze/analyze.hpp"
#include "ferry/core/error.hpp"
#include "ferry/core/text.hpp"
#include "ferry/core/units.hpp"
#include "ferry/report/report_html.hpp"
#include "ferry/trace/process_trace.hpp"
#include "ferry/trace/trace_io.hpp"
#include "flags.hpp"
#include "run_control.hpp"

namespace ferry::cli {
namespace {

struct analyze_flags {
  std::string file;
  bool json = false;
  std::string html;
  std::string output;
  std::string step_prefix;
  double idle_threshold = trace::analyze_options{}.idle_threshold;
  double link_h2d = 0;
  double link_d2h = 0;
  std::uint64_t max_bytes = 0;
  std::string fail_on;  // RULE[,RULE...] or "any"
};

// --fail-on's rules, checked before the trace is read: each a rule id, or "any" for every rule.
std::set<std::string> parse_fail_on(const std::string& text) {
  std::set<std::string> out;
  if (text.empty()) return out;
  const std::vector<std::string>& known = trace::rule_ids();
  std::stringstream in(text);
  std::string rule;
  while (std::getline(in, rule, ',')) {
    if (rule == "any") {
      // compute_bound is the verdict that nothing needs fixing: gating on it is asked by name only.
      for (const std::string& r : known)
        if (r != "compute_bound") out.insert(r);
      continue;
    }
    if (std::find(known.begin(), known.end(), rule) == known.end())
      throw flag_error(fmt::format("--fail-on {}: \"{}\" is not a rule; expected any, or one or more of {}",
                                   escape_control(text), escape_control(rule), fmt::join(known, ", ")));
    out.insert(rule);
  }
  if (out.empty())
    throw flag_error(fmt::format("--fail-on \"{}\": no rule given; expected any, or one or more of {}",
                                 escape_control(text), fmt::join(known, ", ")));
  return out;
}

// Exit status for --fail-on from the findings of `analyses`.
int fail_on_status(const std::set<std::string>& fail_on,
                   const std::vector<const trace::analysis*>& analyses) {
  std::vector<std::string> failed;
  for (const trace::analysis* a : analyses)
    for (const trace::finding& x : a->findings)
      if (fail_on.contains(x.rule) && std::find(failed.begin(), failed.end(), x.rule) == failed.end())
        failed.push_back(x.rule);
  if (failed.empty()) return exit_status::ok;
  fmt::print(stderr, "ferry: --fail-on: the analysis has {} finding{}: {} (exit status {})\n",
             failed.size() == 1 ? "a" : "these", failed.size() == 1 ? "" : "s", fmt::join(failed, ", "),
             exit_status::finding);
  return exit_status::finding;
}

// A directory `ferry trace` recorded: the process tree, and one analysis per GPU-owning process.
int run_analyze_session(const analyze_flags& f, const std::set<std::string>& fail_on,
                        const trace::read_limits& limits, status_line& status) {
  status.set("analyze: reading the process traces in " + f.file);
  const trace::timeline t = trace::read_process_traces(f.file, limits);
  trace::analyze_options opts;
  opts.step_prefix = f.step_prefix;
  opts.idle_threshold = f.idle_threshold;
  opts.link_h2d_gbps = f.link_h2d;
  opts.link_d2h_gbps = f.link_d2h;
  // The wording follows each process: PyTorch's for a Python program, C++ for another (analyze_session).
  status.set("analyze: analyzing " + f.file);
  const trace::session_analysis s = trace::analyze_session(t, opts);
  if (!f.html.empty()) {
    if (s.ranks.empty())
      throw input_error(fmt::format("--html {}: no process of {} has GPU activity to draw",
                                    escape_control(f.html), escape_control(f.file)));
    status.set("analyze: writing " + f.html);
    trace::write_html_report(t, s.ranks.front().result, f.html);
    status.line("analyze: wrote " + f.html + " (" + s.ranks.front().name + ")");
  }
  emit(f.output, f.json ? trace::to_json(s) + "\n" : escape_control(trace::format_text(s), true));
  std::vector<const trace::analysis*> analyses;
  for (const trace::process_analysis& pa : s.ranks) analyses.push_back(&pa.result);
  return fail_on_status(fail_on, analyses);
}

// A directory of per-rank traces (torch.profiler's tensorboard_trace_handler writes one
// <worker>.<time>.pt.trace.json[.gz] per rank, as HTA reads them; or ferry's own): each analyzed, then the
// ranks side by side and the straggler.
int run_analyze_ranks(const analyze_flags& f, const std::set<std::string>& fail_on,
                      const trace::read_limits& limits, status_line& status) {
  if (!f.html.empty())
    throw flag_error(
        fmt::format("--html {}: {} is a directory of per-rank traces; give one rank's file for a report",
                    escape_control(f.html), escape_control(f.file)));
  std::vector<std::filesystem::path> files;
  for (const auto& e : std::filesystem::directory_iterator(f.file)) {
    const std::string name = e.path().filename().string();
    if (e.is_regular_file() && (name.ends_with(".json") || name.ends_with(".json.gz")))
      files.push_back(e.path());
  }
  std::sort(files.begin(), files.end());
  if (files.empty())
    throw input_error(
        fmt::format("{}: a directory with neither process traces (ferry trace -o) nor trace files "
                    "(*.json, *.json.gz: one per rank, as torch.profiler's tensorboard_trace_handler "
                    "writes them)",
                    escape_control(f.file)));
  trace::session_analysis s;
  trace::analyze_options opts;
  opts.step_prefix = f.step_prefix;
  opts.idle_threshold = f.idle_threshold;
  opts.link_h2d_gbps = f.link_h2d;
  opts.link_d2h_gbps = f.link_d2h;
  for (const std::filesystem::path& p : files) {
    status.set("analyze: reading " + p.string());
    const trace::timeline t = trace::read_trace(p, limits);
    trace::process_analysis pa;
    pa.name = p.filename().string();
    try {
      pa.result = trace::analyze(t, opts);
    } catch (const input_error& e) {
      s.notes.push_back(fmt::format("{}: not analyzed: {}", pa.name, e.what()));
      continue;
    }
    s.ranks.push_back(std::move(pa));
  }
  trace::find_straggler(s);
  emit(f.output, f.json ? trace::to_json(s) + "\n" : escape_control(trace::format_text(s), true));
  std::vector<const trace::analysis*> analyses;
  for (const trace::process_analysis& pa : s.ranks) analyses.push_back(&pa.result);
  return fail_on_status(fail_on, analyses);
}

// The largest --max-bytes: what reading may inflate to must fit in memory several times over anyway.
constexpr std::uint64_t max_trace_bytes = std::uint64_t{1} << 40;

int run_analyze(const analyze_flags& f) {
  const std::set<std::string> fail_on = parse_fail_on(f.fail_on);
  check_output(f.html, "--html");
  check_output(f.output, "--output");
  trace::read_limits limits;
  if (f.max_bytes != 0) limits.max_bytes = f.max_bytes;
  status_line status;
  if (trace::is_process_trace_dir(f.file)) return run_analyze_session(f, fail_on, limits, status);
  if (std::filesystem::is_directory(f.file)) return run_analyze_ranks(f, fail_on, limits, status);
  status.set("analyze: reading " + f.file);
  // The reader's progress (bytes read of the total, events), once reading has taken a couple of seconds.
  const trace::timeline t = trace::read_trace(
      f.file, limits, [&status](const std::string& line) { status.set("analyze: " + line); });
  status.set("analyze: analyzing " + f.file);
  trace::analyze_options opts;
  opts.step_prefix = f.step_prefix;
  opts.idle_threshold = f.idle_threshold;
  opts.link_h2d_gbps = f.link_h2d;
  opts.link_d2h_gbps = f.link_d2h;
  const trace::analysis a = trace::analyze(t, opts);
  if (!f.html.empty()) {
    status.set("analyze: writing " + f.html);
    trace::write_html_report(t, a, f.html);
    status.line("analyze: wrote " + f.html);
  }
  // Names in the text come from the trace: a hostile one must not drive the terminal. JSON escapes them.
  emit(f.output, f.json ? trace::to_json(a) + "\n" : escape_control(trace::format_text(a), true));
  return fail_on_status(fail_on, {&a});
}

}  // namespace

std::function<int()> add_analyze_command(CLI::App& app) {
  auto f = std::make_shared<analyze_flags>();
  CLI::App* cmd = app.add_subcommand(
      "analyze",
      "Analyze a trace (ferry's, or a PyTorch profiler export): step breakdown, idle time, findings");
  cmd->add_option("file", f->file,
                  "Trace file (ferry bench --trace output, torch.profiler export_chrome_trace) or a ferry "
                  "trace -o directory")
      ->required();
  cmd->add_flag("--json", f->json, "Print the analysis as JSON");
  cmd->add_option("--html", f->html,
                  "Also write a standalone HTML report (SVG timeline and step chart) here");
  cmd->add_option("--output,-o", f->output,
                  "Write the analysis (text, or with --json JSON) to this file instead of stdout; it appears "
                  "only once complete");
  cmd->add_option(
      "--step", f->step_prefix,
      "Step spans: ranges whose name starts with this (default ProfilerStep#, else ferry's 'step')");
  add_double_flag(*cmd, "--idle-threshold", f->idle_threshold, 0, 1,
                  fmt::format("GPU idle fraction per step that is a finding (default {})",
                              trace::analyze_options{}.idle_threshold));
  add_double_flag(*cmd, "--link-h2d", f->link_h2d, 0, max_gbps,
                  "Probed pinned H2D GB/s to compare copies with (ferry probe)");
  add_double_flag(*cmd, "--link-d2h", f->link_d2h, 0, max_gbps,
                  "Probed pinned D2H GB/s to compare copies with (ferry probe)");
  cmd->add_option("--fail-on", f->fail_on,
                  fmt::format("Exit with status {} when the analysis has a finding of one of these rules "
                              "(comma-separated; 'any': every rule but compute_bound): {}",
                              exit_status::finding, fmt::join(trace::rule_ids(), ", ")));
  add_bytes_flag(*cmd, "--max-bytes", f->max_bytes, 1, max_trace_bytes,
                 fmt::format("Refuse trace files larger than this (default {})",
                             format_bytes(trace::read_limits{}.max_bytes)));
  return [f]() { return run_analyze(*f); };
}

}  // namespace ferry::cli
