// What every subcommand does around its work: output files checked before the work and written whole,
// Ctrl-C, and a live status line on a terminal.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>

#include "exit_status.hpp"

namespace ferry::cli {

/// Exit status of a run ended by Ctrl-C (128 + SIGINT), as shells report it.
inline constexpr int interrupted_status = exit_status::interrupted;

/// Checks before any work that `path` (given to flag `flag`) can be written: its directory exists and
/// takes a new file. Throws flag_error (exit 2) naming the flag, the path and the reason. An empty path
/// (the flag not given) passes.
void check_output(const std::string& path, const std::string& flag);

/// Prints `text` on stdout, or with `path` non-empty writes it there whole (temporary name, then
/// rename), so a failed or interrupted run never leaves part of a result. A status line still drawn is
/// cleared and stopped first, so the result starts on a clean line of the terminal.
void emit(const std::string& path, const std::string& text);

/// Installs the SIGINT and SIGTERM handlers. Until graceful_interrupts(true), a signal removes the
/// temporaries of unfinished files and ends the process with 130. While graceful, the first signal only
/// sets interrupt_flag() (the ladder finishes its level and prints what finished); a second one ends
/// the process at once as above.
void install_interrupt_handlers();
void graceful_interrupts(bool on);
/// Set by the first SIGINT/SIGTERM while graceful.
[[nodiscard]] const std::atomic<bool>& interrupt_flag();

/// A status line on stderr while long work runs, redrawn every second with the time spent, and once a
/// ladder reports its steps, the steps done of the total and an estimate of the time left ("bench: L2:
/// 10 warm-up + ... (12 s; step 34 of 140, about 40 s left)"); only when stderr is a terminal: elsewhere
/// (a pipe, a file, CI) it prints nothing. Lines printed through line() appear above it. emit() clears
/// and stops it before printing a result.
class status_line {
 public:
  /// `force` draws it even when stderr is not a terminal (tests).
  explicit status_line(bool force = false);
  status_line(const status_line&) = delete;
  status_line& operator=(const status_line&) = delete;
  /// stop().
  ~status_line();
  /// Sets what the line says.
  void set(std::string text);
  /// Steps done of `total` over the whole run (every level's warm-up and timed steps): the line shows
  /// them and, from the pace since the first report, the time left. Thread-safe; redraws at most ten
  /// times a second.
  void steps(std::uint64_t done, std::uint64_t total);
  /// Prints `text` and a newline on stderr, above the status line; on any stderr.
  void line(const std::string& text);
  /// Clears the line and stops the redraws; later set() and steps() draw nothing. Idempotent.
  void stop();
  [[nodiscard]] bool active() const noexcept { return active_; }

 private:
  void draw_locked();
  bool active_ = false;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_ = false;
  std::string text_;
  std::chrono::steady_clock::time_point since_;
  std::chrono::steady_clock::time_point drawn_;
  // steps(): the first report (the pace is measured from it) and the latest.
  std::uint64_t first_done_ = 0;
  std::chrono::steady_clock::time_point first_at_;
  std::uint64_t done_ = 0;
  std::uint64_t total_ = 0;
  std::thread thread_;
};

/// "step 34 of 140, about 40 s left": what the status line says of a run's steps, `elapsed` after
/// `first_done` of them were reported done and now `done` are. The estimate needs a step done since the
/// first report and at least a second spent; without it, only the count.
[[nodiscard]] std::string steps_text(std::uint64_t done, std::uint64_t total, std::uint64_t first_done,
                                     std::chrono::steady_clock::duration elapsed);

}  // namespace ferry::cli
