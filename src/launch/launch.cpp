// ferry::launch (include/ferry/launch/launch.hpp): `ferry trace`'s launcher. The settings reach the
// recorded processes through the environment names of include/ferry/trace/inject.h.
#include "ferry/launch/launch.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "ferry/core/text.hpp"
#include "ferry/trace/process_trace.hpp"

namespace ferry::launch {
namespace {

namespace fs = std::filesystem;

volatile sig_atomic_t g_child = 0;
volatile sig_atomic_t g_stop_waiting = 0;
volatile sig_atomic_t g_primary_done = 0;

// A signal sent to the launcher alone (kill, a job scheduler) goes on to CMD; one from the terminal
// (SI_KERNEL) has reached CMD's process group already. After CMD exited, it stops the wait for the rest.
void on_signal(int sig, siginfo_t* info, void*) {
  if (g_primary_done != 0) {
    g_stop_waiting = 1;
    return;
  }
  if (info != nullptr && info->si_code <= 0 && g_child > 0) kill(static_cast<pid_t>(g_child), sig);
}

std::string getenv_or(const char* name) {
  // NOLINTNEXTLINE(concurrency-mt-unsafe): nothing in ferry changes the environment
  const char* v = std::getenv(name);
  return v != nullptr ? v : "";
}

// Why execvp could not run `name`, checked before anything is made or recorded; empty when it can. Looks as
// execvp does: a name with a slash as given, else in each folder of PATH (/bin:/usr/bin when PATH is
// unset). `status` is then what a shell exits with: 127 not found, 126 found but not executable.
std::string why_not_runnable(const std::string& name, int& status) {
  const auto check = [](const fs::path& p) -> int {  // 0: runnable, else an errno value
    struct stat st {};
    if (::stat(p.c_str(), &st) != 0) return errno;
    if (S_ISDIR(st.st_mode)) return EISDIR;
    return ::access(p.c_str(), X_OK) == 0 ? 0 : errno;
  };
  const auto words = [](int err) { return std::error_code(err, std::generic_category()).message(); };
  if (name.empty()) {  // execvp("") fails with ENOENT
    status = 127;
    return words(ENOENT);
  }
  if (name.find('/') != std::string::npos) {
    const int err = check(name);
    if (err == 0) return {};
    status = err == ENOENT ? 127 : 126;  // as a shell: "Not a directory", "Permission denied" are 126
    return words(err);
  }
  const char* env = std::getenv("PATH");  // NOLINT(concurrency-mt-unsafe): read before any thread starts
  const std::string path = env != nullptr ? env : "/bin:/usr/bin";
  int found = 0;  // the error of a PATH entry that cannot run (or be searched): execvp's EACCES
  std::size_t from = 0;
  for (;;) {
    const std::size_t colon = path.find(':', from);
    const std::string folder =
        path.substr(from, colon == std::string::npos ? std::string::npos : colon - from);
    const int err = check(fs::path(folder.empty() ? "." : folder) / name);
    if (err == 0) return {};
    if (err != ENOENT && err != ENOTDIR) found = err;
    if (colon == std::string::npos) break;
    from = colon + 1;
  }
  status = found != 0 ? 126 : 127;
  return found != 0 ? words(found) + " (searching PATH)" : "not found on PATH";
}

void write_control(const fs::path& control, bool on) {
  const fs::path tmp = control.string() + ".launcher";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << (on ? "on\n" : "off\n");
  }
  std::error_code ec;
  fs::rename(tmp, control, ec);
}

// Per-process CPU use from /proc, for the processes that have a file in the session directory.
class sampler {
 public:
  sampler(fs::path dir, std::ofstream& out) : dir_(std::move(dir)), out_(out) {
    out_ << "ferry-cpu-samples 1\n";
    ticks_per_s_ = static_cast<double>(sysconf(_SC_CLK_TCK));
  }

