// The injection library's per-process state, shared by its parts: the process's recorder and file, the
// writer thread that appends to the file every flush interval, and the guard that keeps ferry's own
// calls out of the trace. See inject.cpp for the life of a process's recording.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>

#include "ferry/trace/inject.h"
#include "ferry/trace/process_trace.hpp"
#include "ferry/trace/timeline.hpp"

#define FERRY_INJECT_EXPORT extern "C" __attribute__((visibility("default")))

namespace ferry::inject {

/// One process's recording. Made when the process starts (an exec'd image) or at its first event (a
/// fork child); never freed, since CUPTI's threads and a forked child may still point at it.
struct process_state {
  explicit process_state(bool forked);
  process_state(const process_state&) = delete;
  process_state& operator=(const process_state&) = delete;

  pid_t pid = 0;
  int fd = -1;
  dev_t file_dev = 0;  // the file's identity, to find out whether the program closed the descriptor
  ino_t file_ino = 0;
  std::string path;
  trace::recorder rec;
  std::mutex write_mu;                // one flush at a time (the writer thread, an exit path)
  trace::process_file_writer writer;  // under write_mu
  std::atomic<bool> writer_started{false};
  std::atomic<bool> cuda{false};        // CUDA was initialized in this process (InitializeInjection)
  std::atomic<bool> cupti_on{false};    // the CUPTI recorder runs
  std::atomic<bool> capture_on{false};  // the recorder's switch, for readers that must not lock
  std::atomic<bool> exited{false};      // the X line is written
  std::mutex capture_mu;                // apply_capture's: one switch at a time
  bool capture_opened = false;          // under capture_mu
  bool capture_closed = false;
};

/// Settings from the environment `ferry trace` sets, read once when the library loads.
struct settings {
  bool active = false;            // FERRY_TRACE_DIR is set: this process records
  std::string dir;                // FERRY_TRACE_DIR
  std::string control;            // FERRY_TRACE_CONTROL: the capture switch file ("on"/"off")
  bool capture_at_start = true;   // FERRY_TRACE_CAPTURE=off waits for the switch
  bool lite = false;              // FERRY_TRACE_LITE=1: kernels, copies and memsets only
  bool syncs = true;              // FERRY_TRACE_SYNCS=0: no synchronization records (--no-syncs)
  bool all_calls = false;         // FERRY_TRACE_ALL_CALLS=1: every runtime call (--all-runtime-calls)
  bool defer_conversion = false;  // FERRY_TRACE_DEFER_CONVERSION=1: cupti::options::defer_conversion
  std::int64_t block_ns =
      FERRY_TRACE_DEFAULT_BLOCK_US * 1000LL;  // FERRY_TRACE_BLOCK_US: calls at least this long
  std::int64_t flush_ns = FERRY_TRACE_DEFAULT_FLUSH_MS * 1'000'000LL;  // FERRY_TRACE_FLUSH_MS
  long long steps_first = -1;  // FERRY_TRACE_STEPS=A:B: capture steps A..B
  long long steps_last = -1;
  std::string nvtx_capture;  // FERRY_TRACE_NVTX_CAPTURE=NAME[@DOMAIN]: capture inside this range
  std::string nvtx_capture_domain;
};

[[nodiscard]] const settings& config() noexcept;

/// This process's state: made on first use in a fork child; nullptr when the process does not record or
/// the state cannot be made.
[[nodiscard]] process_state* state() noexcept;

/// True while ferry's own code runs on this thread (its writer, its interning): wrappers pass through.
[[nodiscard]] bool in_ferry() noexcept;

/// Marks the calling thread as running ferry's code for the guard's lifetime.
class own_call {
 public:
  own_call() noexcept;
  own_call(const own_call&) = delete;
  own_call& operator=(const own_call&) = delete;
  ~own_call();

 private:
  bool previous_;
};

/// Records `e` (capture switch permitting; `always` ignores it) and starts the writer thread on the
/// process's first event. Never throws.
void record(const trace::event& e, bool always = false) noexcept;

/// Starts the process's writer thread, if not yet (record() does at the first event).
void start_writer(process_state& s) noexcept;

/// The id of `text` in this process's recorder; 0 when it cannot be interned.
[[nodiscard]] std::uint32_t intern(std::string_view text) noexcept;

/// Appends a note (an M line) to the file now.
void note(std::string_view key, std::string_view value) noexcept;

/// Writes what was recorded so far; `cupti_forced` also forces CUPTI's partly filled buffers out.
void flush(process_state& s, bool cupti_forced) noexcept;

/// The exit paths: flushes everything, CUPTI included where it runs in this process, and writes the X
/// line once. Never throws; safe to call again. `may_block` false (_exit, which signal handlers call):
/// CUPTI is left alone and nothing is written when the file's lock is taken.
void finish(int status, bool may_block = true) noexcept;

/// main has returned (the interposed __libc_start_main saw it), in the process that recorded it: stops
/// CUPTI for good (cupti_close) before the exit handlers run.
void main_returned() noexcept;

/// Turns the capture switch of every process of the recording (writes the control file).
void set_capture(bool on) noexcept;

/// CUPTI's part (cuda.cpp): starts or stops the CUPTI recorder of this process when capture turns on or
/// off; flushes it. No-ops in a build without CUDA.
void cupti_start(process_state& s) noexcept;
void cupti_stop(process_state& s) noexcept;
void cupti_flush(process_state& s, bool forced) noexcept;
/// Stops the CUPTI recorder for good: no capture window starts it again. Called when main returns and from
/// finish(), before the exit handlers run: the CUDA runtime's teardown is among them (a statically linked
/// cudart registers it after cuInit, so it runs before this library's own handler), and CUPTI called after
/// it crashes the process (seen on an H200: cuptiActivityDisable, SIGSEGV).
void cupti_close(process_state& s) noexcept;
/// The last exit handler of a process that exited past main's return and exit() (errx, error: glibc calls
/// its own exit): CUDA's teardown may have run, so the running trace is dropped without a CUPTI call.
void cupti_abandon(process_state& s) noexcept;

/// Whether this process captures now (the recorder's switch, read without its lock).
[[nodiscard]] bool capturing() noexcept;

/// os_calls.cpp: turns the blocking calls the wrappers kept into events of `s`'s recorder (the writer
/// thread, under write_mu); forgets the parent's in a fork child.
void drain_os_calls(process_state& s) noexcept;
void os_calls_after_fork() noexcept;

/// nvtx.cpp: forgets the ranges the forking thread had open (their names are the parent's).
void nvtx_after_fork() noexcept;

/// CLOCK_MONOTONIC nanoseconds (trace::now_ns's clock).
[[nodiscard]] std::int64_t now_ns() noexcept;

}  // namespace ferry::inject
