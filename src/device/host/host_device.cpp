// The host backend: an emulated GPU in plain C++ with the cuda backend's asynchronous semantics. Every
// pipeline runs on it in CI (which has no GPU), and its link model answers "what if the link were slower"
// without one. No CUDA header is reachable from here.
//
// The model, one idea per file of this folder:
// - host_stream: a stream is a thread draining a FIFO of operations; streams run concurrently. It keeps
//   the stream's modelled clock, which timing events read: elapsed_ms is modelled time, not wall time.
// - host_event: an event numbers its records, and a wait is bound to the record current at its call.
// - host_memory: device memory is capped host memory; pinned memory is mlock()ed (unlocked past
//   RLIMIT_MEMLOCK unless host_device_options::require_locked_pinned).
// - link_model: copies really copy, paced to a modelled link with one copy engine per direction.
// - peer_link: peer copies between the devices of one make_host_devices group, paced to the link they
//   share (a send and a receive engine per device).
// - host_tracer: while tracing, stream work becomes GPU events and interface calls API events.
// This file holds the device itself: it keeps the live streams and events by native handle and turns
// each do_* hook into operations queued on a stream.
//
// Lifetimes: streams, events and buffers must be destroyed before their device. The destructor drains and
// joins the threads of streams still alive and reports what was leaked, but frees nothing a user owns.
#include <fmt/format.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "ferry/core/error.hpp"
#include "ferry/core/pattern.hpp"
#include "ferry/core/units.hpp"
#include "ferry/device/device.hpp"
#include "ferry/trace/timeline.hpp"
#include "host_event.hpp"
#include "host_memory.hpp"
#include "host_stream.hpp"
#include "host_tracer.hpp"
#include "link_model.hpp"
#include "peer_link.hpp"

namespace ferry {
namespace {

using host_backend::api_span;
using host_backend::gpu_event;
using host_backend::host_event;
using host_backend::host_stream;
using host_backend::trace_names;

host_event& event_of(void* e) noexcept { return *static_cast<host_event*>(e); }
host_stream& stream_of(void* s) noexcept { return *static_cast<host_stream*>(s); }
// The stream number a trace shows for a call on `s`; 0 for a call that names no stream.
std::uint64_t number_of(void* s) noexcept { return s == nullptr ? 0 : stream_of(s).number(); }

// The options of one device of a group: its jitter seed mixed with its ordinal, so the devices of a group
// are not delayed in lockstep (ordinal 0 keeps the seed as given).
host_device_options for_device(host_device_options options) {
  options.seed ^= static_cast<std::uint64_t>(options.ordinal) * 0x9E3779B97F4A7C15ULL;
  return options;
}

class host_device final : public device {
 public:
  /// Member `index` of the group that shares `peers`.
  host_device(const host_device_options& options, std::shared_ptr<host_backend::peer_link> peers,
              std::size_t index)
      : device(backend::host, options.ordinal),
        opt_(for_device(options)),
        link_(options),
        memory_(options.device_memory_bytes, options.require_locked_pinned),
        tracer_(options.ordinal),
        peers_(std::move(peers)),
        peer_index_(index) {
    FERRY_EXPECTS(opt_.ordinal >= 0,
                  fmt::format("host_device_options::ordinal = {}: must not be negative", opt_.ordinal));
    FERRY_EXPECTS(opt_.jitter_probability >= 0 && opt_.jitter_probability <= 1,
                  fmt::format("host_device_options::jitter_probability = {}: must lie in [0, 1]",
                              opt_.jitter_probability));
    FERRY_EXPECTS(opt_.jitter_max.count() >= 0,
                  fmt::format("host_device_options::jitter_max = {} ns: must not be negative",
                              opt_.jitter_max.count()));
  }

  host_device(const host_device&) = delete;
  host_device& operator=(const host_device&) = delete;

