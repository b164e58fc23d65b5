// CUDA: the driver calls InitializeInjection from inside the process's first cuInit, when
// CUDA_INJECTION64_PATH names this library. From there only CUPTI is called, never CUDA (a re-entrant
// cuInit would deadlock): ferry's CUPTI recorder (src/cupti/cupti_tracer.cpp) starts on the process's
// recorder with the timestamp callback on ferry's clock, and the writer thread drains it.
//
// Coexistence:
// - torch.profiler (Kineto) registers CUPTI's buffer callbacks when a profiling session starts. CUPTI
//   has one set per process, so the library interposes cuptiActivityRegisterCallbacks: when another
//   caller registers, ferry flushes its records, stops its CUPTI recorder, notes it ("cupti_handover")
//   and passes the call on; the profiler then gets its GPU events and ferry's GPU track ends there.
// - cudaProfilerStart/Stop are interposed (not a CUPTI subscriber, which Kineto would then fail to get)
//   to drive `ferry trace --capture-range=cudaProfilerApi`: they turn the capture switch of every
//   process of the recording, then call the real ones.
#include <dlfcn.h>
#include <unistd.h>

#include <cstdlib>
#include <exception>
#include <string>

#include "state.hpp"

#if FERRY_INJECT_CUPTI
#include "ferry/cupti/cupti_tracer.hpp"
#endif

namespace ferry::inject {
namespace {

std::atomic<bool> g_cuda_seen{false};
std::atomic<bool> g_handed_over{false};

void* real_symbol(const char* name, const char* const* libraries) {
  if (void* p = dlsym(RTLD_NEXT, name)) return p;
  // Loaded by a library that keeps its symbols local (Python extensions, torch): find it by soname.
  for (const char* const* lib = libraries; *lib != nullptr; ++lib) {
    if (void* h = dlopen(*lib, RTLD_NOW | RTLD_NOLOAD)) {
      if (void* p = dlsym(h, name)) return p;
    }
  }
  return nullptr;
}

}  // namespace

void cupti_start(process_state& s) noexcept {
#if FERRY_INJECT_CUPTI
  if (!s.cuda.load() || g_handed_over.load() || exit_begun() || s.cupti_on.load()) return;
  try {
    const own_call own;
    cupti::options o;
    o.lite = config().lite;
    o.syncs = config().syncs;
    o.all_runtime_calls = config().all_calls;
    o.defer_conversion = config().defer_conversion;
    o.markers = false;       // NVTX is this library's own (nvtx.cpp)
    cupti::begin(s.rec, o);  // throws once cupti::close() has run: the process is exiting
    s.cupti_on.store(true);
    note("cupti", o.lite    ? "recording kernels, copies and memsets (--lite)"
                  : o.syncs ? "recording kernels, copies, memsets, synchronizations and runtime calls"
                            : "recording kernels, copies, memsets and runtime calls (--no-syncs)");
    if (o.defer_conversion) note("cupti_conversion", "deferred to the writer's flush");
    if (!o.lite)
      note("cupti_runtime_calls", cupti::quiet_calls_left_out() > 0
                                      ? "all but the quiet queries (cudaGetDevice, cudaGetLastError, ...)"
                                      : "all");
  } catch (const std::exception& e) {
    if (!exit_begun()) note("cupti", std::string("unavailable: ") + e.what());
  } catch (...) {
    if (!exit_begun()) note("cupti", "unavailable");
  }
#else
  static_cast<void>(s);
#endif
}

#if FERRY_INJECT_CUPTI
namespace {
// Runs cupti::end or cupti::close, noting what it threw: a recording problem must not end the program.
void end_cupti(void (*how)()) noexcept {
  try {
    const own_call own;
    how();
  } catch (const std::exception& e) {
    note("cupti_end", e.what());
  } catch (...) {
  }
}
}  // namespace
#endif

void cupti_stop(process_state& s) noexcept {
#if FERRY_INJECT_CUPTI
  if (s.cupti_on.exchange(false)) end_cupti(cupti::end);
#else
  static_cast<void>(s);
#endif
}

void cupti_close(process_state& s) noexcept {
#if FERRY_INJECT_CUPTI
  // Only where this process's own cuInit ran: a fork child holds a copy of its parent's session, which
  // is not its own to end. There unconditionally, whatever cupti_on says: cupti::close() waits for a
  // begin() (a capture window opening on the writer thread or in another thread's step), a flush() or an
  // end() in progress, then ends the session if there is one.
  if (!s.cuda.load()) return;
  s.cupti_on.store(false);
  end_cupti(cupti::close);
#else
  static_cast<void>(s);
#endif
}

void cupti_abandon(process_state& s) noexcept {
#if FERRY_INJECT_CUPTI
  if (!s.cuda.load()) return;  // a fork child: its parent's session is not its own
  const bool was_on = s.cupti_on.exchange(false);
  cupti::abandon();
  if (was_on)
    note("cupti_abandoned",
         "the process exited past main's return and exit() (errx, error, ...), when CUDA may already be torn "
         "down: CUPTI's last records were dropped rather than risk a crash");
#else
  static_cast<void>(s);
#endif
}

void cupti_flush(process_state& s, bool forced) noexcept {
#if FERRY_INJECT_CUPTI
  if (s.cupti_on.load()) cupti::flush(forced);
#else
  static_cast<void>(s);
  static_cast<void>(forced);
#endif
}

}  // namespace ferry::inject

