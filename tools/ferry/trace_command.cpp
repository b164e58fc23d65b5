// `ferry trace [options] -- CMD ARGS...`: records an unmodified program and every process it starts.
//
// The flags and the printing; the launcher itself is ferry::launch (include/ferry/launch/launch.hpp: the
// injection library in the program's environment, the subreaper, the /proc sampler, the capture window,
// the signals). After it the CLI merges the per-process files into DIR/trace.json (Chrome/Perfetto), says
// what each rank was bound by and exits with CMD's status.
#include <fmt/format.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "commands.hpp"
#include "exit_status.hpp"
#include "ferry/analyze/analyze.hpp"
#include "ferry/core/error.hpp"
#include "ferry/core/text.hpp"
#include "ferry/launch/launch.hpp"
#include "ferry/trace/inject.h"
#include "ferry/trace/process_trace.hpp"
#include "ferry/trace/trace_io.hpp"
#include "flags.hpp"
namespace ferry::cli {
namespace {

namespace fs = std::filesystem;

// The flags: the launcher's options, and what the CLI does around it.
struct trace_command_flags {
  launch::options o;
  std::string output = "ferry-trace";
  std::string python = "auto";
  bool no_merge = false;
};

fs::path self_dir() {
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  return ec ? fs::path{} : exe.parent_path();
}

// The first of `candidates` that exists, or empty.
fs::path first_existing(const std::vector<fs::path>& candidates) {
  for (const fs::path& p : candidates) {
    std::error_code ec;
    if (!p.empty() && fs::exists(p, ec)) return fs::weakly_canonical(p, ec);
  }
  return {};
}

std::string getenv_or(const char* name) {
  // NOLINTNEXTLINE(concurrency-mt-unsafe): nothing in ferry changes the environment
  const char* v = std::getenv(name);
  return v != nullptr ? v : "";
}

fs::path inject_library() {
  const std::string env = getenv_or("FERRY_INJECT_LIBRARY");
  if (!env.empty()) {
    if (!fs::exists(env))
      throw flag_error(fmt::format("FERRY_INJECT_LIBRARY={}: no such file", escape_control(env)));
    return fs::absolute(env);
  }
  const fs::path here = self_dir();
  const std::vector<fs::path> places{here / "libferry_inject.so", here / "../lib/libferry_inject.so",
                                     here / "../../src/inject/libferry_inject.so"};
  fs::path found = first_existing(places);
  if (found.empty()) {
    std::string tried;
    for (const fs::path& p : places) tried += (tried.empty() ? "" : ", ") + p.lexically_normal().string();
    throw flag_error(
        fmt::format("ferry trace: libferry_inject.so not found (tried {}); set "
                    "FERRY_INJECT_LIBRARY to its path",
                    tried));
  }
  return found;
}

// ferry's sitecustomize folder (python/ferry/_trace_site), or empty when not found (no Python ranges).
fs::path site_dir() {
  const std::string env = getenv_or(FERRY_TRACE_ENV_SITE);
  if (!env.empty()) return fs::absolute(env);
  const fs::path here = self_dir();
  return first_existing({here / "_trace_site", here / "../../../../python/ferry/_trace_site"});
}

// DIR/trace.json from the per-process files, the recording's own cost and each rank's verdict; `code`,
// or exit_status::error when the files cannot be merged.
int merge(const trace_command_flags& f, const launch::result& r, int code) {
  const fs::path& dir = r.dir;
  const long long first = r.steps_first;
  try {
    const trace::timeline t = trace::read_process_traces(dir);
    std::size_t gpu = 0;
    for (const auto& [k, p] : t.processes) gpu += p.gpu ? 1 : 0;
    trace::write_chrome_trace(t, dir / "trace.json");
    fmt::print(
        stderr,
        "ferry trace: {} processes ({} with GPU activity), {} events -> {} (Perfetto, chrome://tracing); "
        "`ferry analyze {}` says where the GPU waited\n",
        t.processes.size(), gpu, t.events.size(), escape_control((dir / "trace.json").string()),
        escape_control(f.output));
    // The recording's own cost, when the steps before the capture are known, and each rank's verdict.
    trace::analyze_options opts;
    const trace::session_analysis s = trace::analyze_session(t, opts);
    const bool windowed = r.windowed;
    bool opened = false;
    for (const auto& [k, p] : t.processes) opened = opened || p.notes.contains("capture_on_ns");
    if (windowed && !opened)
      fmt::print(stderr, "ferry trace: warning: the capture window never opened ({}): nothing was captured\n",
                 first >= 0 ? "no process reached the steps given; is it a Python program with an optimizer?"
                 : f.o.capture_range == "cudaProfilerApi"
                     ? "no cudaProfilerStart through the dynamic CUDA runtime"
                 : f.o.capture_range == "nvtx" ? "no NVTX range of that name"
                                               : "the program ended before the delay");
    if (s.recording_cost > -1)
      fmt::print(stderr,
                 "ferry trace: recording cost {:+.1f}% (median step {:.2f} ms before the capture, {:.2f} "
                 "ms during){}\n",
                 s.recording_cost * 100, s.steps_before_ms, s.steps_during_ms,
                 s.recording_cost > 0.05 ? "; above 5%: --lite records kernels and copies only" : "");
    for (const trace::process_analysis& pa : s.ranks)
      fmt::print(stderr, "ferry trace: {}: {}\n", escape_control(pa.name),
                 escape_control(pa.result.findings.front().title));
  } catch (const std::exception& e) {
    fmt::print(stderr, "ferry trace: the recording in {} could not be merged: {}\n",
               escape_control(dir.string()), escape_control(e.what()));
    if (code == 0) code = exit_status::error;
  }
  return code;
}

int run_trace(const trace_command_flags& f) {
  launch::options o = f.o;
  o.output = f.output;
  o.inject_library = inject_library();
  if (f.python != "none") o.site_dir = site_dir();
  o.python = f.python != "none";
  launch::result r;
  try {
    r = launch::launch(o, [](const std::string& line) { fmt::print(stderr, "ferry trace: {}\n", line); });
  } catch (const launch::options_error& e) {
    throw flag_error(e.what());
  }
  if (!r.started) {
    fmt::print(stderr, "ferry trace: cannot run {}: {}; nothing was recorded\n",
               escape_control(f.o.command[0]), escape_control(r.why_not_started));
    return r.exit_status;
  }
  int code = r.exit_status;
  fmt::print(stderr, "ferry trace: recorded {} for {:.1f} s; the launcher used {:.1f}% of one core\n",
             escape_control(f.o.command[0]), r.wall_s, r.launcher_cpu * 100.0);
  // A crash or a kill says so: the exit status alone (139) is easy to miss under the recording's lines.
  if (r.signal != 0) {
    const char* what = sigdescr_np(r.signal);
    fmt::print(stderr, "ferry trace: {} was ended by signal {} ({}){}; exit status {}\n",
               escape_control(f.o.command[0]), r.signal, what != nullptr ? what : "unknown",
               r.core_dumped ? ", core dumped" : "", code);
  }
  if (!f.no_merge) code = merge(f, r, code);
  return code;
}

}  // namespace

std::function<int()> add_trace_command(CLI::App& app) {
  auto f = std::make_shared<trace_command_flags>();
  CLI::App* cmd = app.add_subcommand(
      "trace",
      "Record an unmodified program and every process it starts (CUDA, NVTX, blocking calls, CPU use): "
      "ferry trace [options] -- CMD ARGS...");
  cmd->add_option("-o,--output", f->output, "Directory for the recording (default ferry-trace)");
  cmd->add_flag("--force", f->o.force, "Replace the recording in a non-empty output directory");
  add_double_flag(*cmd, "--delay", f->o.delay_s, 0, 1e6, "Seconds before the capture starts (default 0)");
  add_double_flag(*cmd, "--duration", f->o.duration_s, 0, 1e6,
                  "Seconds of capture after the delay; the program runs on unrecorded (default: to the end)");
  cmd->add_option(
         "--capture-range", f->o.capture_range,
         "none; cudaProfilerApi: capture between cudaProfilerStart and cudaProfilerStop; nvtx: inside "
         "the NVTX range --nvtx-capture names")
      ->check(CLI::IsMember({"none", "cudaProfilerApi", "nvtx"}));
  cmd->add_option(
      "--nvtx-capture", f->o.nvtx_capture,
      "NAME[@DOMAIN]: with --capture-range nvtx, capture while this NVTX range is open (in any process)");
  cmd->add_option("--steps", f->o.steps,
                  "A:B: capture training steps A to B (counted from 0; Python programs with an optimizer)");
  cmd->add_flag("--lite", f->o.lite,
                "Kernels, copies and memsets only (no runtime calls, no syncs): for launch-bound "
                "programs");
  cmd->add_flag("--no-syncs", f->o.no_syncs,
                "No CUDA synchronization records (the runtime calls that wait are still recorded, as calls)");
  cmd->add_flag("--all-runtime-calls", f->o.all_calls,
                "Every CUDA runtime call; by default the queries made around every kernel (cudaGetDevice, "
                "cudaGetLastError, ...) are left out: most of the calls, and what recording them costs");
  add_int_flag(
      *cmd, "--block-us", f->o.block_us, 1, FERRY_TRACE_MAX_BLOCK_US,
      fmt::format("Record blocking calls (munmap, read, poll, waits) at least this long (default {})",
                  FERRY_TRACE_DEFAULT_BLOCK_US));
  add_int_flag(
      *cmd, "--flush-ms", f->o.flush_ms, 1, FERRY_TRACE_MAX_FLUSH_MS,
      fmt::format("How often each process appends to its file: what a killed process loses (default {})",
                  FERRY_TRACE_DEFAULT_FLUSH_MS));
  add_double_flag(*cmd, "--wait-s", f->o.wait_s, 0, 1e6,
                  "After CMD exits, wait this long for the processes it left running (default 60)");
  add_int_flag(*cmd, "--sample-ms", f->o.sample_ms, 10, 10'000,
               "CPU-use sampling period of /proc (default 100)");
  cmd->add_option("--python", f->python,
                  "auto: ranges for the DataLoader, forward, backward and optimizer.step in "
                  "Python programs; none: no ranges")
      ->check(CLI::IsMember({"auto", "none"}));
  cmd->add_flag("--no-merge", f->no_merge, "Leave the per-process files unmerged (no trace.json)");
  cmd->add_option("command", f->o.command, "The program and its arguments, after --")->expected(-1);
  return [f]() { return run_trace(*f); };
}

}  // namespace ferry::cli
