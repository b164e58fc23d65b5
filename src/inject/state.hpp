// The injection library's per-process state, shared by its parts: the process's recorder and file, the
// writer thread that appends to the file every flush interval, and the guard that keeps ferry's own
// calls out of the trace. See inject.cpp for the life of a process's recording, exit.cpp for its end.
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

/// This process's state if it has one already, nullptr else; makes none (async-signal-safe).
[[nodiscard]] process_state* existing_state() noexcept;

/// True when this process records and is the one the library's memory belongs to: false in a vfork child
/// (posix_spawn, subprocess), which shares its parent's memory and runs no fork handler.
[[nodiscard]] bool in_recorded_process() noexcept;

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

/// Writes what was recorded and then the X line with `status`; `may_block` false (_exit): only if the
/// file's lock comes free within 50 ms. Called once, by the way out that finishes (exit.cpp).
void write_last(process_state& s, int status, bool may_block) noexcept;

/// The calling thread (the writer, about to run the program's exit handlers) takes the program's signal
/// mask and is no longer ferry's own.
void become_program_thread() noexcept;

/// The contents of a small file (up to about 1 MiB), read with raw system calls; empty when unreadable.
[[nodiscard]] std::string read_small(const char* path);

/// exit.cpp, the exit protocol (its table says what each way out does). At load: the last exit handler
/// and, where SIGTERM is at its default, its handler.
void install_exit_handlers() noexcept;
/// In a fork child: its own exit is to come (the phase starts again).
void exit_after_fork() noexcept;
/// Whether the process has begun to exit (main returned, exit(), SIGTERM, ...): CUPTI is stopped or about
/// to be, for good.
[[nodiscard]] bool exit_begun() noexcept;
/// The writer's sleep between flushes: `ns`, or until a SIGTERM asks it to finish.
void writer_sleep(std::int64_t ns) noexcept;
/// Asked by the writer after each sleep: finishes for a SIGTERM, runs exit(0) when only it is left (a
/// pthread_exit main), and says whether the writer must stop (the X line is written or being written).
[[nodiscard]] bool writer_must_stop(process_state& s) noexcept;

/// Turns the capture switch of every process of the recording (writes the control file).
void set_capture(bool on) noexcept;

/// CUPTI's part (cuda.cpp): starts or stops the CUPTI recorder of this process when capture turns on or
/// off; flushes it. No-ops in a build without CUDA.
void cupti_start(process_state& s) noexcept;
void cupti_stop(process_state& s) noexcept;
void cupti_flush(process_state& s, bool forced) noexcept;
/// Stops the CUPTI recorder for good (exit.cpp calls it once the process has begun to exit, so no capture
/// window starts it again): when main returns or exit() is called, before the exit handlers run, the CUDA
/// runtime's teardown among them (a statically linked cudart registers it after cuInit, so it runs before
/// this library's own handler); CUPTI called after it crashes the process (seen on an H200:
/// cuptiActivityDisable, SIGSEGV). Waits for a close in progress on another thread.
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