/// The driver's entry point into its injection library, called inside the process's first cuInit.
/// Returns 1 whatever happens: a recording problem must not fail the program's CUDA.
FERRY_INJECT_EXPORT int InitializeInjection(void) {
  using namespace ferry::inject;
  process_state* s = state();
  if (s == nullptr || g_cuda_seen.exchange(true)) return 1;
  s->cuda.store(true);
  start_writer(*s);  // it drains CUPTI and follows the capture switch, events or not
  note("cuda", "initialized (cuInit)");
#if FERRY_INJECT_CUPTI
  if (s->rec.capturing()) cupti_start(*s);
#else
  note("cupti", "unavailable: ferry was built without the CUDA toolkit, so no GPU activity is recorded");
#endif
  return 1;
}

#if FERRY_INJECT_CUPTI
/// Another CUPTI user (torch.profiler's Kineto) takes the buffer callbacks: ferry hands CUPTI over.
FERRY_INJECT_EXPORT int cuptiActivityRegisterCallbacks(void* requested, void* completed) {
  using namespace ferry::inject;
  using register_fn = int (*)(void*, void*);
  static const char* const libs[] = {"libcupti.so.13", "libcupti.so.12", "libcupti.so", nullptr};
  static const auto real = reinterpret_cast<register_fn>(real_symbol("cuptiActivityRegisterCallbacks", libs));
  if (process_state* s = state(); s != nullptr && !in_ferry() && !g_handed_over.exchange(true)) {
    const bool was_on = s->cupti_on.load();
    cupti_stop(*s);  // flushes ferry's records into its recorder while its callbacks are still CUPTI's
    flush(*s, false);
    note("cupti_handover",
         std::to_string(now_ns()) +
             (was_on ? " another CUPTI user (torch.profiler?) took CUPTI's buffer callbacks: "
                       "ferry's GPU records end here"
                     : " another CUPTI user (torch.profiler?) took CUPTI's buffer callbacks"));
  }
  return real != nullptr ? real(requested, completed) : 1;  // 1: CUPTI_ERROR_INVALID_PARAMETER
}
#endif

namespace {
int forward_profiler_call(const char* name) {
  using fn = int (*)();
  static const char* const libs[] = {"libcudart.so.13", "libcudart.so.12", "libcudart.so", nullptr};
  const auto real = reinterpret_cast<fn>(ferry::inject::real_symbol(name, libs));
  return real != nullptr ? real() : 0;
}
}  // namespace

/// cudaProfilerStart: opens the capture window of `ferry trace --capture-range=cudaProfilerApi`.
FERRY_INJECT_EXPORT int cudaProfilerStart(void) {
  ferry::inject::set_capture(true);
  return forward_profiler_call("cudaProfilerStart");
}

/// cudaProfilerStop: closes it.
FERRY_INJECT_EXPORT int cudaProfilerStop(void) {
  ferry::inject::set_capture(false);
  return forward_profiler_call("cudaProfilerStop");
}
