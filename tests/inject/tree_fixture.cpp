// A program for `ferry trace`'s tests (test_ferry_trace.py): each mode makes one shape of process tree or
// one kind of evidence the injection library must record. It uses no ferry code: it is the "unmodified
// program", and finds the library's Python-facing entry points (ferry_inject_range) through dlsym when
// it needs a mark of its own.
#include <dlfcn.h>
#include <err.h>
#include <fcntl.h>
#include <pthread.h>
#include <semaphore.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string>
#include <thread>

namespace {

std::int64_t now_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

void sleep_ms(int ms) {
  timespec ts{ms / 1000, (ms % 1000) * 1'000'000L};
  nanosleep(&ts, nullptr);
}

using range_fn = void (*)(const char*, const char*, long long, long long);

range_fn range() {
  auto* f = reinterpret_cast<range_fn>(dlsym(RTLD_DEFAULT, "ferry_inject_range"));
  if (f == nullptr) {
    std::fprintf(stderr, "tree_fixture: ferry_inject_range not found: not run under ferry trace\n");
    std::exit(2);
  }
  return f;
}

// Blocking calls of known length: munmap of 256 MiB, a read on a pipe written 30 ms later, a 20 ms sleep,
// a sem_wait posted 25 ms later; and a read that does not block (not recorded).
int blocking() {
  const std::size_t bytes = std::size_t{256} << 20;
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return 1;
  std::memset(p, 1, bytes);
  munmap(p, bytes);
  int fds[2];
  if (pipe(fds) != 0) return 1;
  std::thread writer([&] {
    sleep_ms(30);
    const char c = 'x';
    if (write(fds[1], &c, 1) != 1) std::abort();
  });
  char c = 0;
  if (read(fds[0], &c, 1) != 1) return 1;
  writer.join();
  sleep_ms(20);
  sem_t sem;
  sem_init(&sem, 0, 0);
  std::thread poster([&] {
    sleep_ms(25);
    sem_post(&sem);
  });
  sem_wait(&sem);
  poster.join();
  const int fd = open("/proc/self/stat", O_RDONLY);
  char buf[64];
  if (fd < 0 || read(fd, buf, sizeof buf) <= 0) return 1;
  close(fd);
  return 0;
}

// The parent records a range, then forks: the child records its own and exits with _exit(5).
int fork_child() {
  const std::int64_t t = now_ns();
  range()("parent before fork", "fixture", t, t + 1000);
  const pid_t pid = fork();
  if (pid == 0) {
    const std::int64_t c = now_ns();
    range()("child", "fixture", c, c + 1000);
    sleep_ms(20);
    _exit(5);
  }
  int st = 0;
  waitpid(pid, &st, 0);
  return WIFEXITED(st) && WEXITSTATUS(st) == 5 ? 0 : 1;
}

// A child that execs this program again in `blocking` mode.
int fork_exec(const char* self) {
  const pid_t pid = fork();
  if (pid == 0) {
    execl(self, self, "blocking", static_cast<char*>(nullptr));
    _exit(127);
  }
  int st = 0;
  waitpid(pid, &st, 0);
  return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : 1;
}

// A daemon: the child forks a grandchild and exits at once; the grandchild, re-parented, lives 300 ms
// more and leaves its pid in `path`.
int double_fork(const char* path) {
  const pid_t pid = fork();
  if (pid == 0) {
    if (fork() == 0) {
      setsid();
      sleep_ms(300);
      FILE* f = std::fopen(path, "w");
      if (f != nullptr) {
        std::fprintf(f, "%d\n", static_cast<int>(getpid()));
        std::fclose(f);
      }
      _exit(0);
    }
    _exit(0);
  }
  int st = 0;
  waitpid(pid, &st, 0);
  return 0;  // returns before the grandchild is done: the launcher must wait for it
}

// Marks every 5 ms for 400 ms; prints the end time of the last one, then dies of SIGKILL.
int kill_self() {
  const range_fn r = range();
  std::int64_t last = 0;
  const std::int64_t until = now_ns() + 400'000'000;
  for (int i = 0; now_ns() < until; ++i) {
    const std::int64_t t = now_ns();
    r(("mark " + std::to_string(i)).c_str(), "fixture", t, t + 1000);
    last = t + 1000;
    sleep_ms(5);
  }
  std::printf("last mark ends at %lld\n", static_cast<long long>(last));
  std::fflush(stdout);
  raise(SIGKILL);
  return 1;
}

// Marks every 10 ms for 1.2 s; prints when it started (capture window by time).
int marks() {
  const range_fn r = range();
  const std::int64_t start = now_ns();
  std::printf("started at %lld\n", static_cast<long long>(start));
  std::fflush(stdout);
  for (int i = 0; now_ns() < start + 1'200'000'000; ++i) {
    const std::int64_t t = now_ns();
    r(("mark " + std::to_string(i)).c_str(), "fixture", t, t + 1000);
    sleep_ms(10);
  }
  return 0;
}

// Marks 0-29, with cudaProfilerStart after mark 9 and cudaProfilerStop after mark 19, each followed by a
// pause longer than the capture switch takes to spread.
int profiler_api() {
  const range_fn r = range();
  using call = int (*)();
  auto* start = reinterpret_cast<call>(dlsym(RTLD_DEFAULT, "cudaProfilerStart"));
  auto* stop = reinterpret_cast<call>(dlsym(RTLD_DEFAULT, "cudaProfilerStop"));
  if (start == nullptr || stop == nullptr) return 3;
  for (int i = 0; i < 30; ++i) {
    const std::int64_t t = now_ns();
    r(("mark " + std::to_string(i)).c_str(), "fixture", t, t + 1000);
    if (i == 9 && start() != 0) return 4;
    if (i == 19 && stop() != 0) return 4;
    if (i == 9 || i == 19) sleep_ms(300);
  }
  return 0;
}

// A range, then SIGTERM at its default disposition.
int sigterm_self() {
  const std::int64_t t = now_ns();
  range()("before SIGTERM", "fixture", t, t + 1000);
  raise(SIGTERM);
  sleep_ms(2000);  // the writer thread flushes, then the signal ends the process
  return 1;
}

// ---- NVTX, loaded the way NVTX loads its tool (nvtx3/nvtxDetail/nvtxInit.h): dlopen of
// NVTX_INJECTION64_PATH, InitializeInjectionNvtx2(getExportTable), then calls through the filled tables.
using fn = void (*)();
fn core[16];
fn core2[16];
fn* core_slots[16];
fn* core2_slots[16];
struct callbacks {
  std::size_t size;
  int (*get)(int module, fn*** table, unsigned* size);
};
int get_table(int module, fn*** table, unsigned* size) {
  if (module == 1) {
    *table = core_slots;
    *size = 16;
    return 1;
  }
  if (module == 5) {
    *table = core2_slots;
    *size = 16;
    return 1;
  }
  return 0;
}
const callbacks g_callbacks{sizeof(callbacks), get_table};
const void* export_table(std::uint32_t id) { return id == 1 ? &g_callbacks : nullptr; }
struct attributes {  // nvtxEventAttributes_v2
  std::uint16_t version, size;
  std::uint32_t category;
  std::int32_t color_type;
  std::uint32_t color;
  std::int32_t payload_type, reserved0;
  std::uint64_t payload;
  std::int32_t message_type;
  const void* message;
};
attributes ascii(const char* text) { return attributes{3, sizeof(attributes), 0, 0, 0, 0, 0, 0, 1, text}; }

// Loads the tool as NVTX does; 0 when it took the tables.
int load_nvtx() {
  const char* path = std::getenv("NVTX_INJECTION64_PATH");
  void* lib = path != nullptr ? dlopen(path, RTLD_NOW) : nullptr;
  auto* init =
      lib != nullptr
          ? reinterpret_cast<int (*)(const void* (*)(std::uint32_t))>(dlsym(lib, "InitializeInjectionNvtx2"))
          : nullptr;
  if (init == nullptr) return 3;
  for (int i = 0; i < 16; ++i) {
    core_slots[i] = &core[i];
    core2_slots[i] = &core2[i];
  }
  return init(export_table) == 1 ? 0 : 4;
}

// Ranges before, in and after one named "capture me" (the NVTX trigger of the capture window).
int nvtx_window() {
  if (const int rc = load_nvtx(); rc != 0) return rc;
  auto push_a = reinterpret_cast<int (*)(const char*)>(core[9]);
  auto pop = reinterpret_cast<int (*)()>(core[11]);
  for (const char* name : {"before", "capture me", "after"}) {
    push_a(name);
    if (std::strcmp(name, "capture me") == 0) {
      push_a("inside");
      sleep_ms(1);
      pop();
    }
    pop();
    sleep_ms(100);  // longer than a poll of the capture switch
  }
  return 0;
}

int nvtx() {
  if (const int rc = load_nvtx(); rc != 0) return rc;
  auto push_a = reinterpret_cast<int (*)(const char*)>(core[9]);
  auto pop = reinterpret_cast<int (*)()>(core[11]);
  auto name_thread = reinterpret_cast<void (*)(std::uint32_t, const char*)>(core[14]);
  auto start_ex = reinterpret_cast<std::uint64_t (*)(const attributes*)>(core[4]);
  auto end = reinterpret_cast<void (*)(std::uint64_t)>(core[7]);
  auto domain_create = reinterpret_cast<void* (*)(const char*)>(core2[12]);
  auto domain_push = reinterpret_cast<int (*)(void*, const attributes*)>(core2[4]);
  auto domain_pop = reinterpret_cast<int (*)(void*)>(core2[5]);
  if (push_a == nullptr || pop == nullptr || domain_create == nullptr || start_ex == nullptr) return 5;
  name_thread(static_cast<std::uint32_t>(gettid()), "nvtx main");
  push_a("outer");
  push_a("inner");
  sleep_ms(2);
  pop();
  pop();
  void* domain = domain_create("my domain");
  const attributes a = ascii("in my domain");
  domain_push(domain, &a);
  domain_pop(domain);
  const attributes s = ascii("across threads");
  const std::uint64_t id = start_ex(&s);
  std::thread([&] { end(id); }).join();
  const pid_t pid = fork();
  if (pid == 0) {
    push_a("in the child");
    pop();
    _exit(0);
  }
  waitpid(pid, nullptr, 0);
  return 0;
}

// ---- The CUDA driver's side of CUDA_INJECTION64_PATH: dlopen it and call InitializeInjection from
// inside a lock, as cuInit does, on another thread.
int cuda() {
  const char* path = std::getenv("CUDA_INJECTION64_PATH");
  void* lib = path != nullptr ? dlopen(path, RTLD_NOW) : nullptr;
  auto* init = lib != nullptr ? reinterpret_cast<int (*)()>(dlsym(lib, "InitializeInjection")) : nullptr;
  if (init == nullptr) return 3;
  pthread_mutex_t init_lock = PTHREAD_MUTEX_INITIALIZER;
  int result = 0;
  std::thread([&] {
    pthread_mutex_lock(&init_lock);
    result = init();
    result += init();  // idempotent
    pthread_mutex_unlock(&init_lock);
  }).join();
  sleep_ms(20);  // recorded on the CPU side whatever CUPTI did
  return result == 2 ? 0 : 4;
}

// exit(4), and a handler of the program's own that records a range, then ends as `how` says: returns
// ("return"), calls _exit(6) ("_exit") or raises SIGTERM at its default ("sigterm").
std::string g_exit_handler_how;
void exit_handler() {
  const std::int64_t t = now_ns();
  range()("in an exit handler", "fixture", t, t + 1000);
  if (g_exit_handler_how == "_exit") _exit(6);
  if (g_exit_handler_how == "sigterm") {
    raise(SIGTERM);
    sleep_ms(3000);
  }
}
[[noreturn]] void exit_with_handler(const std::string& how) {
  g_exit_handler_how = how;
  const std::int64_t t = now_ns();
  range()("before exit", "fixture", t, t + 1000);
  std::atexit(exit_handler);
  std::exit(4);
}

int pthread_exit_main();

// A range, then quick_exit(3), with an at_quick_exit handler that records one of its own.
[[noreturn]] void quick_exit_with_handler() {
  const std::int64_t t = now_ns();
  range()("before quick_exit", "fixture", t, t + 1000);
  std::at_quick_exit([] {
    const std::int64_t t1 = now_ns();
    range()("in a quick_exit handler", "fixture", t1, t1 + 1000);
  });
  std::quick_exit(3);
}

// As a program linked with the static CUDA runtime: its first cuInit (where the driver calls
// InitializeInjection), then the runtime's teardown registered with atexit, then one way out: `how` ""
// returns from main (0), "exit" calls exit(7), "_exit" _exit(8), "errx" glibc's errx (5), whose exit no
// preload sees, "sigterm" raises SIGTERM at its default, "pthreadexit" ends main with pthread_exit (0, at
// the last thread's end), "twoexits" calls exit(7) on two threads, the second 30 ms after the first. The
// teardown comes from the stand-in libcupti (fake_cupti.cpp, its soname in `cupti`), which aborts on any
// CUPTI call after it: CUPTI must be stopped before the exit handlers run.
int cuda_teardown(const char* cupti, const std::string& how) {
  const char* path = std::getenv("CUDA_INJECTION64_PATH");
  void* lib = path != nullptr ? dlopen(path, RTLD_NOW) : nullptr;
  auto* init = lib != nullptr ? reinterpret_cast<int (*)()>(dlsym(lib, "InitializeInjection")) : nullptr;
  if (init == nullptr || init() != 1) return 3;
  void* fake = dlopen(cupti, RTLD_NOW | RTLD_NOLOAD);  // the one the recorder loaded
  auto* teardown =
      fake != nullptr ? reinterpret_cast<void (*)()>(dlsym(fake, "ferry_fake_cupti_teardown")) : nullptr;
  if (teardown == nullptr) {
    std::fprintf(stderr, "tree_fixture: the recorder did not load the stand-in %s\n", cupti);
    return 4;
  }
  std::atexit(teardown);
  sleep_ms(120);  // the writer flushes CUPTI meanwhile
  if (how == "errx") errx(5, "ended by errx");
  if (how == "exit") std::exit(7);
  if (how == "_exit") _exit(8);
  if (how == "sigterm") return sigterm_self();
  if (how == "pthreadexit") return pthread_exit_main();
  if (how == "twoexits") {  // a second exit(7) while the first is stopping CUPTI (a slow forced flush)
    std::thread([] {
      sleep_ms(30);
      std::exit(7);  // NOLINT(concurrency-mt-unsafe): the point of the test
    }).detach();
    std::exit(7);  // NOLINT(concurrency-mt-unsafe)
  }
  return how.empty() ? 0 : 9;
}

// main ends with pthread_exit while another thread finishes its work: the process ends with that thread,
// exit status 0, though ferry's writer thread is still there.
int pthread_exit_main() {
  const std::int64_t t0 = now_ns();
  range()("before pthread_exit", nullptr, t0, t0);  // an event: the writer thread runs
  std::thread([] {
    sleep_ms(60);
    const std::int64_t t1 = now_ns();
    range()("last thread", nullptr, t1, t1);
  }).detach();
  pthread_exit(nullptr);
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "blocking") return blocking();
  if (mode == "fork") return fork_child();
  if (mode == "forkexec") return fork_exec(argv[0]);
  if (mode == "doublefork" && argc > 2) return double_fork(argv[2]);
  if (mode == "exit3") std::exit(3);
  if (mode == "quickexit") quick_exit_with_handler();
  if (mode == "kill") return kill_self();
  if (mode == "sigterm") return sigterm_self();
  if (mode == "marks") return marks();
  if (mode == "profiler") return profiler_api();
  if (mode == "nvtx") return nvtx();
  if (mode == "nvtxwindow") return nvtx_window();
  if (mode == "cuda") return cuda();
  if (mode == "cudateardown" && argc > 2) return cuda_teardown(argv[2], argc > 3 ? argv[3] : "");
  if (mode == "pthreadexit") return pthread_exit_main();
  if (mode == "exithandler" && argc > 2) exit_with_handler(argv[2]);
  std::fprintf(
      stderr,
      "usage: tree_fixture blocking|fork|forkexec|doublefork "
      "FILE|exit3|quickexit|kill|sigterm|marks|profiler|nvtx|nvtxwindow|cuda|cudateardown SONAME "
      "[exit|_exit|errx|sigterm|pthreadexit|twoexits]|pthreadexit|exithandler return|_exit|sigterm\n");
  return 2;
}