  void sample(std::int64_t now_ns) {
    // The session's processes: the file names (pid-start-image), listed again each time.
    std::set<std::pair<std::uint64_t, std::uint64_t>> procs;
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(dir_, ec)) {
      unsigned long long pid = 0, start = 0;
      unsigned image = 0;
      if (std::sscanf(e.path().filename().c_str(), "%llu-%llu-%u.ferry-proc", &pid, &start, &image) == 3)
        procs.insert({pid, start});
    }
    for (const auto& [pid, start] : procs) {
      if (gone_.contains({pid, start})) continue;
      std::uint64_t ticks = 0, start_now = 0;
      std::uint32_t threads = 0;
      if (!read_stat(fmt::format("/proc/{}/stat", pid), ticks, start_now, threads) || start_now != start) {
        gone_.insert({pid, start});
        continue;
      }
      // Running threads: each thread's state.
      std::uint32_t running = 0;
      for (const auto& te : fs::directory_iterator(fmt::format("/proc/{}/task", pid), ec)) {
        std::uint64_t t2 = 0, s2 = 0;
        std::uint32_t n2 = 0;
        char state = 0;
        if (read_stat((te.path() / "stat").string(), t2, s2, n2, &state) && state == 'R') ++running;
      }
      auto& prev = last_[{pid, start}];
      const bool first_reading = prev.first == 0;
      double cores = 0;
      if (!first_reading && now_ns > prev.first)
        cores = static_cast<double>(ticks - std::min(ticks, prev.second)) / ticks_per_s_ /
                (static_cast<double>(now_ns - prev.first) * 1e-9);
      prev = {now_ns, ticks};
      if (first_reading) continue;  // the baseline of the next sample, not a sample
      out_ << fmt::format("C {} {} {} {} {} {}\n", now_ns, pid, start,
                          static_cast<std::uint64_t>(std::llround(std::max(0.0, cores) * 1000.0)), running,
                          threads);
    }
    out_.flush();
  }

 private:
  static bool read_stat(const std::string& path, std::uint64_t& ticks, std::uint64_t& start,
                        std::uint32_t& threads, char* state = nullptr) {
    const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return false;
    char buf[1024];
    const ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return false;
    buf[n] = '\0';
    trace::proc_stat st;
    if (!trace::parse_proc_stat(std::string_view(buf, static_cast<std::size_t>(n)), st)) return false;
    ticks = st.cpu_ticks;
    threads = static_cast<std::uint32_t>(st.threads);
    start = st.start_ticks;
    if (state != nullptr) *state = st.state;
    return true;
  }

  fs::path dir_;
  std::ofstream& out_;
  double ticks_per_s_ = 100;
  std::map<std::pair<std::uint64_t, std::uint64_t>, std::pair<std::int64_t, std::uint64_t>> last_;
  std::set<std::pair<std::uint64_t, std::uint64_t>> gone_;
};

std::int64_t monotonic_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

double cpu_seconds_self() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
         static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1e-6;
}

// Prepends `value` to the colon-separated list in `name`.
void prepend_env(const char* name, const std::string& value) {
  const std::string old = getenv_or(name);
  const std::string v = old.empty() ? value : value + ":" + old;
  ::setenv(name, v.c_str(), 1);  // NOLINT(concurrency-mt-unsafe): the child, before exec, one thread
}

}  // namespace

