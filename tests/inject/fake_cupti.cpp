// A stand-in libcupti.so.<toolkit major> for `ferry trace`'s tests without a GPU (test_ferry_trace.py):
// the entry points ferry's shim loads, answering as CUPTI does when there is nothing to record, so the
// injection library's CUPTI recorder starts, flushes and stops as it would on a GPU. It also plays the CUDA
// runtime's teardown at exit: after ferry_fake_cupti_teardown() (the fixture registers it with atexit after
// cuInit, as a statically linked cudart does), any CUPTI call aborts the process, as the real libcupti
// crashed there (cuptiActivityDisable, SIGSEGV, on an H200); the teardown itself aborts while a CUPTI call
// is in progress on another thread. FERRY_FAKE_CUPTI_SLOW_FLUSH_MS makes each unforced
// cuptiActivityFlushAll (the writer thread's) last that long, so a teardown lands inside one;
// FERRY_FAKE_CUPTI_SLOW_FORCED_FLUSH_MS does the same for the forced ones (CUPTI's stop at exit). C entry
// points with the ABI's integer and pointer types: it needs no CUDA header.
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <thread>

#define FERRY_FAKE_EXPORT extern "C" __attribute__((visibility("default")))

namespace {

using cupti_result = int;  // CUptiResult
constexpr cupti_result success = 0;
constexpr cupti_result invalid_parameter = 1;
constexpr cupti_result max_limit_reached = 12;  // CUPTI_ERROR_MAX_LIMIT_REACHED: no more records

std::atomic<bool> torn_down{false};
std::atomic<int> in_progress{0};  // CUPTI calls running now, on any thread

// Counts a call while it runs; aborts when the teardown has come.
class call {
 public:
  explicit call(const char* name) {
    in_progress.fetch_add(1);
    if (!torn_down.load()) return;
    std::fprintf(stderr, "fake libcupti: %s called after the CUDA runtime's teardown\n", name);
    std::abort();
  }
  ~call() { in_progress.fetch_sub(1); }
  call(const call&) = delete;
  call& operator=(const call&) = delete;
  call(call&&) = delete;
  call& operator=(call&&) = delete;
};

int env_ms(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr ? std::atoi(v) : 0;
}

int slow_flush_ms(bool forced) {
  static const int unforced_ms = env_ms("FERRY_FAKE_CUPTI_SLOW_FLUSH_MS");
  static const int forced_ms = env_ms("FERRY_FAKE_CUPTI_SLOW_FORCED_FLUSH_MS");
  return forced ? forced_ms : unforced_ms;
}

}  // namespace

FERRY_FAKE_EXPORT void ferry_fake_cupti_teardown() {
  if (const int n = in_progress.load(); n > 0) {
    std::fprintf(stderr, "fake libcupti: the CUDA runtime's teardown while %d CUPTI call(s) run\n", n);
    std::abort();
  }
  torn_down.store(true);
}

FERRY_FAKE_EXPORT cupti_result cuptiGetVersion(std::uint32_t* version) {
  const call c("cuptiGetVersion");
  *version = 1'000'000;  // newer than any CUPTI_API_VERSION ferry was built with
  return success;
}

FERRY_FAKE_EXPORT cupti_result cuptiGetResultString(cupti_result /*result*/, const char** str) {
  *str = "fake libcupti error";
  return success;
}

FERRY_FAKE_EXPORT cupti_result cuptiGetTimestamp(std::uint64_t* timestamp) {
  const call c("cuptiGetTimestamp");
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  *timestamp =
      static_cast<std::uint64_t>(ts.tv_sec) * 1'000'000'000U + static_cast<std::uint64_t>(ts.tv_nsec);
  return success;
}

FERRY_FAKE_EXPORT cupti_result cuptiGetCallbackName(int /*domain*/, std::uint32_t /*cbid*/,
                                                    const char** name) {
  *name = nullptr;
  return invalid_parameter;  // no runtime call is known: none is left out
}

FERRY_FAKE_EXPORT cupti_result cuptiSetThreadIdType(int /*type*/) {
  const call c("cuptiSetThreadIdType");
  return success;
}

FERRY_FAKE_EXPORT cupti_result cuptiActivityRegisterCallbacks(void* /*requested*/, void* /*completed*/) {
  const call c("cuptiActivityRegisterCallbacks");
  return success;
}

FERRY_FAKE_EXPORT cupti_result cuptiActivityRegisterTimestampCallback(void* /*callback*/) {
  const call c("cuptiActivityRegisterTimestampCallback");
  return success;
}

FERRY_FAKE_EXPORT cupti_result cuptiActivityEnable(int /*kind*/) {
  const call c("cuptiActivityEnable");
  return success;
}

FERRY_FAKE_EXPORT cupti_result cuptiActivityDisable(int /*kind*/) {
  const call c("cuptiActivityDisable");
  return success;
}

FERRY_FAKE_EXPORT cupti_result cuptiActivityFlushAll(std::uint32_t flag) {
  const call c("cuptiActivityFlushAll");
  if (const int ms = slow_flush_ms(flag != 0); ms > 0)
    std::this_thread::sleep_for(std::chrono::milliseconds(ms));
  return success;  // no buffer holds a record: no callback
}

FERRY_FAKE_EXPORT cupti_result cuptiActivityGetNextRecord(std::uint8_t* /*buffer*/, std::size_t /*valid*/,
                                                          void** /*record*/) {
  return max_limit_reached;
}

FERRY_FAKE_EXPORT cupti_result cuptiActivityGetNumDroppedRecords(void* /*context*/, std::uint32_t /*stream*/,
                                                                 std::size_t* dropped) {
  *dropped = 0;
  return success;
}
