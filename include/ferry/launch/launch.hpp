#pragma once
// ferry::launch: runs an unmodified program under ferry's injection library and records every process it
// starts, as `ferry trace -- CMD` does (the CLI keeps the flags and the printing;
// tools/ferry/trace_command.cpp).
//
// launch() puts libferry_inject.so in the program's environment (LD_PRELOAD, CUDA_INJECTION64_PATH,
// NVTX_INJECTION64_PATH) with the settings of include/ferry/trace/inject.h, and, for Python, ferry's
// sitecustomize folder first on PYTHONPATH. Every process appends its own file to the output folder. The
// launcher:
// - becomes a child subreaper, so descendants whose parent exits (a double fork, a daemon) are re-parented
//   to it, and waits for all of them after the command exits (SIGINT or SIGTERM then stops the wait);
// - samples /proc every sample_ms for the CPU use and running threads of each recorded process
//   (samples.ferry-cpu), and measures its own CPU use;
// - drives the capture window (delay_s, duration_s) through the capture switch file every process polls;
// - forwards a SIGINT or SIGTERM sent to it alone (not the terminal's, which reaches the command itself).
// Merging the per-process files (trace::read_process_traces) is the caller's, after launch() returns.

#include <cstdint>
#include <filesystem>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "ferry/trace/inject.h"

namespace ferry::launch {

/// What to run and how to record it: `ferry trace`'s flags.
struct options {
  std::vector<std::string> command;              ///< the program and its arguments (looked up as execvp does)
  std::filesystem::path output = "ferry-trace";  ///< the recording's folder (made if missing)
  bool force = false;                            ///< replace the recording in a non-empty folder
  double delay_s = 0;                            ///< seconds before the capture opens
  double duration_s = 0;                         ///< seconds of capture after the delay (0: to the end)
  std::string capture_range = "none";            ///< "none", "cudaProfilerApi" or "nvtx"
  std::string steps;                             ///< "A:B": capture training steps A to B (Python), or empty
  std::string nvtx_capture;                      ///< NAME[@DOMAIN], with capture_range "nvtx"
  bool lite = false;                             ///< kernels, copies and memsets only
  bool no_syncs = false;                         ///< no synchronization records
  bool all_calls = false;                        ///< every CUDA runtime call, the quiet queries included
  std::int64_t block_us = FERRY_TRACE_DEFAULT_BLOCK_US;  ///< blocking calls at least this long
  std::int64_t flush_ms = FERRY_TRACE_DEFAULT_FLUSH_MS;  ///< how often each process appends to its file
  std::int64_t sample_ms = 100;                          ///< the /proc sampling period
  double wait_s = 60;                                    ///< how long to wait for processes left running
  std::filesystem::path inject_library;                  ///< libferry_inject.so (absolute)
  std::filesystem::path site_dir;  ///< ferry's sitecustomize folder; empty: no Python ranges
  bool python = true;              ///< false (--python none): no Python ranges, so no steps
};

/// Options that cannot be combined, or an output folder that cannot be used: thrown before anything is
/// made or run. Its message names the value and what to do.
class options_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// How the run ended.
struct result {
  bool started = false;         ///< false: the command could not start (nothing was made or recorded)
  std::string why_not_started;  ///< why, when it could not start ("not found on PATH")
  int exit_status = 0;          ///< as a shell gives it: the command's code, or 128 + the signal (127/126
                                ///< when it could not start)
  int signal = 0;               ///< the signal that ended the command, or 0
  bool core_dumped = false;
  double wall_s = 0;           ///< from the start to the last process's end (or the end of the wait)
  double launcher_cpu = 0;     ///< the launcher's own CPU use, in cores
  std::filesystem::path dir;   ///< the recording's folder, absolute
  bool windowed = false;       ///< the capture did not open at the start (delay, capture range, steps)
  long long steps_first = -1;  ///< the first step of the steps window, or -1
};

/// Runs `o.command` under the injection library and waits for it and every process it left running
/// (up to `o.wait_s`). `note` gets each line the launcher has to say while it runs ("waiting up to 60 s
/// for the processes it left running"). Throws options_error for bad options or output folder, and
/// std::runtime_error when fork fails. Installs SIGINT and SIGTERM handlers for the run and puts the old
/// ones back in the child; not reentrant (one launch at a time per process).
result launch(const options& o, const std::function<void(const std::string&)>& note);

}  // namespace ferry::launch
