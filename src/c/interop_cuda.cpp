// The default-stream bridge on the cuda backend: events recorded and waited for with the CUDA runtime
// (the same statically linked runtime as the cuda backend's; handles are driver objects, so they are
// shared with a framework's own runtime).
#include <cuda_runtime.h>
#include <fmt/format.h>

#include "ferry/core/error.hpp"
#include "interop.hpp"

namespace ferry::c_api {
namespace {

void check(cudaError_t rc, const char* what) {
  if (rc != cudaSuccess) {
    throw cuda_error(static_cast<int>(rc),
                     fmt::format("{}: {} ({})", what, cudaGetErrorString(rc), cudaGetErrorName(rc)));
  }
}

cudaStream_t native_default(std::uintptr_t handle) {
  // DLPack names the legacy default stream 1; the runtime names it 0 or cudaStreamLegacy.
  return handle == 2 ? cudaStreamPerThread : cudaStreamLegacy;
}

// `to` waits for what `from` has queued so far, through a one-shot event (destroying it with a wait
// pending is allowed: the runtime frees it once the wait is satisfied).
void join(cudaStream_t to, cudaStream_t from) {
  cudaEvent_t e = nullptr;
  check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreateWithFlags");
  const cudaError_t recorded = cudaEventRecord(e, from);
  const cudaError_t waited = recorded == cudaSuccess ? cudaStreamWaitEvent(to, e, 0) : recorded;
  cudaEventDestroy(e);
  check(recorded, "cudaEventRecord");
  check(waited, "cudaStreamWaitEvent");
}

stream_view bridge_of(device_state& st) {
  const std::lock_guard lock(st.bridge_mu);
  if (st.bridge.empty()) st.bridge = st.dev->make_stream();
  return st.bridge.view();
}

}  // namespace

bool is_default_stream(const device_state& st, std::uintptr_t handle) noexcept {
  return st.dev->kind() == backend::cuda && handle <= 2;
}

stream_view producer_view(device_state& st, std::uintptr_t handle) {
  if (!is_default_stream(st, handle)) return st.dev->adopt_stream(reinterpret_cast<void*>(handle));
  const stream_view bridge = bridge_of(st);
  join(static_cast<cudaStream_t>(bridge.native()), native_default(handle));
  return bridge;
}

void join_into(device_state& st, std::uintptr_t handle, stream_view from) {
  if (!is_default_stream(st, handle)) {
    const stream_view to = st.dev->adopt_stream(reinterpret_cast<void*>(handle));
    if (to == from) return;
    event e = st.dev->make_event();
    e.record(from);
    to.wait(e);
    return;
  }
  join(native_default(handle), static_cast<cudaStream_t>(from.native()));
}

void wait_event(device_state& st, std::uintptr_t handle, const event& e) {
  if (!is_default_stream(st, handle)) {
    st.dev->adopt_stream(reinterpret_cast<void*>(handle)).wait(e);
    return;
  }
  FERRY_EXPECTS(e.recorded(), "wait on an event that was never recorded");
  check(cudaStreamWaitEvent(native_default(handle), static_cast<cudaEvent_t>(e.native()), 0),
        "cudaStreamWaitEvent");
}

void synchronize(device_state& st, std::uintptr_t handle) {
  if (!is_default_stream(st, handle)) {
    st.dev->adopt_stream(reinterpret_cast<void*>(handle)).synchronize();
    return;
  }
  check(cudaStreamSynchronize(native_default(handle)), "cudaStreamSynchronize");
}

}  // namespace ferry::c_api
