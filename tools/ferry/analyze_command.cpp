// `ferry analyze FILE`: reads a ferry trace (`ferry bench ... --trace`) or a PyTorch profiler (Kineto)
// trace and says what the GPU spent each step on, what the CPU did while the GPU idled, and what to fix.
#include <fmt/format.h>

#include <cstdio>
#include <iostream>
#include <memory>

#include "commands.hpp"
#include "ferry/analyze/analyze.hpp"
#include "ferry/core/error.hpp"
#include "ferry/core/text.hpp"
#include "ferry/core/units.hpp"
#include "ferry/report/report_html.hpp"
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
};

// The largest --max-bytes: what reading may inflate to must fit in memory several times over anyway.
constexpr std::uint64_t max_trace_bytes = std::uint64_t{1} << 40;

int run_analyze(const analyze_flags& f) {
  check_output(f.html, "--html");
  check_output(f.output, "--output");
  trace::read_limits limits;
  if (f.max_bytes != 0) limits.max_bytes = f.max_bytes;
  status_line status;
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
  return 0;
}

}  // namespace

std::function<int()> add_analyze_command(CLI::App& app) {
  auto f = std::make_shared<analyze_flags>();
  CLI::App* cmd = app.add_subcommand(
      "analyze",
      "Analyze a trace (ferry's, or a PyTorch profiler export): step breakdown, idle time, findings");
  cmd->add_option("file", f->file,
                  "Trace file: ferry bench --trace output or torch.profiler export_chrome_trace")
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
  add_bytes_flag(*cmd, "--max-bytes", f->max_bytes, 1, max_trace_bytes,
                 fmt::format("Refuse trace files larger than this (default {})",
                             format_bytes(trace::read_limits{}.max_bytes)));
  return [f]() { return run_analyze(*f); };
}

}  // namespace ferry::cli