  ~host_device() override {
    std::unordered_map<void*, std::shared_ptr<host_stream>> left;
    {
      const std::lock_guard lock(streams_mu_);
      left.swap(streams_);
    }
    FERRY_ASSERT_NOTHROW(left.empty(),
                         fmt::format("host device destroyed while {} of its streams live: destroy "
                                     "streams, events and buffers before their device",
                                     left.size()));
    // Threads must not outlive the device whose engines and callbacks they use, leak or not.
    for (auto& entry : left) entry.second->stop();
    left.clear();
    drain_event_pool();
    {
      const std::lock_guard events_lock(events_mu_);
      FERRY_ASSERT_NOTHROW(events_.empty(), fmt::format("host device destroyed while {} of its events live: "
                                                        "destroy events before their device",
                                                        events_.size()));
    }
    const std::uint64_t device_used = memory_.device_used();
    const std::uint64_t pinned = memory_.pinned();
    FERRY_ASSERT_NOTHROW(device_used == 0 && pinned == 0,
                         fmt::format("host device destroyed while buffers of {} device and {} pinned memory "
                                     "live: destroy buffers before their device",
                                     format_bytes(device_used), format_bytes(pinned)));
  }

  [[nodiscard]] device_info info() const override {
    device_info i;
    i.kind = backend::host;
    i.name = "ferry host emulator";
    i.ordinal = opt_.ordinal;
    i.memory_bytes = opt_.device_memory_bytes;
    i.copy_engines = 2;  // one per direction, as the link model has
    return i;
  }

 protected:
  // ---- streams ----

  void* do_stream_create() override {
    std::uint64_t number = 0;
    {
      const std::lock_guard lock(streams_mu_);
      number = streams_made_++;
    }
    auto s = std::make_shared<host_stream>(
        number, opt_, [this](std::exception_ptr e) { capture_callback_error(std::move(e)); });
    void* native = s.get();
    const std::lock_guard lock(streams_mu_);
    streams_.emplace(native, std::move(s));
    return native;
  }

  void do_stream_destroy(void* s) noexcept override {
    std::shared_ptr<host_stream> owned;
    {
      const std::lock_guard lock(streams_mu_);
      const auto it = streams_.find(s);
      if (it == streams_.end()) return;
      owned = std::move(it->second);
      streams_.erase(it);
    }
    // Unlike cudaStreamDestroy this waits for the queued work: a thread cannot be left behind to finish it
    // once the device may be gone.
    owned->stop();
  }

  void do_stream_synchronize(void* s) override {
    const api_span span = api(&trace_names::stream_synchronize, trace::sync_kind::stream, s);
    stream_of(s).synchronize();
  }

  void do_stream_wait(void* s, void* e) override {
    const api_span span = api(&trace_names::stream_wait, trace::sync_kind::stream_wait, s);
    auto ev = event_of(e).shared_from_this();
    const std::uint64_t generation = ev->recorded();
    host_stream& st = stream_of(s);
    st.enqueue([&st, ev = std::move(ev), generation] { st.advance_to(ev->wait_for(generation)); });
  }

  bool do_is_null_stream(void* s) const noexcept override { return s == nullptr; }

  void do_check_adopted_stream(void* s) const override {
    const std::lock_guard lock(streams_mu_);
    FERRY_EXPECTS(
        streams_.contains(s),
        fmt::format("adopt_stream({}): not a live stream of this host device; the host backend runs "
                    "work only on streams it made (pass the native() of one of its stream views)",
                    fmt::ptr(s)));
  }

  // ---- events ----

  void* do_event_create(bool /*timing: every host event keeps its completion time*/) override {
    auto ev = std::make_shared<host_event>();
    void* native = ev.get();
    const std::lock_guard lock(events_mu_);
    events_.emplace(native, std::move(ev));
    return native;
  }

  void do_event_destroy(void* e) noexcept override {
    std::shared_ptr<host_event> owned;
    const std::lock_guard lock(events_mu_);
    const auto it = events_.find(e);
    if (it == events_.end()) return;
    owned = std::move(it->second);
    events_.erase(it);
  }

