// The host backend's tracing adapter (private to src/device/host).
//
// Between trace_begin and trace_end, every operation a stream runs is a GPU event of the timeline
// (kernels for spin, fill pattern and checksum; copies with their direction and memory kinds; memsets),
// and every interface call is an API event on the calling thread, the blocking ones with their sync kind,
// as the cuda backend's CUPTI recorder reports them. Correlation ids link a call with the work it issues.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <shared_mutex>

#include "ferry/device/device.hpp"
#include "ferry/trace/timeline.hpp"

namespace ferry::host_backend {

/// The string ids of the names the host backend records, interned once per trace.
struct trace_names {
  std::uint32_t memcpy, memset, spin, fill_pattern, checksum;
  std::uint32_t copy_async, copy_peer_async, memset_async, launch, launch_host_func, event_record,
      stream_wait;
  std::uint32_t stream_synchronize, event_synchronize, device_synchronize;
};

/// A member of trace_names: which name an event gets once a trace is on.
using trace_name = std::uint32_t trace_names::*;

/// Records a host device's activity into the recorder attached between begin and end. Thread-safe:
/// stream threads and calling threads record concurrently.
class host_tracer {
 public:
  /// A tracer of the device with ordinal `device`, which its events carry.
  explicit host_tracer(std::int32_t device) noexcept : device_(device) {}
  host_tracer(const host_tracer&) = delete;
  host_tracer& operator=(const host_tracer&) = delete;

  [[nodiscard]] std::int32_t device() const noexcept { return device_; }
  /// Attaches `r` and interns the names.
  void begin(trace::recorder& r);
  /// Detaches the recorder; waits for recordings in progress, so it may be destroyed once this returns.
  void end();
  /// Whether a recorder is attached (a hint: it may detach at once).
  [[nodiscard]] bool on() const noexcept { return tracer_.load(std::memory_order_relaxed) != nullptr; }
  /// A new correlation id, for an API call traced while a trace is on.
  [[nodiscard]] std::uint64_t next_correlation() noexcept {
    return correlations_.fetch_add(1, std::memory_order_relaxed) + 1;
  }

  /// Calls fn(recorder, names) while a trace is on, holding it open against end().
  template <class F>
  void with_tracer(F&& fn) noexcept {
    if (tracer_.load(std::memory_order_acquire) == nullptr) return;
    const std::shared_lock lock(trace_mu_);
    trace::recorder* r = tracer_.load(std::memory_order_acquire);
    if (r != nullptr) fn(*r, names_);
  }

  /// `op`, recorded as event `e` (named by `name`) when it runs while a trace is on; `op` itself when no
  /// trace is on now.
  [[nodiscard]] std::function<void()> traced(trace::event e, trace_name name, std::function<void()> op);

 private:
  const std::int32_t device_;
  std::atomic<trace::recorder*> tracer_{nullptr};  // set between begin and end
  std::shared_mutex trace_mu_;  // held shared while recording, exclusively to attach or detach
  trace_names names_{};         // guarded by trace_mu_
  std::atomic<std::uint64_t> correlations_{0};  // correlation ids handed out to traced API calls
};

/// An API event on the calling thread from construction to destruction, on stream number `stream` (0
/// for a call that names no stream).
class api_span {
 public:
  api_span(host_tracer& tracer, trace_name name, trace::sync_kind sync, std::uint64_t stream) noexcept;
  api_span(const api_span&) = delete;
  api_span& operator=(const api_span&) = delete;
  ~api_span();
  /// Links the call with the GPU work it issues, as CUPTI's correlation ids do; 0 when not tracing.
  [[nodiscard]] std::uint64_t correlation() const noexcept { return correlation_; }
  /// The ordinal of the device the call was made on.
  [[nodiscard]] std::int32_t device() const noexcept { return tracer_.device(); }

 private:
  host_tracer& tracer_;
  trace_name name_;
  trace::sync_kind sync_;
  std::uint64_t stream_;
  std::int64_t start_ns_ = 0;
  std::uint64_t correlation_ = 0;
};

/// A GPU event of stream number `stream`, correlated with the API call (span) that issues it.
[[nodiscard]] trace::event gpu_event(trace::activity kind, std::uint64_t stream,
                                     const api_span& issued_by) noexcept;
[[nodiscard]] trace::copy_kind to_copy_kind(copy_direction dir) noexcept;
[[nodiscard]] trace::mem_kind to_mem_kind(memory_kind k) noexcept;

}  // namespace ferry::host_backend
