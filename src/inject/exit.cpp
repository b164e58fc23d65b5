// How a recorded process ends: one exit phase, the exit protocol's only state (with the status its X line
// will carry), and every way out.
//
// The phase only moves forward (a compare-and-swap; a way out that finds it further on does less):
//
//   running --> closed --> terminating --> finishing --> exited
//
// A way out may skip phases (SIGTERM goes from running to terminating, _exit to finishing); a fork child
// starts again at running.
//
// - running:     the program runs; CUPTI starts and stops with the capture window.
// - closed:      main returned or exit() or quick_exit() was called: CUPTI is stopped for good
//                (cupti_close: its records flushed, forced, and written; no window starts it again),
//                because the exit handlers come next and the CUDA runtime's teardown is among them (a
//                statically linked cudart registers it after cuInit); a CUPTI call after it crashes the
//                process (cuptiActivityDisable, SIGSEGV, on an H200). The writer goes on flushing the CPU
//                side meanwhile.
// - terminating: SIGTERM's handler parks its thread and has woken the writer to finish.
// - finishing:   one thread, the winner of the move here, writes the last batch and the X line.
// - exited:      the X line is written (or given up): nothing of the recording is touched again; a second
//                way out that was waiting for it goes on.
//
// Each way out: what is written (X: the exit line, by whom and with what status), what becomes of CUPTI,
// and what it may do inside a signal handler.
//
// | way out              | records and X line             | CUPTI                    | signal-safety     |
// |----------------------|--------------------------------|--------------------------|-------------------|
// | return from main     | all, the exit handlers' too; X | closed when main returns | not in a handler  |
// |                      | by ferry's exit handler (the   | (closed), before the     |                   |
// |                      | last; finishing), main's value | exit handlers            |                   |
// | exit(n), interposed  | as return from main; X n       | closed inside exit(),    | as glibc's exit:  |
// |                      |                                | before the exit handlers | none              |
// | quick_exit(n),       | as exit(n), the at_quick_exit  | as exit(n)               | as exit(n)        |
// | interposed           | handlers for the exit handlers |                          |                   |
// | glibc's own exit     | all; X by ferry's exit handler | abandoned there: no CUPTI| not in a handler  |
// | (errx, error), which | (running to finishing), -1:    | call (CUDA may be torn   |                   |
// | no preload sees      | the status is unknown          | down), records not yet   |                   |
// |                      |                                | delivered lost, noted    |                   |
// |                      |                                | (cupti_abandoned)        |                   |
// | pthread_exit in main | as exit(0), which the writer   | as exit(0)               | not in a handler  |
// |                      | calls when it is the last      |                          |                   |
// |                      | thread left; X 0               |                          |                   |
// | _exit(n), _Exit(n)   | all, if the file's lock comes  | left as it is (no exit   | waits 50 ms at    |
// | (os._exit,           | free within 50 ms (else none); | handler follows): the GPU| most for a lock,  |
// | multiprocessing's    | X n by _exit itself            | records since the        | calls no CUPTI but|
// | workers, fork child) | (finishing)                    | writer's last flush lost | mallocs the batch |
// | SIGTERM at SIG_DFL   | all, where the writer runs (an | closed by the writer (no | the handler:      |
// | (ferry's handler,    | event or cuInit came), else    | exit handler follows)    | atomics, futex,   |
// | installed only then) | none; X 128+15 by the writer   |                          | kill: async-      |
// |                      | (terminating, finishing); then |                          | signal-safe       |
// |                      | the default action ends it     |                          |                   |
// | SIGKILL, a crash     | up to the writer's last flush  | none                     | -                 |
// |                      | (one interval lost); no X      |                          |                   |
//
// A second way out while one is in progress (two threads' exit(), a SIGTERM during the exit handlers):
// exit() and main's return close CUPTI themselves (cupti::close waits for one in progress), so no exit
// handler runs across a CUPTI call; a blocking way out that finds the X line being written waits for it
// (2 s at most), and SIGTERM's handler does too, then ends the process at once. A vfork child (posix_spawn,
// subprocess) shares its parent's memory and runs no fork handler: it moves nothing (the pid check comes
// before every move).
#include <dlfcn.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdint>
#include <cstdlib>
#include <ctime>
#include <string>

#include "state.hpp"

