// The operating-system calls that block a thread, interposed through LD_PRELOAD: each wrapper reads the
// clock before and after the real call and keeps the call only when it took at least the threshold
// (FERRY_TRACE_BLOCK_US, 100 us by default), as plain values in a lock-free ring; the writer thread turns
// them into ranges in the "os" domain named after the call and the library that made it ("munmap
// (libtorch_cpu.so)"), with the bytes they moved or unmapped. Below the threshold a call costs two clock
// reads.
//
// Calls from the CUDA driver, CUPTI and NCCL are left out (gpu_library). What it cannot see: calls libc makes
// inside itself (free() returning memory with munmap, fread's read), raw system calls, and statically linked
// programs.
#include <dlfcn.h>
#include <poll.h>
#include <pthread.h>
#include <semaphore.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <string>

#include "ferry/trace/timeline.hpp"
#include "state.hpp"

namespace ferry::inject {
namespace {

template <class F>
F resolve(const char* name, const char* version = nullptr) noexcept {
  void* p = version != nullptr ? dlvsym(RTLD_NEXT, name, version) : nullptr;
  if (p == nullptr) p = dlsym(RTLD_NEXT, name);
  return reinterpret_cast<F>(p);
}

// The file name of the library that holds `address` ("libtorch_cpu.so"), or "?".
const char* library_of(const void* address) noexcept {
  Dl_info info{};
  if (address == nullptr || dladdr(address, &info) == 0 || info.dli_fname == nullptr) return "?";
  const char* slash = std::strrchr(info.dli_fname, '/');
  const char* name = slash != nullptr ? slash + 1 : info.dli_fname;
  return *name != '\0' ? name : "program";
}

bool watching() noexcept { return config().active && !in_ferry(); }

// Calls made inside the CUDA driver, CUPTI, NCCL and the like (their helper threads' polls, the wait
// inside cudaStreamSynchronize): CUPTI records the waits that matter (synchronizations) by name, and the
// rest are the libraries' own threads idling.
bool gpu_library(const char* name) noexcept {
  for (const char* prefix :
       {"libcuda.so", "libcupti", "libnvidia", "libnccl", "libcudart", "libferry_inject"})
    if (std::strncmp(name, prefix, std::strlen(prefix)) == 0) return true;
  return false;
}

// Calls that blocked, as the wrappers leave them: plain values in a fixed ring, written without a lock, an
// allocation or a call into the loader, since a wrapper may run inside malloc (an allocator's own mmap and
// munmap), a signal handler (a wakeup write) or the loader. The writer thread drains it, naming the caller.
struct raw_call {
  std::atomic<std::uint64_t> seq{0};  // index + 1 once the fields are written
  const char* call = nullptr;         // the wrapper's name (a literal)
  const void* caller = nullptr;
  std::int64_t start = 0;
  std::int64_t end = 0;
  std::uint64_t thread = 0;
  std::uint64_t bytes = 0;
};
constexpr std::uint64_t ring_size = std::uint64_t{1} << 14;
raw_call g_ring[ring_size];
std::atomic<std::uint64_t> g_head{0};  // next index to write
std::atomic<std::uint64_t> g_tail{0};  // next index to read (the writer's)
std::atomic<std::uint64_t> g_lost{0};  // calls dropped with the ring full

// Keeps [start, now) when it reached the threshold and the capture is on. Keeps errno.
void done(const char* call, std::int64_t start, std::uint64_t bytes, const void* caller) noexcept {
  const std::int64_t end = now_ns();
  if (end - start < config().block_ns || !capturing()) return;
  const int saved = errno;
  const std::uint64_t i = g_head.fetch_add(1, std::memory_order_relaxed);
  if (i - g_tail.load(std::memory_order_acquire) >= ring_size) {
    g_lost.fetch_add(1, std::memory_order_relaxed);
  } else {
    raw_call& r = g_ring[i % ring_size];
    r.call = call;
    r.caller = caller;
    r.start = start;
    r.end = end;
    r.thread = trace::this_thread_id();
    r.bytes = bytes;
    r.seq.store(i + 1, std::memory_order_release);
  }
  errno = saved;
}

std::uint64_t count(long long n) noexcept { return n > 0 ? static_cast<std::uint64_t>(n) : 0; }

}  // namespace

void drain_os_calls(process_state& s) noexcept {
  std::uint64_t tail = g_tail.load(std::memory_order_relaxed);
  const std::uint64_t head = g_head.load(std::memory_order_acquire);
  std::uint32_t domain = 0;
  for (; tail < head; ++tail) {
    raw_call& r = g_ring[tail % ring_size];
    if (r.seq.load(std::memory_order_acquire) != tail + 1) break;  // still being written
    const char* call = r.call;
    const void* caller = r.caller;
    trace::event e;
    e.kind = trace::activity::range;
    e.start_ns = r.start;
    e.end_ns = r.end;
    e.thread = r.thread;
    e.bytes = r.bytes;
    g_tail.store(tail + 1, std::memory_order_release);  // the slot is free again
    const char* library = library_of(caller);
    if (gpu_library(library)) continue;
    try {
      if (domain == 0) domain = s.rec.intern("os");
      e.domain = domain;
      e.name = s.rec.intern(std::string(call) + " (" + library + ")");
      s.rec.record_late(e);
    } catch (...) {
      s.rec.count_dropped(1);
    }
  }
  g_tail.store(tail, std::memory_order_release);
  if (const std::uint64_t lost = g_lost.exchange(0); lost != 0) s.rec.count_dropped(lost);
}

void os_calls_after_fork() noexcept {
  // The parent's calls not yet drained are its own; the child starts after them.
  g_tail.store(g_head.load(std::memory_order_relaxed), std::memory_order_relaxed);
  g_lost.store(0, std::memory_order_relaxed);
}

}  // namespace ferry::inject

using ferry::inject::count;
using ferry::inject::done;
using ferry::inject::now_ns;
using ferry::inject::resolve;
using ferry::inject::watching;

// One wrapper: `ret name(params)` calling the real `name(args)`; `bytes` may use the result, `result_`.
#define FERRY_OS_CALL(ret, name, params, args, bytes, ...)                                 \
  FERRY_INJECT_EXPORT ret name params {                                                    \
    static const auto real = resolve<decltype(&::name)>(#name __VA_OPT__(, ) __VA_ARGS__); \
    if (!watching()) return real args;                                                     \
    const void* caller = __builtin_return_address(0);                                      \
    const std::int64_t start = now_ns();                                                   \
    ret result_ = real args;                                                               \
    done(#name, start, bytes, caller);                                                     \
    return result_;                                                                        \
  }

#include "os_calls.def"
#undef FERRY_OS_CALL