  void do_event_record(void* e, void* s) override {
    const api_span span = api(&trace_names::event_record, trace::sync_kind::none, s);
    auto ev = event_of(e).shared_from_this();
    const std::uint64_t generation = ev->next_generation();
    host_stream& st = stream_of(s);
    st.enqueue([&st, ev = std::move(ev), generation] { ev->complete(generation, st.clock()); });
  }

  void do_event_synchronize(void* e) override {
    const api_span span = api(&trace_names::event_synchronize, trace::sync_kind::event, nullptr);
    host_event& ev = event_of(e);
    ev.wait_for(ev.recorded());
  }

  bool do_event_query(void* e) override {
    host_event& ev = event_of(e);
    return ev.reached(ev.recorded());
  }

  // Modelled time (host_stream::clock), as a GPU's events measure the GPU's time: a stream thread that a
  // busy machine runs late does not lengthen it.
  double do_elapsed_ms(void* start, void* stop) override {
    const auto t0 = event_of(start).completion_time();
    const auto t1 = event_of(stop).completion_time();
    FERRY_EXPECTS(t0.has_value(), "elapsed_ms: the start event has not completed yet; synchronize it first");
    FERRY_EXPECTS(t1.has_value(), "elapsed_ms: the stop event has not completed yet; synchronize it first");
    return std::chrono::duration<double, std::milli>(*t1 - *t0).count();
  }

  // ---- memory ----

  void* do_alloc(std::size_t bytes, memory_kind kind) override { return memory_.alloc(bytes, kind); }
  void do_free(void* p, std::size_t bytes, memory_kind kind) noexcept override {
    memory_.free(p, bytes, kind);
  }
  void do_register_host(void* p, std::size_t bytes) override { memory_.register_host(p, bytes); }
  void do_unregister_host(void* p, std::size_t bytes) noexcept override { memory_.unregister_host(p, bytes); }

  // ---- work ----

  void do_copy_async(void* dst, const void* src, std::size_t bytes, copy_direction dir, memory_kind src_kind,
                     memory_kind dst_kind, void* s) override {
    const bool pageable = src_kind == memory_kind::pageable || dst_kind == memory_kind::pageable;
    // A copy that waits for pageable memory to be consumed is a blocking copy, whatever its API says.
    const api_span span =
        api(&trace_names::copy_async, pageable ? trace::sync_kind::copy : trace::sync_kind::none, s);
    const double gbps = link_.bandwidth(dir, pageable);
    host_stream& st = stream_of(s);
    trace::event e = gpu_event(trace::activity::memcpy, st.number(), span);
    e.copy = host_backend::to_copy_kind(dir);
    e.src = host_backend::to_mem_kind(src_kind);
    e.dst = host_backend::to_mem_kind(dst_kind);
    e.bytes = bytes;
    e.async = true;
    const std::uint64_t ticket =
        st.enqueue(tracer_.traced(e, &trace_names::memcpy, [this, &st, dst, src, bytes, dir, gbps] {
          st.advance_to(link_.copy(dst, src, bytes, dir, gbps, st.clock()));
        }));
    // As with CUDA, a copy involving pageable memory returns only once that memory has been consumed or
    // filled, so the caller may reuse or read it at once; it still waits its turn in the stream.
    if (pageable) st.wait_done(ticket);
  }

  void do_memset_async(void* dst, std::uint8_t value, std::size_t bytes, memory_kind /*kind*/,
                       void* s) override {
    const api_span span = api(&trace_names::memset_async, trace::sync_kind::none, s);
    host_stream& st = stream_of(s);
    trace::event e = gpu_event(trace::activity::memset, st.number(), span);
    e.bytes = bytes;
    st.enqueue(tracer_.traced(e, &trace_names::memset, [this, &st, dst, value, bytes] {
      device_work(st, bytes, [&] { std::memset(dst, value, bytes); });
    }));
  }

