// `ferry analyze FILE`: reads a ferry trace (`ferry bench ... --trace`) or a PyTorch profiler (Kineto)
// trace and says what the GPU spent each step on, what the CPU did while the GPU idled, and what to fix.
#include <fmt/format.h>

#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <memory>

#include "commands.hpp"
#include "ferry/analyze/analyze.hpp"
#include "ferry/core/error.hpp"
#include "ferry/core/units.hpp"
#include "ferry/report/report_html.hpp"
#include "ferry/trace/trace_io.hpp"

namespace ferry::cli {
namespace {

struct analyze_flags {
  std::string file;
  bool json = false;
  std::string html;
  std::string step_prefix;
  double idle_threshold = 0.10;
  double link_h2d = 0;
  double link_d2h = 0;
  std::string max_bytes;
};

int run_analyze(const analyze_flags& f) {
  trace::read_limits limits;
  if (!f.max_bytes.empty()) limits.max_bytes = parse_bytes(f.max_bytes);
  // Progress lines (bytes read, events) for a long read, to a person watching: only on a terminal.
  progress_fn progress;
  if (::isatty(STDERR_FILENO) == 1)
    progress = [](const std::string& line) { fmt::print(stderr, "{}\n", line); };
  const trace::timeline t = trace::read_trace(f.file, limits, progress);
  trace::analyze_options opts;
  opts.step_prefix = f.step_prefix;
  opts.idle_threshold = f.idle_threshold;
  opts.link_h2d_gbps = f.link_h2d;
  opts.link_d2h_gbps = f.link_d2h;
  const trace::analysis a = trace::analyze(t, opts);
  if (!f.html.empty()) {
    trace::write_html_report(t, a, f.html);
    fmt::print(stderr, "analyze: wrote {}\n", f.html);
  }
  std::cout << (f.json ? trace::to_json(a) + "\n" : trace::format_text(a));
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
  cmd->add_option(
      "--step", f->step_prefix,
      "Step spans: ranges whose name starts with this (default ProfilerStep#, else ferry's 'step')");
  cmd->add_option("--idle-threshold", f->idle_threshold, "GPU idle fraction per step that is a finding")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  cmd->add_option("--link-h2d", f->link_h2d, "Probed pinned H2D GB/s to compare copies with (ferry probe)");
  cmd->add_option("--link-d2h", f->link_d2h, "Probed pinned D2H GB/s to compare copies with (ferry probe)");
  cmd->add_option("--max-bytes", f->max_bytes, "Refuse trace files larger than this (default 2GiB)");
  return [f]() { return run_analyze(*f); };
}

}  // namespace ferry::cli
