// A stand-in libcupti.so.<toolkit major> for `ferry trace`'s tests without a GPU (test_ferry_trace.py):
// the entry points ferry's shim loads, answering as CUPTI does when there is nothing to record, so the
// injection library's CUPTI recorder starts, flushes and stops as it would on a GPU. It also plays the CUDA
// runtime's teardown at exit: after ferry_fake_cupti_teardown() (the fixture registers it with atexit after
// cuInit, as a statically linked cudart does), any CUPTI call aborts the process, as the real libcupti
// crashed there (cuptiActivityDisable, SIGSEGV, on an H200). C entry points with the ABI's integer and
// pointer types: it needs no CUDA header.
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <ctime>

#define FERRY_FAKE_EXPORT extern "C" __attribute__((visibility("default")))

namespace {

using cupti_result = int;  // CUptiResult
constexpr cupti_result success = 0;
constexpr cupti_result invalid_parameter = 1;
constexpr cupti_result max_limit_reached = 12;  // CUPTI_ERROR_MAX_LIMIT_REACHED: no more records

std::atomic<bool> torn_down{false};

void check(const char* call) {
  if (!torn_down.load()) return;
  std::fprintf(stderr, "fake libcupti: %s called after the CUDA runtime's teardown\n", call);
  std::abort();
}

}  // namespace

FERRY_FAKE_EXPORT void ferry_fake_cupti_teardown() { torn_down.store(true); }

FERRY_FAKE_EXPORT cupti_result cuptiGetVersion(std::uint32_t* version) {
  check("cuptiGetVersion");
  *version = 1'000'000;  // newer than any CUPTI_API_VERSION ferry was built with
  return success;
}

FERRY_FAKE_EXPORT cupti_result cuptiGetResultString(cupti_result /*result*/, const char** str) {
  *str = "fake libcupti error";
  return success;
}

FERRY_FAKE_EXPORT cupti_result cuptiGetTimestamp(std::uint64_t* timestamp) {
  check("cuptiGetTimestamp");
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
  check("cuptiSetThreadIdType");
  return success;
}

FERRY_FAKE_EXPORT cupti_result cuptiActivityRegisterCallbacks(void* /*requested*/, void* /*completed*/) {
  check("cuptiActivityRegisterCallbacks");
  return success;
}

FERRY_FAKE_EXPORT cupti_result cuptiActivityRegisterTimestampCallback(void* /*callback*/) {
  check("cuptiActivityRegisterTimestampCallback");
  return success;
}

FERRY_FAKE_EXPORT cupti_result cuptiActivityEnable(int /*kind*/) {
  check("cuptiActivityEnable");
  return success;
}

FERRY_FAKE_EXPORT cupti_result cuptiActivityDisable(int /*kind*/) {
  check("cuptiActivityDisable");
  return success;
}

FERRY_FAKE_EXPORT cupti_result cuptiActivityFlushAll(std::uint32_t /*flag*/) {
  check("cuptiActivityFlushAll");
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
