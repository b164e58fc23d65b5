// `ferry trace`'s injection library, libferry_inject.so: one library in three roles. The launcher puts it
// in LD_PRELOAD (the CPU side: blocking calls, fork and exit handling; os_calls.cpp), in
// NVTX_INJECTION64_PATH (NVTX ranges in every process, CUDA or not; nvtx.cpp) and in
// CUDA_INJECTION64_PATH (CUPTI, from inside the process's first cuInit; cuda.cpp).
//
// The life of a process's recording:
// - An exec'd program image makes its state in the library's constructor: it opens
//   <dir>/<pid>-<start ticks>-<image>.ferry-proc and writes the P line. The constructor never touches
//   CUDA.
// - A fork child inherits the parent's memory but not its threads. Its pthread_atfork handler forgets
//   the parent's state (so none of the parent's buffered events are written twice) and makes the child's
//   own state and file. A child that then execs (subprocess with fork) has two images of one process, each
//   with its file; vfork children (posix_spawn, subprocess's default) run no fork handler and write only
//   their new image's.
// - Events go into the process's trace::recorder. A writer thread, started at the first event, appends
//   them to the file every flush interval (50 ms), so a process killed with SIGKILL loses at most one
//   interval, and polls the capture switch file.
// - The process ends through one of the ways out of exit.cpp (return from main, exit, glibc's own exit,
//   a pthread_exit main, _exit, SIGTERM, SIGKILL), whose table says what each writes; all but SIGKILL
//   write the last events and the X line, CUPTI stopped before the CUDA runtime's teardown.
#include <fcntl.h>
#include <pthread.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>

#include "ferry/trace/inject.h"
#include "ferry/trace/process_trace.hpp"
#include "state.hpp"

