// The part of the device interface every backend shares: argument checks, the owning types (stream,
// event, buffer), the completion-event pool, pinned-memory accounting and host-callback error capture.
// Checks live here, once, so the host and cuda backends reject exactly the same misuse with the same
// messages; the do_* hooks may assume their arguments are valid.
#include "ferry/device/device.hpp"

#include <fmt/format.h>
#include <unistd.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <source_location>
#include <utility>

#include "ferry/core/error.hpp"
#include "ferry/core/units.hpp"

namespace ferry {
namespace {

// The message both stream_view::wait and event's own checks use: a wait on a never-recorded event has no
// point to wait for, and CUDA would silently treat it as complete.
void expect_recorded(const event& e, std::string_view what) {
  FERRY_EXPECTS(!e.empty(), fmt::format("{} an empty (moved-from) event", what));
  FERRY_EXPECTS(e.recorded(), "event was never recorded: record it on a stream before waiting on it");
}

void expect_same_device(const device& owner, const device& other, std::string_view what) {
  FERRY_EXPECTS(&owner == &other, fmt::format("{}: the stream or event belongs to another device", what));
}

// Two sizes that print alike ("1.00 MiB" for 1048576 and 1048577 bytes) would make a size error read as
// nonsense, so the exact counts are added exactly when the rounded ones collide.
std::pair<std::string, std::string> describe_sizes(std::uint64_t a, std::uint64_t b) {
  std::string sa = format_bytes(a);
  std::string sb = format_bytes(b);
  if (sa == sb) {
    sa += fmt::format(" ({} bytes)", a);
    sb += fmt::format(" ({} bytes)", b);
  }
  return {std::move(sa), std::move(sb)};
}

void expect_view(const mem_view& v, std::string_view role) {
  FERRY_EXPECTS(v.data != nullptr, fmt::format("{} is a null {} view", role, to_string(v.kind)));
}

// A copy of `bytes` must fit in both views and move at least one byte.
void expect_copy_fits(const mem_view& dst, const mem_view& src, std::size_t bytes, std::string_view what) {
  FERRY_EXPECTS(bytes > 0, fmt::format("{} of 0 bytes: a copy moves at least 1 byte", what));
  if (bytes > dst.bytes || bytes > src.bytes) {
    // Naming the smaller view names the one that must grow (or the copy that must shrink) first.
    const bool dst_smaller = dst.bytes <= src.bytes;
    const auto [size, limit] = describe_sizes(bytes, dst_smaller ? dst.bytes : src.bytes);
    detail::throw_logic_error(fmt::format("{} of {} does not fit in its {} of {}", what, size,
                                          dst_smaller ? "destination" : "source", limit),
                              std::source_location::current());
  }
}

std::string_view view_function(memory_kind k) noexcept {
  switch (k) {
    case memory_kind::device: return "device_view";
    case memory_kind::pinned: return "pinned_view";
    case memory_kind::pageable: return "pageable_view";
  }
  return "mem_view";
}

mem_view make_view(void* ptr, std::size_t bytes, memory_kind kind) {
  FERRY_EXPECTS(ptr != nullptr, fmt::format("{} of a null pointer ({} bytes)", view_function(kind), bytes));
  FERRY_EXPECTS(bytes > 0, fmt::format("{} of 0 bytes at {}: a view must hold at least 1 byte",
                                       view_function(kind), fmt::ptr(ptr)));
  return {ptr, bytes, kind};
}

}  // namespace

std::string_view to_string(backend b) noexcept {
  switch (b) {
    case backend::host: return "host";
    case backend::cuda: return "cuda";
  }
  return "unknown backend";
}

std::string to_json(const device_info& i, int indent) {
  const nlohmann::json j = {{"backend", std::string(to_string(i.kind))},
                            {"name", i.name},
                            {"ordinal", i.ordinal},
                            {"memory_bytes", i.memory_bytes},
                            {"pci_bus_id", i.pci_bus_id},
                            {"copy_engines", i.copy_engines}};
  return j.dump(indent);
}

std::string_view to_string(memory_kind k) noexcept {
  switch (k) {
    case memory_kind::device: return "device";
    case memory_kind::pinned: return "pinned";
    case memory_kind::pageable: return "pageable";
  }
  return "unknown memory kind";
}

std::string_view to_string(copy_direction d) noexcept {
  switch (d) {
    case copy_direction::host_to_device: return "host_to_device";
    case copy_direction::device_to_host: return "device_to_host";
    case copy_direction::device_to_device: return "device_to_device";
    case copy_direction::host_to_host: return "host_to_host";
  }
  return "unknown direction";
}

backend parse_backend(std::string_view text) {
  if (text == "host") return backend::host;
  if (text == "cuda") return backend::cuda;
  detail::throw_logic_error(fmt::format("unknown backend \"{}\": expected \"host\" or \"cuda\"", text),
                            std::source_location::current());
}

// ---- stream_view -------------------------------------------------------------------------------

void stream_view::synchronize() const {
  dev_->do_stream_synchronize(native_);
  dev_->rethrow_callback_error();
}

void stream_view::wait(const event& e) const {
  expect_recorded(e, "stream wait on");
  // An event of another device of the same backend is fine (cudaStreamWaitEvent takes one): it is how a
  // peer's stream waits for a peer copy.
  FERRY_EXPECTS(e.dev()->kind() == dev_->kind(),
                fmt::format("stream wait: the event belongs to a {} device and the stream to a {} device; a "
                            "stream waits only on events of its own backend",
                            to_string(e.dev()->kind()), to_string(dev_->kind())));
  dev_->do_stream_wait(native_, e.native());
}

// ---- stream ------------------------------------------------------------------------------------

void stream::destroy(const handle& h) noexcept { h.dev->do_stream_destroy(h.native); }

stream_view stream::view() const& {
  FERRY_EXPECTS(!empty(), "view of an empty (moved-from) stream: make one with device::make_stream");
  return {*handle_.get().dev, handle_.get().native};
}

// ---- event -------------------------------------------------------------------------------------

void event::release(const handle& h) noexcept { h.dev->release_event(h.native, h.timing); }

void event::record(stream_view s) {
  FERRY_EXPECTS(!empty(), "record of an empty (moved-from) event");
  handle& h = handle_.get();
  expect_same_device(*h.dev, s.dev(), "event record");
  h.dev->do_event_record(h.native, s.native());
  h.recorded = true;
}

void event::synchronize() const {
  expect_recorded("synchronize on");
  dev()->do_event_synchronize(native());
  dev()->rethrow_callback_error();
}

bool event::query() const {
  expect_recorded("query of");
  return dev()->do_event_query(native());
}

void event::expect_recorded(std::string_view what) const { ferry::expect_recorded(*this, what); }

// ---- memory views ------------------------------------------------------------------------------

mem_view mem_view::subview(std::size_t offset, std::size_t count) const {
  FERRY_EXPECTS(offset <= bytes && count <= bytes - offset,
                fmt::format("subview of {} bytes at offset {} does not fit in a {} view of {} bytes", count,
                            offset, to_string(kind), bytes));
  return {begin() + offset, count, kind};
}

mem_view device_view(void* ptr, std::size_t bytes) { return make_view(ptr, bytes, memory_kind::device); }
mem_view pinned_view(void* ptr, std::size_t bytes) { return make_view(ptr, bytes, memory_kind::pinned); }
mem_view pageable_view(void* ptr, std::size_t bytes) { return make_view(ptr, bytes, memory_kind::pageable); }

// ---- buffer ------------------------------------------------------------------------------------

void buffer::free_memory(const handle& h) noexcept {
  h.dev->free_buffer(h.data, h.bytes, h.kind, h.registered);
}

std::byte* buffer::host_bytes() const& {
  FERRY_EXPECTS(!empty(), "host_bytes of an empty (moved-from) buffer");
  FERRY_EXPECTS(kind() != memory_kind::device,
                fmt::format("host_bytes of a device buffer of {}: device memory is not addressable from the "
                            "host; copy it into a pinned buffer first",
                            format_bytes(size())));
  return static_cast<std::byte*>(data());
}

// ---- device ------------------------------------------------------------------------------------

device::~device() {
  FERRY_ASSERT_NOTHROW(
      event_pool_.empty(),
      fmt::format("{} pooled event(s) were never destroyed: the {} backend's destructor must "
                  "call drain_event_pool()",
                  event_pool_.size(), to_string(kind_)));
}

stream device::make_stream() { return {*this, do_stream_create()}; }

stream_view device::adopt_stream(void* native) {
  constexpr std::string_view advice = "pass a stream of your own, such as torch.cuda.Stream()";
  FERRY_EXPECTS(native != nullptr,
                fmt::format("adopt_stream(nullptr): the null handle is the legacy default stream, which "
                            "synchronizes with every other stream; {}",
                            advice));
  // The pseudo-handles are rejected on every backend, so code tested on the host backend cannot pass them
  // to the cuda one.
  const auto bits = reinterpret_cast<std::uintptr_t>(native);
  FERRY_EXPECTS(bits != 0x1, fmt::format("adopt_stream(0x1): cudaStreamLegacy is the legacy default stream, "
                                         "which synchronizes with every other stream; {}",
                                         advice));
  FERRY_EXPECTS(bits != 0x2,
                fmt::format("adopt_stream(0x2): cudaStreamPerThread is a default stream, which synchronizes "
                            "with the legacy default stream and so with every other stream; {}",
                            advice));
  FERRY_EXPECTS(
      !do_is_null_stream(native),
      fmt::format("adopt_stream({}): the {} backend treats this handle as the legacy default stream, "
                  "which synchronizes with every other stream; {}",
                  fmt::ptr(native), to_string(kind_), advice));
  do_check_adopted_stream(native);
  return {*this, native};
}

event device::make_event() {
  {
    const std::lock_guard lock(mu_);
    if (!event_pool_.empty()) {
      void* native = event_pool_.back();
      event_pool_.pop_back();
      return {*this, native, false};
    }
  }
  return {*this, do_event_create(false), false};
}

event device::make_timing_event() { return {*this, do_event_create(true), true}; }

double device::elapsed_ms(const event& start, const event& stop) {
  for (const event* e : {&start, &stop}) {
    const std::string_view which = e == &start ? "start" : "stop";
    FERRY_EXPECTS(!e->empty(), fmt::format("elapsed_ms: the {} event is empty (moved-from)", which));
    expect_same_device(*this, *e->dev(), "elapsed_ms");
    FERRY_EXPECTS(e->timing(), fmt::format("elapsed_ms: the {} event is a completion event, which keeps no "
                                           "time; make it with make_timing_event",
                                           which));
    FERRY_EXPECTS(e->recorded(), fmt::format("elapsed_ms: the {} event was never recorded", which));
    // Both backends answer alike: CUDA would report cudaErrorNotReady, the host backend has no time yet.
    FERRY_EXPECTS(do_event_query(e->native()),
                  fmt::format("elapsed_ms: the {} event has not completed yet; synchronize it first", which));
  }
  return do_elapsed_ms(start.native(), stop.native());
}

buffer device::alloc_device(std::size_t bytes) {
  FERRY_EXPECTS(bytes > 0, "size 0 is not a device allocation: ask for at least 1 byte");
  return {*this, do_alloc(bytes, memory_kind::device), bytes, memory_kind::device};
}

void device::count_pinned(std::size_t bytes, std::chrono::duration<double> took) {
  const std::lock_guard lock(mu_);
  pinned_.bytes += bytes;
  pinned_.peak_bytes = std::max(pinned_.peak_bytes, pinned_.bytes);
  pinned_.seconds += took.count();
  ++pinned_.allocations;
}

buffer device::alloc_pinned(std::size_t bytes) {
  FERRY_EXPECTS(bytes > 0, "size 0 is not a pinned allocation: ask for at least 1 byte");
  const auto start = std::chrono::steady_clock::now();
  void* p = do_alloc(bytes, memory_kind::pinned);
  count_pinned(bytes, std::chrono::steady_clock::now() - start);
  return {*this, p, bytes, memory_kind::pinned};
}

buffer device::alloc_pageable(std::size_t bytes) {
  FERRY_EXPECTS(bytes > 0, "size 0 is not a pageable allocation: ask for at least 1 byte");
  return {*this, do_alloc(bytes, memory_kind::pageable), bytes, memory_kind::pageable};
}

buffer device::register_host(void* p, std::size_t bytes) {
  FERRY_EXPECTS(p != nullptr, "register_host: the memory is null");
  FERRY_EXPECTS(bytes > 0, "register_host: 0 bytes; register at least 1");
  const auto page = static_cast<std::uintptr_t>(::sysconf(_SC_PAGESIZE));
  FERRY_EXPECTS(reinterpret_cast<std::uintptr_t>(p) % page == 0,  // NOLINT(*-reinterpret-cast)
                fmt::format("register_host: address {} is not page-aligned ({} bytes); map the memory with "
                            "mmap, whose mappings start on a page",
                            p, page));
  const auto start = std::chrono::steady_clock::now();
  do_register_host(p, bytes);
  count_pinned(bytes, std::chrono::steady_clock::now() - start);
  return {*this, p, bytes, memory_kind::pinned, true};
}

pinned_stats device::pinned() const {
  const std::lock_guard lock(mu_);
  return pinned_;
}

void device::copy_async(mem_view dst, mem_view src, stream_view s) { copy_async(dst, src, src.bytes, s); }

void device::copy_async(mem_view dst, mem_view src, std::size_t bytes, stream_view s) {
  expect_same_device(*this, s.dev(), "copy_async");
  FERRY_EXPECTS(bytes > 0, "copy of 0 bytes: a copy moves at least 1 byte");
  expect_view(src, "copy source");
  expect_view(dst, "copy destination");
  expect_copy_fits(dst, src, bytes, "copy");
  const auto s0 = reinterpret_cast<std::uintptr_t>(src.data);
  const auto d0 = reinterpret_cast<std::uintptr_t>(dst.data);
  FERRY_EXPECTS(s0 + bytes <= d0 || d0 + bytes <= s0,
                fmt::format("copy of {} from {} to {} overlaps itself; copies between overlapping ranges are "
                            "undefined on every backend",
                            format_bytes(bytes), fmt::ptr(src.data), fmt::ptr(dst.data)));
  do_copy_async(dst.data, src.data, bytes, direction_of(src.kind, dst.kind), src.kind, dst.kind, s.native());
}

void device::copy(mem_view dst, mem_view src, stream_view s) {
  copy_async(dst, src, s);
  s.synchronize();
}

bool device::can_access_peer(device& peer) {
  if (&peer == this) return true;
  if (peer.kind() != kind()) return false;
  return do_can_access_peer(peer);
}

void device::copy_peer_async(mem_view dst, device& dst_dev, mem_view src, stream_view s) {
  copy_peer_async(dst, dst_dev, src, src.bytes, s);
}

void device::copy_peer_async(mem_view dst, device& dst_dev, mem_view src, std::size_t bytes, stream_view s) {
  FERRY_EXPECTS(&s.dev() == this,
                fmt::format("copy_peer_async from device {} to device {}: the stream belongs to device {}; a "
                            "peer copy runs on a stream of its source device",
                            ordinal(), dst_dev.ordinal(), s.dev().ordinal()));
  FERRY_EXPECTS(dst_dev.kind() == kind(),
                fmt::format("copy_peer_async from {} device {} to {} device {}: peers must be devices of "
                            "one backend",
                            to_string(kind()), ordinal(), to_string(dst_dev.kind()), dst_dev.ordinal()));
  expect_view(src, "peer copy source");
  expect_view(dst, "peer copy destination");
  for (const auto& [v, role] : {std::pair{&src, "source"}, std::pair{&dst, "destination"}}) {
    FERRY_EXPECTS(v->kind == memory_kind::device,
                  fmt::format("copy_peer_async {} is {} of {} memory: a peer copy moves device memory; use "
                              "copy_async for host memory",
                              role, format_bytes(v->bytes), to_string(v->kind)));
  }
  expect_copy_fits(dst, src, bytes, "peer copy");
  if (&dst_dev == this) {
    // One device: an ordinary device-to-device copy, so code written for N devices runs with one.
    copy_async(dst, src, bytes, s);
    return;
  }
  do_check_peer(dst_dev);
  do_copy_peer_async(dst.data, dst_dev, src.data, bytes, s.native());
}

void device::memset_async(mem_view dst, std::uint8_t value, stream_view s) {
  expect_same_device(*this, s.dev(), "memset_async");
  expect_view(dst, "memset destination");
  FERRY_EXPECTS(dst.bytes > 0, "memset of 0 bytes: a memset writes at least 1 byte");
  FERRY_EXPECTS(dst.kind != memory_kind::pageable,
                fmt::format("memset_async of {} of pageable memory: a stream cannot write pageable memory in "
                            "order; use a pinned buffer, or std::memset after synchronizing",
                            format_bytes(dst.bytes)));
  do_memset_async(dst.data, value, dst.bytes, dst.kind, s.native());
}

void device::checksum_async(mem_view src, mem_view result, stream_view s) {
  expect_same_device(*this, s.dev(), "checksum_async");
  expect_view(src, "checksum source");
  expect_view(result, "checksum result");
  FERRY_EXPECTS(
      src.kind != memory_kind::pageable,
      fmt::format("checksum_async of {} of pageable memory: a stream cannot read pageable memory in "
                  "order; use ferry::checksum64 after synchronizing",
                  format_bytes(src.bytes)));
  FERRY_EXPECTS(
      result.kind == memory_kind::device && result.bytes >= 8,
      fmt::format("checksum_async result must be at least 8 bytes of device memory, not {} of {} memory",
                  result.bytes, to_string(result.kind)));
  do_checksum_async(src.data, src.bytes, result.data, s.native());
}

void device::fill_pattern_async(mem_view dst, std::uint64_t seed, stream_view s) {
  expect_same_device(*this, s.dev(), "fill_pattern_async");
  expect_view(dst, "pattern destination");
  FERRY_EXPECTS(
      dst.kind != memory_kind::pageable,
      fmt::format("fill_pattern_async of {} of pageable memory: a stream cannot write pageable memory "
                  "in order; use a pinned buffer, or ferry::fill_pattern after synchronizing",
                  format_bytes(dst.bytes)));
  do_fill_pattern_async(dst.data, dst.bytes, seed, dst.kind, s.native());
}

void device::launch_host_func(stream_view s, std::function<void()> fn) {
  expect_same_device(*this, s.dev(), "launch_host_func");
  FERRY_EXPECTS(static_cast<bool>(fn), "launch_host_func of an empty std::function");
  do_launch_host_func(s.native(), std::move(fn));
}

void device::spin_async(std::chrono::nanoseconds duration, stream_view s) {
  expect_same_device(*this, s.dev(), "spin_async");
  FERRY_EXPECTS(duration.count() >= 0,
                fmt::format("spin_async of a negative duration ({} ns)", duration.count()));
  do_spin_async(duration, s.native());
}

void device::synchronize() {
  do_synchronize();
  rethrow_callback_error();
}

void device::profiler_start() { do_profiler_start(); }

void device::profiler_stop() { do_profiler_stop(); }

void device::trace_begin(trace::recorder& r) {
  FERRY_EXPECTS(!tracing_, "trace_begin: this device is already tracing; call trace_end first");
  do_trace_begin(r);
  tracing_ = true;
}

void device::trace_end() {
  if (!tracing_) return;
  tracing_ = false;
  do_trace_end();
}

void device::rethrow_callback_error() {
  std::exception_ptr error;
  {
    const std::lock_guard lock(mu_);
    error = std::exchange(callback_error_, nullptr);
  }
  if (error) std::rethrow_exception(error);
}

void device::capture_callback_error(std::exception_ptr e) noexcept {
  const std::lock_guard lock(mu_);
  // The first error is the cause; later ones are usually its consequences.
  if (!callback_error_) callback_error_ = std::move(e);
}

void device::drain_event_pool() noexcept {
  std::vector<void*> pool;
  {
    const std::lock_guard lock(mu_);
    pool.swap(event_pool_);
  }
  for (void* e : pool) do_event_destroy(e);
}

void device::release_event(void* native, bool timing) noexcept {
  if (!timing) {
    try {
      const std::lock_guard lock(mu_);
      event_pool_.push_back(native);
      return;
    } catch (...) {
      // No memory to grow the pool: destroying the handle loses nothing but its reuse.
    }
  }
  do_event_destroy(native);
}

void device::free_buffer(void* p, std::size_t bytes, memory_kind kind, bool registered) noexcept {
  if (registered) {
    do_unregister_host(p, bytes);
  } else {
    do_free(p, bytes, kind);
  }
  if (kind == memory_kind::pinned) {
    const std::lock_guard lock(mu_);
    pinned_.bytes -= bytes;
  }
}

}  // namespace ferry