  void do_fill_pattern_async(void* dst, std::size_t bytes, std::uint64_t seed, memory_kind /*kind*/,
                             void* s) override {
    launch_kernel(s, &trace_names::fill_pattern, bytes, [dst, bytes, seed] {
      fill_pattern({static_cast<std::byte*>(dst), bytes}, seed);
    });
  }

  void do_checksum_async(const void* src, std::size_t bytes, void* result, void* s) override {
    launch_kernel(s, &trace_names::checksum, bytes, [src, bytes, result] {
      const std::uint64_t sum = checksum64({static_cast<const std::byte*>(src), bytes});
      std::memcpy(result, &sum, sizeof sum);
    });
  }

  bool do_can_access_peer(device& peer) override { return same_group(peer) != nullptr; }

  void do_check_peer(device& peer) override {
    FERRY_EXPECTS(same_group(peer) != nullptr,
                  fmt::format("copy_peer_async from host device {} to host device {}: the two were made by "
                              "separate calls and share no peer link; make them together with "
                              "make_host_devices(n)",
                              ordinal(), peer.ordinal()));
  }

  void do_copy_peer_async(void* dst, device& dst_dev, const void* src, std::size_t bytes, void* s) override {
    const api_span span = api(&trace_names::copy_peer_async, trace::sync_kind::none, s);
    const std::size_t to = same_group(dst_dev)->peer_index_;
    host_stream& st = stream_of(s);
    trace::event e = gpu_event(trace::activity::memcpy, st.number(), span);
    e.copy = trace::copy_kind::p2p;
    e.src = trace::mem_kind::device;
    e.dst = trace::mem_kind::device;
    e.bytes = bytes;
    e.async = true;
    st.enqueue(tracer_.traced(e, &trace_names::memcpy, [this, &st, dst, src, bytes, to] {
      st.advance_to(peers_->copy(dst, src, bytes, peer_index_, to, st.clock()));
    }));
  }

  void do_launch_host_func(void* s, std::function<void()> fn) override {
    const api_span span = api(&trace_names::launch_host_func, trace::sync_kind::none, s);
    host_stream& st = stream_of(s);
    // A host function runs on the host: in modelled time it ends when it really returned.
    st.enqueue([&st, fn = std::move(fn)] {
      struct advance {
        host_stream& st;
        ~advance() { st.advance_to(host_stream::time_point::clock::now()); }
      } at_return{st};
      fn();
    });
  }

  void do_spin_async(std::chrono::nanoseconds duration, void* s) override {
    const api_span span = api(&trace_names::launch, trace::sync_kind::none, s);
    host_stream& st = stream_of(s);
    // A spin lasts exactly its duration of modelled time, and in wall time until its modelled end and at
    // least its duration from when the stream thread began it (see wall_end).
    st.enqueue(tracer_.traced(gpu_event(trace::activity::kernel, st.number(), span), &trace_names::spin,
                              [&st, duration] {
                                const auto began = host_stream::time_point::clock::now();
                                const auto end = st.clock() + duration;
                                std::this_thread::sleep_until(host_backend::wall_end(end, began, duration));
                                st.advance_to(end);
                              }));
  }

  void do_synchronize() override {
    const api_span span = api(&trace_names::device_synchronize, trace::sync_kind::device, nullptr);
    std::vector<std::shared_ptr<host_stream>> all;
    {
      const std::lock_guard lock(streams_mu_);
      all.reserve(streams_.size());
      for (const auto& entry : streams_) all.push_back(entry.second);
    }
    for (const auto& s : all) s->synchronize();
  }

  // The host backend has no profiler to start; the calls are counted so a debugger can see them.
  void do_profiler_start() override { profiler_starts_.fetch_add(1, std::memory_order_relaxed); }
  void do_profiler_stop() override { profiler_stops_.fetch_add(1, std::memory_order_relaxed); }
  void do_trace_begin(trace::recorder& r) override { tracer_.begin(r); }
  void do_trace_end() override { tracer_.end(); }