namespace ferry::inject {

namespace {

thread_local bool t_in_ferry = false;
sigset_t g_program_mask;  // the signal mask of the thread that started the writer, which blocks them all

// Never destroyed: the writer thread and CUPTI's threads may read it while the process exits.
settings& g_settings = *new settings;  // NOLINT(cert-err58-cpp): at load, out of memory ends the process
std::atomic<process_state*> g_state{nullptr};
std::atomic<pid_t> g_pid{0};                   // this process's pid, kept current by the fork handler
std::atomic_flag g_making = ATOMIC_FLAG_INIT;  // one state made at a time

std::int64_t clock_ns(clockid_t id) noexcept {
  timespec ts{};
  clock_gettime(id, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

long long env_number(const char* name, long long fallback, long long lo, long long hi) {
  // NOLINTNEXTLINE(concurrency-mt-unsafe): read once, when the library loads
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  char* end = nullptr;
  const long long n = std::strtoll(v, &end, 10);
  if (end == v || *end != '\0' || n < lo || n > hi) return fallback;
  return n;
}

void read_settings() {
  settings& s = g_settings;
  // NOLINTBEGIN(concurrency-mt-unsafe): read once, when the library loads
  const char* dir = std::getenv(FERRY_TRACE_ENV_DIR);
  if (dir == nullptr || *dir == '\0') return;
  s.dir = dir;
  if (const char* c = std::getenv(FERRY_TRACE_ENV_CONTROL)) s.control = c;
  if (const char* c = std::getenv(FERRY_TRACE_ENV_CAPTURE)) s.capture_at_start = std::strcmp(c, "off") != 0;
  if (const char* l = std::getenv(FERRY_TRACE_ENV_LITE)) s.lite = std::strcmp(l, "1") == 0;
  if (const char* y = std::getenv(FERRY_TRACE_ENV_SYNCS)) s.syncs = std::strcmp(y, "0") != 0;
  if (const char* a = std::getenv(FERRY_TRACE_ENV_ALL_CALLS)) s.all_calls = std::strcmp(a, "1") == 0;
  if (const char* d = std::getenv(FERRY_TRACE_ENV_DEFER_CONVERSION))
    s.defer_conversion = std::strcmp(d, "1") == 0;
  if (const char* st = std::getenv(FERRY_TRACE_ENV_STEPS)) {
    long long a = -1, b = -1;
    if (std::sscanf(st, "%lld:%lld", &a, &b) == 2 && a >= 0 && b >= a) {
      s.steps_first = a;
      s.steps_last = b;
    }
  }
  if (const char* n = std::getenv(FERRY_TRACE_ENV_NVTX_CAPTURE); n != nullptr && *n != '\0') {
    const std::string v = n;
    const std::size_t at = v.rfind('@');
    s.nvtx_capture = at == std::string::npos ? v : v.substr(0, at);
    s.nvtx_capture_domain = at == std::string::npos ? "" : v.substr(at + 1);
  }
  // NOLINTEND(concurrency-mt-unsafe)
  s.block_ns =
      env_number(FERRY_TRACE_ENV_BLOCK_US, FERRY_TRACE_DEFAULT_BLOCK_US, 1, FERRY_TRACE_MAX_BLOCK_US) * 1000;
  s.flush_ns =
      env_number(FERRY_TRACE_ENV_FLUSH_MS, FERRY_TRACE_DEFAULT_FLUSH_MS, 1, FERRY_TRACE_MAX_FLUSH_MS) *
      1'000'000;
  s.active = true;
}

// Writes all of `data` with the raw system call (ferry's own writes are not the program's).
void write_all(int fd, std::string_view data) noexcept {
  while (!data.empty()) {
    const long n = syscall(SYS_write, fd, data.data(), data.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // the disk is full or the file is gone: the recording stops, the program goes on
    data.remove_prefix(static_cast<std::size_t>(n));
  }
}

}  // namespace

std::string read_small(const char* path) {
  std::string out;
  const int fd = static_cast<int>(syscall(SYS_openat, AT_FDCWD, path, O_RDONLY | O_CLOEXEC));
  if (fd < 0) return out;
  char buf[4096];
  for (;;) {
    const long n = syscall(SYS_read, fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    out.append(buf, static_cast<std::size_t>(n));
    if (out.size() > (1u << 20)) break;
  }
  syscall(SYS_close, fd);
  return out;
}

namespace {

// Fields 4 (ppid) and 22 (start time in clock ticks) of /proc/self/stat.
void read_stat(std::uint64_t& ppid, std::uint64_t& start) {
  trace::proc_stat st;
  if (!trace::parse_proc_stat(read_small("/proc/self/stat"), st)) return;
  ppid = st.ppid;
  start = st.start_ticks;
}

void keep_file_identity(process_state& s) {
  struct stat st {};
  if (fstat(s.fd, &st) == 0) {
    s.file_dev = st.st_dev;
    s.file_ino = st.st_ino;
  }
}

// The program may close every descriptor (a daemon, subprocess's close_fds) and open others in their
// place: ferry writes only while its descriptor is still its file, else it opens the file again.
bool file_is_ours(process_state& s) noexcept {
  struct stat st {};
  if (s.fd >= 0 && fstat(s.fd, &st) == 0 && st.st_dev == s.file_dev && st.st_ino == s.file_ino) return true;
  const int fd =
      static_cast<int>(syscall(SYS_openat, AT_FDCWD, s.path.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC));
  if (fd < 0) return false;
  // A high descriptor number, which a program that closed its descriptors will not reuse soon.
  const int high = fcntl(fd, F_DUPFD_CLOEXEC, 900);
  if (high >= 0) {
    syscall(SYS_close, fd);
    s.fd = high;
  } else {
    s.fd = fd;
  }
  keep_file_identity(s);
  return true;
}

// Turns this process's capture on or off (the recorder's switch and CUPTI), noting when the window
// first opened and closed: the steps before it ran unrecorded, which gives the recording's own cost.
void apply_capture(process_state& s, bool on) noexcept {
  const own_call own;
  const std::lock_guard lock(s.capture_mu);
  if (on == s.rec.capturing()) return;
  if (on) {
    s.rec.start();
    s.capture_on.store(true);
    cupti_start(s);
    if (!s.capture_opened) note("capture_on_ns", std::to_string(now_ns()));
    s.capture_opened = true;
  } else {
    s.rec.stop();
    s.capture_on.store(false);
    cupti_stop(s);
    if (s.capture_opened && !s.capture_closed) note("capture_off_ns", std::to_string(now_ns()));
    s.capture_closed = true;
  }
}

void writer_loop(process_state* s) {
  const own_call own;
  trace::name_this_thread("ferry trace");
  std::string last_control;
  for (;;) {
    writer_sleep(g_settings.flush_ns);
    // Done once the process writes its exit: nothing of it may be touched while it tears down.
    if (s->pid != g_pid.load(std::memory_order_relaxed) || writer_must_stop(*s)) return;
    if (!g_settings.control.empty()) {
      std::string c = read_small(g_settings.control.c_str());
      if (c != last_control) {
        last_control = c;
        apply_capture(*s, c.starts_with("on"));
      }
    }
    // CUPTI's completed buffers only: a forced flush returns records of work still running without
    // their times, and those are lost (measured: most long kernels of a step). A process killed with
    // SIGKILL loses the GPU records of its buffer in flight.
    flush(*s, false);
  }
}

process_state* make_state(bool forked) noexcept;

void on_fork_child() {
  // The only thread of the child: forget the parent's state (its buffers stay unwritten here) and its
  // writer, which did not come along.
  g_pid.store(static_cast<pid_t>(syscall(SYS_getpid)), std::memory_order_relaxed);
  g_state.store(nullptr, std::memory_order_relaxed);
  g_making.clear();
  exit_after_fork();
  os_calls_after_fork();
  nvtx_after_fork();
  // Its file now, so that a child killed before its first event (a worker blocked in a queue) is still
  // in the recording. glibc's malloc is safe to use in a fork child; the writer thread waits for an event.
  make_state(true);
}

process_state* make_state(bool forked) noexcept {
  while (g_making.test_and_set(std::memory_order_acquire)) {
  }
  process_state* s = g_state.load(std::memory_order_acquire);
  if (s == nullptr || s->pid != g_pid.load(std::memory_order_relaxed)) {
    try {
      const own_call own;
      s = new process_state(forked);
      if (s->fd < 0) s = nullptr;  // leaked: the recording of this process is off
    } catch (...) {
      s = nullptr;
    }
    // NOLINTNEXTLINE(clang-analyzer-cplusplus.NewDeleteLeaks): a state without a file is left, not freed
    if (s != nullptr) g_state.store(s, std::memory_order_release);
  }
  g_making.clear(std::memory_order_release);
  return s;
}

void load() noexcept {
  const int saved = errno;
  try {
    read_settings();
  } catch (...) {
    g_settings.active = false;  // out of memory reading the environment: this process does not record
  }
  if (!g_settings.active) return;
  g_pid.store(static_cast<pid_t>(syscall(SYS_getpid)));
  pthread_atfork(nullptr, nullptr, on_fork_child);
  install_exit_handlers();
  make_state(false);
  errno = saved;
}

// When the library loads: after the globals above are initialized (a TU initializes in order; a
// constructor function could run before them).
const bool g_loaded = (load(), true);  // NOLINT(cert-err58-cpp): load() is noexcept

}  // namespace

process_state::process_state(bool forked) : rec(std::size_t{1} << 18) {
  pid = g_pid.load(std::memory_order_relaxed);
  trace::process_header h;
  h.pid = static_cast<std::uint64_t>(pid);
  read_stat(h.ppid, h.start_ticks);
  h.monotonic_ns = clock_ns(CLOCK_MONOTONIC);
  h.realtime_ns = clock_ns(CLOCK_REALTIME);
  h.started = forked ? "fork" : "exec";
  char exe[4096];
  const long n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n > 0) h.exe.assign(exe, static_cast<std::size_t>(n));
  h.command = read_small("/proc/self/cmdline");
  while (!h.command.empty() && h.command.back() == '\0') h.command.pop_back();
  for (char& c : h.command)
    if (c == '\0') c = ' ';
  for (int image = 0; image < 64 && fd < 0; ++image) {
    path = g_settings.dir + "/" + std::to_string(h.pid) + "-" + std::to_string(h.start_ticks) + "-" +
           std::to_string(image) + std::string(trace::process_file_suffix);
    fd = static_cast<int>(syscall(SYS_openat, AT_FDCWD, path.c_str(),
                                  O_WRONLY | O_CREAT | O_EXCL | O_APPEND | O_CLOEXEC, 0644));
    if (fd < 0 && errno != EEXIST) return;
  }
  if (fd < 0) return;
  const int high = fcntl(fd, F_DUPFD_CLOEXEC, 900);
  if (high >= 0) {
    syscall(SYS_close, fd);
    fd = high;
  }
  keep_file_identity(*this);
  write_all(fd, trace::format_process_header(h));
  // The switch file says where the window is now (a process started after it opened, or a fork child);
  // the environment only says how the recording began.
  bool on = g_settings.capture_at_start;
  if (!g_settings.control.empty()) {
    const std::string c = read_small(g_settings.control.c_str());
    if (!c.empty()) on = c.starts_with("on");
  }
  if (on) {
    rec.start();
    capture_on.store(true);
  }
}

const settings& config() noexcept { return g_settings; }

void start_writer(process_state& s) noexcept {
  if (s.writer_started.exchange(true)) return;
  // Every signal blocked in the writer (it inherits the mask it is created with): the program's signals
  // stay the program's threads'.
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  g_program_mask = old;
  try {
    std::thread(writer_loop, &s).detach();
  } catch (...) {
    // No thread: the events are written at exit only.
  }
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
}

bool capturing() noexcept {
  const process_state* s = g_state.load(std::memory_order_acquire);
  return s != nullptr && s->capture_on.load(std::memory_order_relaxed);
}

process_state* state() noexcept {
  if (!g_settings.active) return nullptr;
  process_state* s = g_state.load(std::memory_order_acquire);
  if (s != nullptr && s->pid == g_pid.load(std::memory_order_relaxed)) return s;
  return make_state(true);
}

process_state* existing_state() noexcept {
  if (!g_settings.active) return nullptr;
  process_state* s = g_state.load(std::memory_order_acquire);
  return s != nullptr && s->pid == g_pid.load(std::memory_order_relaxed) ? s : nullptr;
}

bool in_recorded_process() noexcept {
  return g_settings.active && syscall(SYS_getpid) == g_pid.load(std::memory_order_relaxed);
}

void become_program_thread() noexcept {
  // The program's exit handlers run on it next: with the program's signal mask (a child they start
  // inherits it) and as the program's code, not ferry's.
  pthread_sigmask(SIG_SETMASK, &g_program_mask, nullptr);
  t_in_ferry = false;
}

bool in_ferry() noexcept { return t_in_ferry; }

own_call::own_call() noexcept : previous_(t_in_ferry) { t_in_ferry = true; }
own_call::~own_call() { t_in_ferry = previous_; }

std::int64_t now_ns() noexcept { return clock_ns(CLOCK_MONOTONIC); }

void record(const trace::event& e, bool always) noexcept {
  process_state* s = state();
  if (s == nullptr) return;
  if (always)
    s->rec.record_late(e);
  else
    s->rec.record(e);
  if (!s->writer_started.load(std::memory_order_relaxed)) start_writer(*s);
}

std::uint32_t intern(std::string_view text) noexcept {
  process_state* s = state();
  if (s == nullptr) return 0;
  try {
    const own_call own;
    return s->rec.intern(text);
  } catch (...) {
    return 0;
  }
}

void note(std::string_view key, std::string_view value) noexcept {
  process_state* s = state();
  if (s == nullptr) return;
  try {
    const own_call own;
    const std::lock_guard lock(s->write_mu);
    if (file_is_ours(*s)) write_all(s->fd, trace::format_process_note(key, value));
  } catch (...) {
  }
}

namespace {
// Writes what was recorded; write_mu held.
void write_batch(process_state& s) noexcept {
  try {
    drain_os_calls(s);
    const trace::timeline t = s.rec.take("", "");
    std::string out;
    s.writer.append(t, out);
    if (!out.empty() && file_is_ours(s)) write_all(s.fd, out);
  } catch (...) {
    // Out of memory: this batch is lost, the recording goes on.
  }
}
}  // namespace

void flush(process_state& s, bool cupti_forced) noexcept {
  const own_call own;
  if (s.cupti_on.load()) cupti_flush(s, cupti_forced);
  const std::lock_guard lock(s.write_mu);
  write_batch(s);
}

namespace {
// _exit's wait for the file, which a signal handler may call having interrupted a thread inside a flush or
// a note (the writer's signals are blocked): that lock is never freed, the writer's flush frees it within
// microseconds. 50 ms at most, in raw sleeps.
bool lock_soon(std::unique_lock<std::mutex>& lock) noexcept {
  for (int ms = 0; ms < 50; ++ms) {
    if (lock.try_lock()) return true;
    timespec ts{0, 1'000'000};
    syscall(SYS_nanosleep, &ts, nullptr);
  }
  return false;
}
}  // namespace

void write_last(process_state& s, int status, bool may_block) noexcept {
  const own_call own;
  std::unique_lock lock(s.write_mu, std::defer_lock);
  if (may_block)
    lock.lock();
  else if (!lock_soon(lock))
    return;
  write_batch(s);
  if (file_is_ours(s)) write_all(s.fd, trace::format_process_exit(now_ns(), status));
}

void set_capture(bool on) noexcept {
  const settings& c = g_settings;
  // This process at once (a step window opens between two steps, however short); the others at their
  // writer's next poll of the switch file.
  if (process_state* s = state()) apply_capture(*s, on);
  if (c.control.empty()) return;
  const own_call own;
  // Replaced whole (a new file renamed over the old), so a reader never sees half of it.
  const std::string tmp = c.control + "." + std::to_string(g_pid.load());
  const int fd = static_cast<int>(
      syscall(SYS_openat, AT_FDCWD, tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (fd < 0) return;
  write_all(fd, on ? "on\n" : "off\n");
  syscall(SYS_close, fd);
  if (std::rename(tmp.c_str(), c.control.c_str()) != 0) std::remove(tmp.c_str());
}

}  // namespace ferry::inject

using ferry::inject::config;

/// 1 when this process records (ferry trace started it), else 0.
FERRY_INJECT_EXPORT int ferry_inject_recording(void) { return ferry::inject::state() != nullptr ? 1 : 0; }

/// A finished range on the calling thread; times on CLOCK_MONOTONIC (Python's time.monotonic_ns()).
FERRY_INJECT_EXPORT void ferry_inject_range(const char* name, const char* domain, long long start_ns,
                                            long long end_ns) {
  if (name == nullptr || end_ns < start_ns) return;
  ferry::trace::event e;
  e.kind = ferry::trace::activity::range;
  e.start_ns = start_ns;
  e.end_ns = end_ns;
  e.thread = ferry::trace::this_thread_id();
  e.name = ferry::inject::intern(name);
  e.domain = domain != nullptr ? ferry::inject::intern(domain) : 0;
  ferry::inject::record(e);
}

/// Training step `index` spanning [start_ns, end_ns] on the calling thread: a "step <index>" range kept
/// whatever the capture switch says (the step rate before and during capture gives the recording's own
/// cost), and the --steps A:B window.
FERRY_INJECT_EXPORT void ferry_inject_step(long long index, long long start_ns, long long end_ns) {
  if (index < 0 || end_ns < start_ns) return;
  ferry::trace::event e;
  e.kind = ferry::trace::activity::range;
  e.start_ns = start_ns;
  e.end_ns = end_ns;
  e.thread = ferry::trace::this_thread_id();
  e.name = ferry::inject::intern("step " + std::to_string(index));
  e.domain = ferry::inject::intern("ferry.python");
  ferry::inject::record(e, true);
  const auto& c = config();
  if (c.steps_first < 0) return;
  if (index + 1 == c.steps_first) ferry::inject::set_capture(true);
  if (index == c.steps_last) ferry::inject::set_capture(false);
}