result launch(const options& f, const std::function<void(const std::string&)>& note) {
  if (f.command.empty())
    throw options_error("ferry trace: no command given; usage: ferry trace [options] -- CMD ARGS...");
  const std::string injected = getenv_or("CUDA_INJECTION64_PATH");
  const fs::path& lib = f.inject_library;
  if (lib.empty()) throw options_error("ferry trace: no injection library given (options::inject_library)");
  if (!injected.empty() && fs::path(injected) != lib)
    throw options_error(
        fmt::format("ferry trace: CUDA_INJECTION64_PATH is already set ({}): another tool (Nsight Systems, a "
                    "profiler daemon) "
                    "injects into this program; CUDA has one injection library per process, so ferry cannot "
                    "record it; unset it",
                    escape_control(injected)));
  if (f.duration_s > 0 && f.capture_range != "none")
    throw options_error("ferry trace: --duration and --capture-range cannot be combined");
  if (f.lite && f.all_calls)
    throw options_error(
        "ferry trace: --all-runtime-calls and --lite cannot be combined: --lite records no runtime call");
  if ((f.capture_range == "nvtx") != !f.nvtx_capture.empty())
    throw options_error("ferry trace: --capture-range nvtx and --nvtx-capture NAME[@DOMAIN] go together");
  long long first = -1, last = -1;
  if (!f.steps.empty()) {
    const std::string& st = f.steps;
    const std::size_t colon = st.find(':');
    const auto parse = [](std::string_view text, long long& v) {
      const auto [p, e] = std::from_chars(text.data(), text.data() + text.size(), v);
      return e == std::errc{} && p == text.data() + text.size();
    };
    if (colon == std::string::npos || !parse(std::string_view(st).substr(0, colon), first) ||
        !parse(std::string_view(st).substr(colon + 1), last) || first < 0 || last < first)
      throw options_error(
          fmt::format("--steps {}: expected A:B with 0 <= A <= B (the steps to capture, counted from 0)",
                      escape_control(st)));
    if (f.delay_s > 0 || f.duration_s > 0 || f.capture_range != "none")
      throw options_error(fmt::format(
          "--steps {} cannot be combined with {}: each sets the capture window", escape_control(st),
          f.delay_s > 0      ? fmt::format("--delay {}", f.delay_s)
          : f.duration_s > 0 ? fmt::format("--duration {}", f.duration_s)
                             : "--capture-range " + escape_control(f.capture_range)));
    if (!f.python)
      throw options_error(fmt::format(
          "--steps {} needs the Python step ranges, which --python none turns off", escape_control(st)));
  }
  if (f.capture_range != "none" && f.delay_s > 0)
    throw options_error(
        fmt::format("--delay {} cannot be combined with --capture-range {}: each opens the window", f.delay_s,
                    escape_control(f.capture_range)));
  // LD_PRELOAD splits its list at spaces and colons: a path with either would not be preloaded at all.
  if (lib.string().find_first_of(" :") != std::string::npos)
    throw options_error(
        fmt::format("ferry trace: the injection library's path {} holds a space or a colon, which "
                    "LD_PRELOAD cannot take; move it (FERRY_INJECT_LIBRARY names another copy)",
                    escape_control(lib.string())));
  // A command that cannot start is said before the output folder is made or touched.
  result r;
  if (std::string why = why_not_runnable(f.command[0], r.exit_status); !why.empty()) {
    r.why_not_started = std::move(why);
    return r;
  }
  const fs::path dir = fs::absolute(f.output);
  std::error_code ec;
  if (fs::exists(dir, ec)) {
    if (!fs::is_directory(dir, ec))
      throw options_error(fmt::format("-o {}: exists and is not a directory", escape_control(dir.string())));
    if (!fs::is_empty(dir, ec) && !f.force)
      throw options_error(
          fmt::format("-o {}: the directory is not empty; pick another or add --force to replace its "
                      "recording",
                      escape_control(dir.string())));
    for (const auto& e : fs::directory_iterator(dir, ec)) {
      const std::string name = e.path().filename().string();
      if (name.ends_with(trace::process_file_suffix) || name == "samples.ferry-cpu" || name == "trace.json" ||
          name == "capture")
        fs::remove(e.path(), ec);
    }
  } else {
    fs::create_directories(dir, ec);
    if (ec)
      throw options_error(
          fmt::format("-o {}: cannot create it: {}", escape_control(dir.string()), ec.message()));
  }
  const fs::path control = dir / "capture";
  const bool start_on = f.delay_s <= 0 && f.capture_range == "none" && first <= 0;
  write_control(control, start_on);
  const fs::path& site = f.site_dir;

  std::ofstream samples_out(dir / "samples.ferry-cpu", std::ios::trunc);
  sampler samp(dir, samples_out);

  prctl(PR_SET_CHILD_SUBREAPER, 1);
  struct sigaction sa {};
  sa.sa_sigaction = on_signal;
  sa.sa_flags = SA_SIGINFO | SA_RESTART;
  sigemptyset(&sa.sa_mask);
  struct sigaction old_int {
  }, old_term{};
  sigaction(SIGINT, &sa, &old_int);
  sigaction(SIGTERM, &sa, &old_term);

  const std::int64_t t0 = monotonic_ns();
  const double cpu0 = cpu_seconds_self();
  const pid_t child = fork();
  if (child < 0)
    throw std::runtime_error(fmt::format("ferry trace: fork failed: {}",
                                         std::error_code(errno, std::generic_category()).message()));
  if (child == 0) {
    sigaction(SIGINT, &old_int, nullptr);
    sigaction(SIGTERM, &old_term, nullptr);
    // NOLINTBEGIN(concurrency-mt-unsafe): the child, before exec, has one thread
    ::setenv(FERRY_TRACE_ENV_DIR, dir.c_str(), 1);
    ::setenv(FERRY_TRACE_ENV_CONTROL, control.c_str(), 1);
    ::setenv(FERRY_TRACE_ENV_CAPTURE, start_on ? "on" : "off", 1);
    ::setenv(FERRY_TRACE_ENV_LITE, f.lite ? "1" : "0", 1);
    ::setenv(FERRY_TRACE_ENV_SYNCS, f.no_syncs ? "0" : "1", 1);
    ::setenv(FERRY_TRACE_ENV_ALL_CALLS, f.all_calls ? "1" : "0", 1);
    ::setenv(FERRY_TRACE_ENV_BLOCK_US, std::to_string(f.block_us).c_str(), 1);
    ::setenv(FERRY_TRACE_ENV_FLUSH_MS, std::to_string(f.flush_ms).c_str(), 1);
    if (first >= 0) ::setenv(FERRY_TRACE_ENV_STEPS, f.steps.c_str(), 1);
    if (!f.nvtx_capture.empty()) ::setenv(FERRY_TRACE_ENV_NVTX_CAPTURE, f.nvtx_capture.c_str(), 1);
    ::setenv(FERRY_TRACE_ENV_INJECT, lib.c_str(), 1);
    ::setenv("CUDA_INJECTION64_PATH", lib.c_str(), 1);
    ::setenv("NVTX_INJECTION64_PATH", lib.c_str(), 1);
    prepend_env("LD_PRELOAD", lib.string());
    if (!site.empty()) {
      ::setenv(FERRY_TRACE_ENV_PYTHON, "1", 1);
      prepend_env("PYTHONPATH", site.string());
    }
    // NOLINTEND(concurrency-mt-unsafe)
    std::vector<char*> argv;
    argv.reserve(f.command.size() + 1);
    for (const std::string& a : f.command) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execvp(argv[0], argv.data());
    std::fprintf(stderr, "ferry trace: cannot run %s: %s\n", argv[0],
                 std::error_code(errno, std::generic_category()).message().c_str());
    _exit(127);
  }
  g_child = child;

  int status = 0;
  bool primary_done = false;
  bool told_wait = false;
  std::int64_t primary_done_ns = 0;
  const std::int64_t period = f.sample_ms * 1'000'000;
  std::int64_t next_sample = t0;
  bool window_opened = start_on, window_closed = false;
  for (;;) {
    // Reap every child that ended: CMD, and descendants re-parented to the subreaper.
    for (;;) {
      int st = 0;
      const pid_t p = waitpid(-1, &st, WNOHANG);
      if (p <= 0) break;
      if (p == child) {
        status = st;
        primary_done = true;
        primary_done_ns = monotonic_ns();
        g_primary_done = 1;
      }
    }
    errno = 0;
    if (primary_done) {
      // Are descendants left? waitpid says ECHILD when none.
      int st = 0;
      const pid_t p = waitpid(-1, &st, WNOHANG);
      if (p < 0 && errno == ECHILD) break;
      if (g_stop_waiting != 0) {
        note("stopped waiting for the remaining processes");
        break;
      }
      if (static_cast<double>(monotonic_ns() - primary_done_ns) * 1e-9 >= f.wait_s) {
        note(
            fmt::format("processes {} left running still run {:.0f} s after it exited (--wait-s); they go "
                        "on unwaited for, and their files hold what they recorded so far",
                        escape_control(f.command[0]), f.wait_s));
        break;
      }
      if (!told_wait) {
        told_wait = true;
        note(
            fmt::format("{} exited; waiting up to {:.0f} s for the processes it left running (Ctrl-C stops "
                        "the wait)",
                        escape_control(f.command[0]), f.wait_s));
      }
    }
    const std::int64_t now = monotonic_ns();
    const double elapsed = static_cast<double>(now - t0) * 1e-9;
    if (!window_opened && f.capture_range == "none" && first < 0 && elapsed >= f.delay_s) {
      write_control(control, true);
      window_opened = true;
    }
    if (window_opened && !window_closed && f.duration_s > 0 && elapsed >= f.delay_s + f.duration_s) {
      write_control(control, false);
      window_closed = true;
    }
    if (now >= next_sample) {
      samp.sample(now);
      next_sample = now + period;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(std::min<std::int64_t>(f.sample_ms, 20)));
  }
  const double wall = static_cast<double>(monotonic_ns() - t0) * 1e-9;
  const double launcher_cpu = (cpu_seconds_self() - cpu0) / std::max(wall, 1e-9);
  samples_out << fmt::format("L {}\n", static_cast<std::uint64_t>(std::llround(launcher_cpu * 1000.0)));
  samples_out.close();
  sigaction(SIGINT, &old_int, nullptr);
  sigaction(SIGTERM, &old_term, nullptr);
  g_child = 0;
  g_stop_waiting = 0;
  g_primary_done = 0;
  r.started = true;
  r.exit_status = 0;
  if (WIFEXITED(status)) r.exit_status = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) {
    r.signal = WTERMSIG(status);
    r.exit_status = 128 + r.signal;
    r.core_dumped = WCOREDUMP(status);
  }
  r.wall_s = wall;
  r.launcher_cpu = launcher_cpu;
  r.dir = dir;
  r.windowed = !start_on;
  r.steps_first = first;
  return r;
}

}  // namespace ferry::launch