namespace ferry::inject {
namespace {

enum class exit_phase : int { running, closed, terminating, finishing, exited };

// An int, not an enum, for the futex the writer and SIGTERM's handler wait on.
std::atomic<int> g_phase{static_cast<int>(exit_phase::running)};
static_assert(sizeof(std::atomic<int>) == sizeof(int) && std::atomic<int>::is_always_lock_free);
// The status the process exits with, once a way out has said it (main's return value, exit's argument);
// -1 until then: an exit nobody saw.
std::atomic<int> g_status{-1};

constexpr std::int64_t wait_for_exit_ns = 2'000'000'000;  // SIGTERM's and a second way out's wait

exit_phase phase() noexcept { return static_cast<exit_phase>(g_phase.load()); }

// Moves the phase forward to `to`, if not past it already; returns the phase it found.
exit_phase advance(exit_phase to) noexcept {
  int now = g_phase.load();
  while (now < static_cast<int>(to) && !g_phase.compare_exchange_weak(now, static_cast<int>(to))) {
  }
  return static_cast<exit_phase>(now);
}

int* futex_word() noexcept { return reinterpret_cast<int*>(&g_phase); }  // NOLINT: the atomic's int

void wake_waiters() noexcept {
  syscall(SYS_futex, futex_word(), FUTEX_WAKE_PRIVATE, INT32_MAX, nullptr, nullptr, 0);
}

// Waits until the phase is no longer `seen`, or `ns` passed (async-signal-safe).
void wait_while(int seen, std::int64_t ns) noexcept {
  timespec ts{static_cast<time_t>(ns / 1'000'000'000), static_cast<long>(ns % 1'000'000'000)};
  syscall(SYS_futex, futex_word(), FUTEX_WAIT_PRIVATE, seen, &ts, nullptr, 0);
}

std::int64_t monotonic_ns() noexcept {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

// Waits for the X line (exited), 2 s at most: the writer of it may be stuck, or be this very thread.
void wait_for_exited() noexcept {
  const std::int64_t end = monotonic_ns() + wait_for_exit_ns;
  for (int p = g_phase.load(); p != static_cast<int>(exit_phase::exited); p = g_phase.load()) {
    const std::int64_t left = end - monotonic_ns();
    if (left <= 0) return;
    wait_while(p, left);
  }
}

// This process's state: nullptr in a vfork child (whose memory, the parent's, must not be written) and
// where the process does not record.
process_state* own_state() noexcept { return in_recorded_process() ? state() : nullptr; }

// finishing: the last batch and the X line, by the first thread here. `may_block` false (_exit, which
// signal handlers call): CUPTI is left alone and nothing is written when the file's lock stays taken.
void finish(process_state& s, int status, bool may_block) noexcept {
  if (advance(exit_phase::finishing) >= exit_phase::finishing) {
    if (may_block) wait_for_exited();
    return;
  }
  const own_call own;
  if (may_block) cupti_close(s);  // flushes CUPTI's buffers (forced: the program's work is done), disables it
  write_last(s, status, may_block);
  g_phase.store(static_cast<int>(exit_phase::exited));
  wake_waiters();
}

// _exit: finishing without waiting (nothing runs after it), then the process ends.
[[noreturn]] void exit_now(int status) noexcept {
  if (process_state* s = own_state()) finish(*s, status & 0xff, false);
  syscall(SYS_exit_group, status);
  __builtin_unreachable();
}

// closed: CUPTI stopped for good while CUDA is still up; `status` (the first way out's) is the one X
// will carry. cupti_close is called even where another thread closed first: it waits for that close.
void close_for_exit(int status) noexcept {
  process_state* s = own_state();
  if (s == nullptr) return;
  int unknown = -1;
  g_status.compare_exchange_strong(unknown, status & 0xff);
  advance(exit_phase::closed);
  const own_call own;
  cupti_close(*s);
}

// exit() and quick_exit(): closed, then libc's `real` one, which runs the handlers.
[[noreturn]] void close_then(int status, void (*real)(int)) noexcept {
  close_for_exit(status);
  if (real != nullptr) real(status);
  syscall(SYS_exit_group, status);
  __builtin_unreachable();
}

// The last exit handler (registered at load, before the program's): a return from main, exit(),
// quick_exit() or a pthread_exit main, which closed CUPTI; or glibc's own exit (errx, error), which only
// this sees: CUDA's teardown may have run, so CUPTI's trace is dropped without a CUPTI call.
void at_exit() {
  process_state* s = own_state();
  if (s == nullptr) return;
  if (advance(exit_phase::closed) < exit_phase::closed) cupti_abandon(*s);
  finish(*s, g_status.load(), true);
}

// SIGTERM at its default disposition: the writer flushes and writes the exit, woken at once, while this
// handler waits (2 s at most, so a stuck writer cannot keep the process alive); then the signal ends the
// process as the default would have. The waiting thread does not return into the program in between.
void on_sigterm(int) {
  const process_state* s = existing_state();
  if (s != nullptr && s->writer_started.load() && s->pid == static_cast<pid_t>(syscall(SYS_getpid))) {
    if (advance(exit_phase::terminating) < exit_phase::terminating) wake_waiters();
    wait_for_exited();
  }
  std::signal(SIGTERM, SIG_DFL);
  syscall(SYS_kill, syscall(SYS_getpid), SIGTERM);
}

// True when the program's threads have all ended and only this one (the writer) is left: the thread-group
// leader is a zombie (main called pthread_exit) and the process counts two threads, that zombie and the
// writer. Without the writer, glibc would then have ended the process as exit(0) does; the writer's thread
// alone would keep it alive for ever.
bool only_the_writer_is_left() noexcept {
  try {
    const std::string stat = read_small("/proc/self/stat");
    const std::size_t close = stat.rfind(')');  // after the command name, which may hold spaces
    if (close == std::string::npos) return false;
    std::size_t at = close + 2;  // field 3, the state
    if (at >= stat.size() || stat[at] != 'Z') return false;
    for (int field = 3; field < 20; ++field) {  // to field 20, num_threads
      at = stat.find(' ', at);
      if (at == std::string::npos) return false;
      ++at;
    }
    return std::strtol(stat.c_str() + at, nullptr, 10) == 2;
  } catch (...) {
    return false;  // out of memory: asked again at the next flush
  }
}

}  // namespace

void install_exit_handlers() noexcept {
  std::atexit(at_exit);
  std::at_quick_exit(at_exit);
  struct sigaction old {};
  if (sigaction(SIGTERM, nullptr, &old) == 0 && old.sa_handler == SIG_DFL) {
    struct sigaction sa {};
    sa.sa_handler = on_sigterm;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    sigaction(SIGTERM, &sa, nullptr);
  }
}

void exit_after_fork() noexcept {
  g_phase.store(static_cast<int>(exit_phase::running));
  g_status.store(-1);
}

bool exit_begun() noexcept { return phase() >= exit_phase::closed; }

void writer_sleep(std::int64_t ns) noexcept {
  const int seen = g_phase.load();
  if (seen != static_cast<int>(exit_phase::terminating)) wait_while(seen, ns);
}

bool writer_must_stop(process_state& s) noexcept {
  const exit_phase p = phase();
  if (p >= exit_phase::finishing) return true;
  if (p == exit_phase::terminating) {
    finish(s, 128 + SIGTERM, true);
    return true;  // SIGTERM's handler ends the process
  }
  if (only_the_writer_is_left()) {  // as glibc at the last thread's end: exit(0), handlers included
    become_program_thread();
    std::exit(0);  // NOLINT(concurrency-mt-unsafe): no other thread of the program is left
  }
  return false;
}

}  // namespace ferry::inject

// The ways out that libc gives a program. _exit and _Exit skip the exit handlers: os._exit
// (multiprocessing's workers end so), a fork child's end.
FERRY_INJECT_EXPORT void _exit(int status) { ferry::inject::exit_now(status); }

FERRY_INJECT_EXPORT void _Exit(int status) { ferry::inject::exit_now(status); }

/// exit(): CUPTI stopped here, while CUDA is still up; the exit handlers then run, ferry's last.
FERRY_INJECT_EXPORT void exit(int status) {
  static const auto real = reinterpret_cast<void (*)(int)>(dlsym(RTLD_NEXT, "exit"));
  ferry::inject::close_then(status, real);
}

/// quick_exit(): as exit(), its handlers the at_quick_exit ones (glibc ends it with an _exit of its own,
/// which no preload sees).
FERRY_INJECT_EXPORT void quick_exit(int status) {
  static const auto real = reinterpret_cast<void (*)(int)>(dlsym(RTLD_NEXT, "quick_exit"));
  ferry::inject::close_then(status, real);
}

namespace {
using main_fn = int (*)(int, char**, char**);
main_fn g_real_main = nullptr;
// main's return: libc then calls exit() from inside itself, past the interposed one.
int wrapped_main(int argc, char** argv, char** envp) {
  const int status = g_real_main(argc, argv, envp);
  ferry::inject::close_for_exit(status);
  return status;
}
}  // namespace

/// The program's start: its main is wrapped so that its return is seen, with its value.
// NOLINTNEXTLINE(bugprone-reserved-identifier): glibc's entry point, interposed
FERRY_INJECT_EXPORT int __libc_start_main(main_fn main, int argc, char** argv, void (*init)(), void (*fini)(),
                                          void (*rtld_fini)(), void* stack_end) {
  using start_fn = int (*)(main_fn, int, char**, void (*)(), void (*)(), void (*)(), void*);
  void* p = dlvsym(RTLD_NEXT, "__libc_start_main", "GLIBC_2.34");
  if (p == nullptr) p = dlsym(RTLD_NEXT, "__libc_start_main");
  const auto real = reinterpret_cast<start_fn>(p);
  g_real_main = main;
  return real(ferry::inject::config().active ? wrapped_main : main, argc, argv, init, fini, rtld_fini,
              stack_end);
}
