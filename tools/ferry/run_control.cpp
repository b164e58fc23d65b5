#include "run_control.hpp"

#include <signal.h>
#include <unistd.h>

#include <fmt/format.h>

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

status_line::status_line(bool force)
    : active_(force || ::isatty(STDERR_FILENO) == 1), since_(std::chrono::steady_clock::now()) {
  if (!active_) return;
  thread_ = std::thread([this] {
    std::unique_lock lock(mutex_);
    while (!stop_) {
      draw_locked();
      wake_.wait_for(lock, std::chrono::seconds(1), [this] { return stop_; });
    }
  });
}

status_line::~status_line() {
  if (!active_) return;
  {
    const std::lock_guard lock(mutex_);
    stop_ = true;
    std::fputs("\r\x1b[K", stderr);
  }
  wake_.notify_all();
  thread_.join();
}

void status_line::draw_locked() {
  if (text_.empty()) return;
  const auto s = std::chrono::duration_cast<std::chrono::seconds>(std::chrono::steady_clock::now() - since_);
  fmt::print(stderr, "\r\x1b[K{} ({} s)", text_, s.count());
  std::fflush(stderr);
}

void status_line::set(std::string text) {
  if (!active_) return;
  const std::lock_guard lock(mutex_);
  text_ = escape_control(text);
  since_ = std::chrono::steady_clock::now();
  draw_locked();
}

void status_line::line(const std::string& text) {
  const std::lock_guard lock(mutex_);
  if (active_) std::fputs("\r\x1b[K", stderr);
  fmt::print(stderr, "{}\n", escape_control(text));
  if (active_) draw_locked();
}

}  // namespace ferry::cli
