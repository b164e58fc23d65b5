// The host backend's tracing adapter: its streams' work and its API calls, as timeline events.
#include "host_tracer.hpp"

#include <mutex>
#include <utility>

namespace ferry::host_backend {

void host_tracer::begin(trace::recorder& r) {
  const std::unique_lock lock(trace_mu_);
  names_ = trace_names{
      .memcpy = r.intern("memcpy"),
      .memset = r.intern("memset"),
      .spin = r.intern("spin"),
      .fill_pattern = r.intern("fill pattern"),
      .checksum = r.intern("checksum"),
      .copy_async = r.intern("copy_async"),
      .copy_peer_async = r.intern("copy_peer_async"),
      .memset_async = r.intern("memset_async"),
      .launch = r.intern("launch kernel"),
      .launch_host_func = r.intern("launch_host_func"),
      .event_record = r.intern("event record"),
      .stream_wait = r.intern("stream wait"),
      .stream_synchronize = r.intern("stream synchronize"),
      .event_synchronize = r.intern("event synchronize"),
      .device_synchronize = r.intern("device synchronize"),
  };
  tracer_.store(&r, std::memory_order_release);
}

void host_tracer::end() {
  const std::unique_lock lock(trace_mu_);
  tracer_.store(nullptr, std::memory_order_release);
}

std::function<void()> host_tracer::traced(trace::event e, trace_name name, std::function<void()> op) {
  if (!on()) return op;
  return [this, e, name, op = std::move(op)]() mutable {
    const std::int64_t start = trace::now_ns();
    op();
    with_tracer([&](trace::recorder& r, const trace_names& names) {
      e.start_ns = start;
      e.end_ns = trace::now_ns();
      e.name = names.*name;
      r.record(e);
    });
  };
}

api_span::api_span(host_tracer& tracer, trace_name name, trace::sync_kind sync, std::uint64_t stream) noexcept
    : tracer_(tracer), name_(name), sync_(sync), stream_(stream) {
  if (!tracer_.on()) return;
  start_ns_ = trace::now_ns();
  correlation_ = tracer_.next_correlation();
}

api_span::~api_span() {
  if (start_ns_ == 0) return;
  tracer_.with_tracer([&](trace::recorder& r, const trace_names& names) {
    trace::event e;
    e.kind = trace::activity::api;
    e.start_ns = start_ns_;
    e.end_ns = trace::now_ns();
    e.name = names.*name_;
    e.thread = trace::this_thread_id();
    e.stream = stream_;
    e.device = tracer_.device();
    e.sync = sync_;
    e.correlation = correlation_;
    r.record(e);
  });
}

trace::event gpu_event(trace::activity kind, std::uint64_t stream, const api_span& issued_by) noexcept {
  trace::event e;
  e.kind = kind;
  e.device = issued_by.device();
  e.stream = stream;
  e.correlation = issued_by.correlation();
  return e;
}

trace::copy_kind to_copy_kind(copy_direction dir) noexcept {
  switch (dir) {
    case copy_direction::host_to_device: return trace::copy_kind::h2d;
    case copy_direction::device_to_host: return trace::copy_kind::d2h;
    case copy_direction::device_to_device: return trace::copy_kind::d2d;
    case copy_direction::host_to_host: return trace::copy_kind::h2h;
  }
  return trace::copy_kind::none;
}

trace::mem_kind to_mem_kind(memory_kind k) noexcept {
  switch (k) {
    case memory_kind::device: return trace::mem_kind::device;
    case memory_kind::pinned: return trace::mem_kind::pinned;
    case memory_kind::pageable: return trace::mem_kind::pageable;
  }
  return trace::mem_kind::unknown;
}

}  // namespace ferry::host_backend