 private:
  /// The API event of an interface call on stream `s` (nullptr: none), while the call runs.
  [[nodiscard]] api_span api(host_backend::trace_name name, trace::sync_kind sync, void* s) noexcept {
    return api_span(tracer_, name, sync, number_of(s));
  }

  /// `peer` as a host device of this device's group (sharing its peer link), or nullptr.
  [[nodiscard]] host_device* same_group(device& peer) const noexcept {
    auto* other = dynamic_cast<host_device*>(&peer);
    return other != nullptr && other->peers_ == peers_ ? other : nullptr;
  }

  /// Queues `body` on `s` as a kernel launch over `bytes` bytes: an API call "launch kernel" and a GPU
  /// kernel event `name`.
  void launch_kernel(void* s, host_backend::trace_name name, std::size_t bytes, std::function<void()> body) {
    const api_span span = api(&trace_names::launch, trace::sync_kind::none, s);
    host_stream& st = stream_of(s);
    st.enqueue(tracer_.traced(gpu_event(trace::activity::kernel, st.number(), span), name,
                              [this, &st, bytes, body = std::move(body)] { device_work(st, bytes, body); }));
  }

  /// Runs device work over `bytes` bytes on stream thread `st`: it lasts its modelled time
  /// (link_model::device_work_end) and, with the link unmodelled, the wall time it took.
  void device_work(host_stream& st, std::size_t bytes, const std::function<void()>& body) {
    const auto t0 = host_stream::time_point::clock::now();
    body();
    if (link_.modelled()) {
      const auto end = link_.device_work_end(bytes, st.clock());
      std::this_thread::sleep_until(host_backend::wall_end(end, t0, end - st.clock()));
      st.advance_to(end);
    } else {
      st.advance_to(st.clock() + (host_stream::time_point::clock::now() - t0));
    }
  }

  const host_device_options opt_;
  host_backend::link_model link_;
  host_backend::host_memory memory_;
  host_backend::host_tracer tracer_;
  const std::shared_ptr<host_backend::peer_link> peers_;  // shared by the devices of this device's group
  const std::size_t peer_index_;                          // this device's place in the group

  mutable std::mutex streams_mu_;
  std::unordered_map<void*, std::shared_ptr<host_stream>> streams_;  // live streams, by native handle
  std::uint64_t streams_made_ = 0;                                   // numbers streams for their jitter seed

  std::mutex events_mu_;
  std::unordered_map<void*, std::shared_ptr<host_event>> events_;  // live events, by native handle

  std::atomic<std::uint64_t> profiler_starts_{0};
  std::atomic<std::uint64_t> profiler_stops_{0};
};

}  // namespace

std::unique_ptr<device> make_host_device(const host_device_options& options) {
  return std::make_unique<host_device>(options, std::make_shared<host_backend::peer_link>(options, 1), 0);
}

std::vector<std::unique_ptr<device>> make_host_devices(int n, const host_device_options& options) {
  FERRY_EXPECTS(n >= 1 && n <= max_host_devices,
                fmt::format("make_host_devices({}): a group holds 1 to {} devices", n, max_host_devices));
  FERRY_EXPECTS(options.ordinal >= 0 && options.ordinal <= std::numeric_limits<int>::max() - (n - 1),
                fmt::format("make_host_devices({}) from host_device_options::ordinal = {}: the ordinals must "
                            "lie in [0, {}]",
                            n, options.ordinal, std::numeric_limits<int>::max()));
  auto link = std::make_shared<host_backend::peer_link>(options, static_cast<std::size_t>(n));
  std::vector<std::unique_ptr<device>> devices;
  devices.reserve(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) {
    host_device_options o = options;
    o.ordinal = options.ordinal + i;
    devices.push_back(std::make_unique<host_device>(o, link, static_cast<std::size_t>(i)));
  }
  return devices;
}

}  // namespace ferry
