#include "run_control.hpp"

#include <signal.h>
#include <unistd.h>

#include <fmt/format.h>

#include <cmath>
#include <cstdio>
#include <exception>
#include <iostream>

#include "ferry/core/atomic_file.hpp"
#include "ferry/core/error.hpp"
#include "ferry/core/text.hpp"
#include "flags.hpp"

namespace ferry::cli {
namespace {

std::atomic<bool> interrupted{false};
std::atomic<bool> graceful{false};
// The status line being drawn, if any: emit() clears it before a result goes to the terminal.
std::atomic<status_line*> drawn_line{nullptr};

void write_stderr(const char* text) noexcept {
  std::size_t n = 0;
  while (text[n] != '\0') ++n;
  static_cast<void>(::write(STDERR_FILENO, text, n));
}

extern "C" void on_interrupt(int) {
  if (graceful.load() && !interrupted.exchange(true)) {
    write_stderr(
        "\nferry: interrupted: finishing the current level, then printing the finished ones "
        "(interrupt again to stop at once)\n");
    return;
  }
  remove_unfinished_files();
  write_stderr("\nferry: interrupted\n");
  ::_exit(interrupted_status);
}

}  // namespace

void check_output(const std::string& path, const std::string& flag) {
  if (path.empty()) return;
  try {
    check_output_path(path, flag);
  } catch (const logic_error& e) {
    throw flag_error(escape_control(e.what()));
  }
}

void emit(const std::string& path, const std::string& text) {
  if (path.empty()) {
    // stdout and stderr are often one terminal: the result must not start after the status line's text.
    if (status_line* s = drawn_line.load()) s->stop();
    std::cout << text << std::flush;
    return;
  }
  write_file_atomically(path, text);
}

void install_interrupt_handlers() {
  struct sigaction sa {};
  sa.sa_handler = on_interrupt;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
}

void graceful_interrupts(bool on) { graceful.store(on); }

const std::atomic<bool>& interrupt_flag() { return interrupted; }

std::string steps_text(std::uint64_t done, std::uint64_t total, std::uint64_t first_done,
                       std::chrono::steady_clock::duration elapsed) {
  std::string out = fmt::format("step {} of {}", done, total);
  const double seconds = std::chrono::duration<double>(elapsed).count();
  if (done <= first_done || done >= total || seconds < 1) return out;
  const double left = seconds / static_cast<double>(done - first_done) * static_cast<double>(total - done);
  // Rounded up: "about 0 s left" while a step still runs would read as done.
  if (left < 120) return out + fmt::format(", about {:.0f} s left", std::ceil(left));
  return out + fmt::format(", about {:.0f} min left", std::ceil(left / 60));
}

status_line::status_line(bool force)
    : active_(force || ::isatty(STDERR_FILENO) == 1), since_(std::chrono::steady_clock::now()) {
  if (!active_) return;
  drawn_line.store(this);
  thread_ = std::thread([this] {
    std::unique_lock lock(mutex_);
    while (!stop_) {
      draw_locked();
      wake_.wait_for(lock, std::chrono::seconds(1), [this] { return stop_; });
    }
  });
}

status_line::~status_line() {
  stop();
  status_line* self = this;
  drawn_line.compare_exchange_strong(self, nullptr);
}

void status_line::stop() {
  if (!active_) return;
  {
    const std::lock_guard lock(mutex_);
    if (stop_) return;
    stop_ = true;
    std::fputs("\r\x1b[K", stderr);
    std::fflush(stderr);
  }
  wake_.notify_all();
  thread_.join();
}

void status_line::draw_locked() {
  if (text_.empty() || stop_) return;
  const auto now = std::chrono::steady_clock::now();
  const auto s = std::chrono::duration_cast<std::chrono::seconds>(now - since_);
  const std::string steps = total_ == 0 ? "" : "; " + steps_text(done_, total_, first_done_, now - first_at_);
  fmt::print(stderr, "\r\x1b[K{} ({} s{})", text_, s.count(), steps);
  std::fflush(stderr);
  drawn_ = now;
}

void status_line::set(std::string text) {
  if (!active_) return;
  const std::lock_guard lock(mutex_);
  text_ = escape_control(text);
  since_ = std::chrono::steady_clock::now();
  draw_locked();
}

void status_line::steps(std::uint64_t done, std::uint64_t total) {
  if (!active_) return;
  const std::lock_guard lock(mutex_);
  const auto now = std::chrono::steady_clock::now();
  if (total_ != total) {
    first_done_ = done;
    first_at_ = now;
  }
  done_ = done;
  total_ = total;
  if (now - drawn_ >= std::chrono::milliseconds(100)) draw_locked();
}

void status_line::line(const std::string& text) {
  const std::lock_guard lock(mutex_);
  const bool drawing = active_ && !stop_;
  if (drawing) std::fputs("\r\x1b[K", stderr);
  fmt::print(stderr, "{}\n", escape_control(text));
  if (drawing) draw_locked();
}

}  // namespace ferry::cli
