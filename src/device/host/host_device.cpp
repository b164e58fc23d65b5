// The host backend: an emulated GPU in plain C++ with the cuda backend's asynchronous semantics. Every
// pipeline runs on it in CI (which has no GPU), and its link model answers "what if the link were slower"
// without one. No CUDA header is reachable from here.
//
// The model:
// - A stream is a thread draining a FIFO of operations; streams run concurrently.
// - An event numbers its records (generations, bumped when record() is called) and keeps the set still
//   pending; a stream thread removes a generation when it reaches that record. A stream wait or a host
//   synchronize captures the generation current at the time of the call and blocks until that record is
//   reached: CUDA's "most recent record at the time of the call", including re-recording an event that is
//   still pending, and a record on another stream that completes first does not satisfy it.
// - Device memory is host memory tagged as device and capped at device_memory_bytes. Pinned memory is
//   mlock()ed, so the emulator runs into RLIMIT_MEMLOCK where real pinning would.
// - Copies really copy. With model_link, a copy takes at least latency + bytes / bandwidth. H2D and D2H
//   each have one copy engine shared by every stream (same-direction copies take turns, as on a GPU), and
//   while both engines are busy each runs at min(its bandwidth, duplex_gbps / 2).
//
// - Tracing (trace_begin): every operation a stream runs is a GPU event of the timeline (kernels for
//   spin, fill pattern and checksum; copies with their direction and memory kinds; memsets), and every
//   interface call is an API event on the calling thread, the blocking ones with their sync kind, as the
//   cuda backend's CUPTI recorder reports them.
//
// Lifetimes: streams, events and buffers must be destroyed before their device. The destructor drains and
// joins the threads of streams still alive and reports what was leaked, but frees nothing a user owns.
#include <fmt/format.h>
#include <pthread.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <shared_mutex>
#include <string>
#include <system_error>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "ferry/core/error.hpp"
#include "ferry/core/memlock.hpp"
#include "ferry/core/pattern.hpp"
#include "ferry/core/units.hpp"
#include "ferry/device/device.hpp"
#include "ferry/trace/timeline.hpp"

namespace ferry {
namespace {

using steady = std::chrono::steady_clock;

// cudaMalloc's alignment, so code that relies on it on a GPU is exercised with the same guarantee here.
constexpr std::size_t device_alignment = 256;

// The link model sleeps after each slice of a copy and re-reads whether the other direction is busy, so
// a duplex slowdown takes effect within this much modelled time.
constexpr double copy_slice_ns = 250e3;
constexpr std::size_t min_copy_slice = 64 * KiB;

std::size_t page_size() noexcept {
  static const std::size_t page = [] {
    const long p = ::sysconf(_SC_PAGESIZE);
    return p > 0 ? static_cast<std::size_t>(p) : std::size_t{4096};
  }();
  return page;
}

// Pinned buffers cover whole pages so that no page is shared by two locked buffers: mlock does not count
// per range, and munlock of one buffer would unlock the other's shared page.
std::size_t pinned_footprint(std::size_t bytes) noexcept {
  const std::size_t page = page_size();
  return (bytes + page - 1) / page * page;
}

void* aligned_alloc_or_null(std::size_t alignment, std::size_t bytes) noexcept {
  void* p = nullptr;
  return ::posix_memalign(&p, alignment, bytes) == 0 ? p : nullptr;
}

// One emulated event. Shared (through shared_from_this) by the operations that record or wait on it, so
// destroying an event whose record or wait is still queued is safe, as it is with cudaEventDestroy.
// A wait is bound to one record (generation), as in CUDA: when an event is recorded on two streams, a wait
// on the first record is not satisfied by the second completing first. So the event keeps the set of
// records still pending rather than a single "completed up to" mark.
class host_event : public std::enable_shared_from_this<host_event> {
 public:
  /// The generation the record being enqueued will complete; called on the recording thread.
  std::uint64_t next_generation() {
    const std::lock_guard lock(mu_);
    const std::uint64_t generation = recorded_.load(std::memory_order_relaxed) + 1;
    pending_.push_back(generation);
    recorded_.store(generation, std::memory_order_release);
    return generation;
  }
  [[nodiscard]] std::uint64_t recorded() const noexcept { return recorded_.load(std::memory_order_acquire); }

  /// Called by a stream thread when it reaches the record of `generation`.
  void complete(std::uint64_t generation) {
    const auto now = steady::now();
    {
      const std::lock_guard lock(mu_);
      std::erase(pending_, generation);
      if (generation > latest_completed_) {
        latest_completed_ = generation;
        completed_at_ = now;
      }
    }
    cv_.notify_all();
  }

  void wait_for(std::uint64_t generation) {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return done_locked(generation); });
  }

  [[nodiscard]] bool reached(std::uint64_t generation) {
    const std::lock_guard lock(mu_);
    return done_locked(generation);
  }

  /// When the most recent record completed, or nothing while it is pending.
  [[nodiscard]] std::optional<steady::time_point> completion_time() {
    const std::uint64_t target = recorded();
    const std::lock_guard lock(mu_);
    if (!done_locked(target)) return std::nullopt;
    return completed_at_;
  }

 private:
  [[nodiscard]] bool done_locked(std::uint64_t generation) const {
    return std::find(pending_.begin(), pending_.end(), generation) == pending_.end();
  }

  std::atomic<std::uint64_t> recorded_{0};
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::uint64_t> pending_;     // records queued but not reached; guarded by mu_
  std::uint64_t latest_completed_ = 0;     // guarded by mu_
  steady::time_point completed_at_{};     // guarded by mu_
};

// One emulated stream: a thread that runs queued operations in order. Every operation counts as done once
// it has returned, which is what synchronize and the blocking pageable copies wait for.
class host_stream {
 public:
  using operation = std::function<void()>;
  using error_sink = std::function<void(std::exception_ptr)>;

  host_stream(std::uint64_t number, const host_device_options& options, error_sink on_error)
      : number_(number),
        jitter_probability_(options.jitter_probability),
        jitter_max_(options.jitter_max),
        on_error_(std::move(on_error)) {
    // Seeded from the device's seed and the stream's number, so a run that fails under jitter replays the
    // same delays when the streams are made in the same order.
    std::seed_seq seq{static_cast<std::uint32_t>(options.seed), static_cast<std::uint32_t>(options.seed >> 32),
                      static_cast<std::uint32_t>(number), static_cast<std::uint32_t>(number >> 32)};
    rng_.seed(seq);
    thread_ = std::thread([this] { run(); });
  }

  host_stream(const host_stream&) = delete;
  host_stream& operator=(const host_stream&) = delete;
  ~host_stream() { stop(); }

  [[nodiscard]] std::uint64_t number() const noexcept { return number_; }

  /// Queues `op`; returns its ticket, which wait_done takes.
  std::uint64_t enqueue(operation op) {
    std::uint64_t ticket = 0;
    {
      const std::lock_guard lock(mu_);
      queue_.push_back(std::move(op));
      ticket = ++enqueued_;
    }
    work_cv_.notify_one();
    return ticket;
  }

  /// Blocks until the operation with `ticket` (and so every earlier one) has run.
  void wait_done(std::uint64_t ticket) {
    std::unique_lock lock(mu_);
    done_cv_.wait(lock, [&] { return done_ >= ticket; });
  }

  /// Blocks until everything queued before the call has run.
  void synchronize() {
    std::unique_lock lock(mu_);
    const std::uint64_t target = enqueued_;
    done_cv_.wait(lock, [&] { return done_ >= target; });
  }

  /// Lets the thread drain the queue, then joins it. Idempotent.
  void stop() noexcept {
    {
      const std::lock_guard lock(mu_);
      stopping_ = true;
    }
    work_cv_.notify_one();
    if (thread_.joinable()) thread_.join();
  }

 private:
  void run() noexcept {
    const std::string name = fmt::format("ferry-host-{}", number_ % 10000);
    static_cast<void>(::pthread_setname_np(::pthread_self(), name.c_str()));
    for (;;) {
      operation op;
      {
        std::unique_lock lock(mu_);
        work_cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
        if (queue_.empty()) return;
        op = std::move(queue_.front());
        queue_.pop_front();
      }
      maybe_delay();
      try {
        op();
      } catch (...) {
        // Only host callbacks throw; as on CUDA, the stream goes on and the error surfaces at the next
        // synchronize.
        on_error_(std::current_exception());
      }
      // Release what the operation captured before anyone waiting on it is told it is done.
      op = nullptr;
      {
        const std::lock_guard lock(mu_);
        ++done_;
      }
      done_cv_.notify_all();
    }
  }

  void maybe_delay() {
    if (jitter_probability_ <= 0 || jitter_max_.count() <= 0) return;
    if (!std::bernoulli_distribution(jitter_probability_)(rng_)) return;
    std::uniform_int_distribution<std::int64_t> delay(0, jitter_max_.count());
    std::this_thread::sleep_for(std::chrono::nanoseconds(delay(rng_)));
  }

  const std::uint64_t number_;
  const double jitter_probability_;
  const std::chrono::nanoseconds jitter_max_;
  const error_sink on_error_;
  std::mt19937_64 rng_;  // used by the stream thread only

  std::mutex mu_;
  std::condition_variable work_cv_;
  std::condition_variable done_cv_;
  std::deque<operation> queue_;  // guarded by mu_
  std::uint64_t enqueued_ = 0;   // guarded by mu_
  std::uint64_t done_ = 0;       // guarded by mu_
  bool stopping_ = false;        // guarded by mu_
  std::thread thread_;           // started in the constructor body, once every member above exists
};

// A DMA engine of one direction: streams take turns on it, so two copies in the same direction share the
// link's bandwidth instead of each getting all of it.
struct copy_engine {
  std::mutex mu;
  std::atomic<bool> busy{false};  // read by the other direction's engine for the duplex limit
};

host_event& event_of(void* e) noexcept { return *static_cast<host_event*>(e); }
host_stream& stream_of(void* s) noexcept { return *static_cast<host_stream*>(s); }

void expect_bandwidth(double gbps, std::string_view name) {
  FERRY_EXPECTS(gbps > 0 && std::isfinite(gbps),
                fmt::format("host_device_options::{} = {}: a modelled bandwidth must be a positive number of "
                            "GB/s (set model_link = false to copy at memcpy speed)",
                            name, gbps));
}

class host_device final : public device {
 public:
  explicit host_device(const host_device_options& options) : device(backend::host), opt_(options) {
    if (opt_.model_link) {
      expect_bandwidth(opt_.h2d_gbps, "h2d_gbps");
      expect_bandwidth(opt_.d2h_gbps, "d2h_gbps");
      expect_bandwidth(opt_.pageable_h2d_gbps, "pageable_h2d_gbps");
      expect_bandwidth(opt_.pageable_d2h_gbps, "pageable_d2h_gbps");
      expect_bandwidth(opt_.duplex_gbps, "duplex_gbps");
      expect_bandwidth(opt_.d2d_gbps, "d2d_gbps");
      FERRY_EXPECTS(opt_.latency.count() >= 0,
                    fmt::format("host_device_options::latency = {} ns: must not be negative",
                                opt_.latency.count()));
    }
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
    FERRY_ASSERT_NOTHROW(left.empty(), fmt::format("host device destroyed while {} of its streams live: destroy "
                                                   "streams, events and buffers before their device",
                                                   left.size()));
    // Threads must not outlive the device whose engines and callbacks they use, leak or not.
    for (auto& entry : left) entry.second->stop();
    left.clear();
    drain_event_pool();
    const std::lock_guard events_lock(events_mu_);
    FERRY_ASSERT_NOTHROW(events_.empty(), fmt::format("host device destroyed while {} of its events live: "
                                                      "destroy events before their device",
                                                      events_.size()));
    const std::lock_guard memory_lock(memory_mu_);
    FERRY_ASSERT_NOTHROW(device_used_ == 0 && locked_ == 0,
                         fmt::format("host device destroyed while buffers of {} device and {} pinned memory "
                                     "live: destroy buffers before their device",
                                     format_bytes(device_used_), format_bytes(locked_)));
  }

  [[nodiscard]] device_info info() const override {
    device_info i;
    i.kind = backend::host;
    i.name = "ferry host emulator";
    i.ordinal = 0;
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
    auto s = std::make_shared<host_stream>(number, opt_,
                                           [this](std::exception_ptr e) { capture_callback_error(std::move(e)); });
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
    const api_span span(*this, &trace_names::stream_synchronize, trace::sync_kind::stream, s);
    stream_of(s).synchronize();
  }

  void do_stream_wait(void* s, void* e) override {
    const api_span span(*this, &trace_names::stream_wait, trace::sync_kind::stream_wait, s);
    auto ev = event_of(e).shared_from_this();
    const std::uint64_t generation = ev->recorded();
    stream_of(s).enqueue([ev = std::move(ev), generation] { ev->wait_for(generation); });
  }

  bool do_is_null_stream(void* s) const noexcept override { return s == nullptr; }

  void do_check_adopted_stream(void* s) const override {
    const std::lock_guard lock(streams_mu_);
    FERRY_EXPECTS(streams_.contains(s),
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
    const api_span span(*this, &trace_names::event_record, trace::sync_kind::none, s);
    auto ev = event_of(e).shared_from_this();
    const std::uint64_t generation = ev->next_generation();
    stream_of(s).enqueue([ev = std::move(ev), generation] { ev->complete(generation); });
  }

  void do_event_synchronize(void* e) override {
    const api_span span(*this, &trace_names::event_synchronize, trace::sync_kind::event, nullptr);
    host_event& ev = event_of(e);
    ev.wait_for(ev.recorded());
  }

  bool do_event_query(void* e) override {
    host_event& ev = event_of(e);
    return ev.reached(ev.recorded());
  }

  double do_elapsed_ms(void* start, void* stop) override {
    const auto t0 = event_of(start).completion_time();
    const auto t1 = event_of(stop).completion_time();
    FERRY_EXPECTS(t0.has_value(), "elapsed_ms: the start event has not completed yet; synchronize it first");
    FERRY_EXPECTS(t1.has_value(), "elapsed_ms: the stop event has not completed yet; synchronize it first");
    return std::chrono::duration<double, std::milli>(*t1 - *t0).count();
  }

  // ---- memory ----

  void* do_alloc(std::size_t bytes, memory_kind kind) override {
    switch (kind) {
      case memory_kind::device: return alloc_device_memory(bytes);
      case memory_kind::pinned: return alloc_pinned_memory(bytes);
      case memory_kind::pageable: {
        void* p = aligned_alloc_or_null(page_size(), bytes);
        if (p == nullptr) {
          throw out_of_memory(fmt::format("pageable allocation of {} failed: the host is out of memory",
                                          format_bytes(bytes)));
        }
        return p;
      }
    }
    return nullptr;
  }

  void do_free(void* p, std::size_t bytes, memory_kind kind) noexcept override {
    switch (kind) {
      case memory_kind::device: {
        std::free(p);
        const std::lock_guard lock(memory_mu_);
        device_used_ -= bytes;
        return;
      }
      case memory_kind::pinned: {
        const std::size_t footprint = pinned_footprint(bytes);
        FERRY_ASSERT_NOTHROW(::munlock(p, footprint) == 0,
                             fmt::format("munlock of a pinned buffer of {} failed: {}", format_bytes(bytes),
                                         std::generic_category().message(errno)));
        std::free(p);
        const std::lock_guard lock(memory_mu_);
        locked_ -= footprint;
        return;
      }
      case memory_kind::pageable: std::free(p); return;
    }
  }

  // ---- work ----

  void do_copy_async(void* dst, const void* src, std::size_t bytes, copy_direction dir, memory_kind src_kind,
                     memory_kind dst_kind, void* s) override {
    const bool pageable = src_kind == memory_kind::pageable || dst_kind == memory_kind::pageable;
    // A copy that waits for pageable memory to be consumed is a blocking copy, whatever its API says.
    api_span span(*this, &trace_names::copy_async, pageable ? trace::sync_kind::copy : trace::sync_kind::none, s);
    const double gbps = bandwidth(dir, pageable);
    host_stream& st = stream_of(s);
    trace::event e = gpu_event(trace::activity::memcpy, st, span);
    e.copy = to_copy_kind(dir);
    e.src = to_mem_kind(src_kind);
    e.dst = to_mem_kind(dst_kind);
    e.bytes = bytes;
    e.async = true;
    const std::uint64_t ticket = st.enqueue(
        traced(e, &trace_names::memcpy, [this, dst, src, bytes, dir, gbps] { run_copy(dst, src, bytes, dir, gbps); }));
    // As with CUDA, a copy involving pageable memory returns only once that memory has been consumed or
    // filled, so the caller may reuse or read it at once; it still waits its turn in the stream.
    if (pageable) st.wait_done(ticket);
  }

  void do_memset_async(void* dst, std::uint8_t value, std::size_t bytes, memory_kind /*kind*/, void* s) override {
    const api_span span(*this, &trace_names::memset_async, trace::sync_kind::none, s);
    host_stream& st = stream_of(s);
    trace::event e = gpu_event(trace::activity::memset, st, span);
    e.bytes = bytes;
    st.enqueue(traced(e, &trace_names::memset, [dst, value, bytes] { std::memset(dst, value, bytes); }));
  }

  void do_fill_pattern_async(void* dst, std::size_t bytes, std::uint64_t seed, memory_kind /*kind*/,
                             void* s) override {
    const api_span span(*this, &trace_names::launch, trace::sync_kind::none, s);
    host_stream& st = stream_of(s);
    st.enqueue(traced(gpu_event(trace::activity::kernel, st, span), &trace_names::fill_pattern,
                      [dst, bytes, seed] { fill_pattern({static_cast<std::byte*>(dst), bytes}, seed); }));
  }

  void do_checksum_async(const void* src, std::size_t bytes, void* result, void* s) override {
    const api_span span(*this, &trace_names::launch, trace::sync_kind::none, s);
    host_stream& st = stream_of(s);
    st.enqueue(traced(gpu_event(trace::activity::kernel, st, span), &trace_names::checksum, [src, bytes, result] {
      const std::uint64_t sum = checksum64({static_cast<const std::byte*>(src), bytes});
      std::memcpy(result, &sum, sizeof sum);
    }));
  }

  void do_launch_host_func(void* s, std::function<void()> fn) override {
    const api_span span(*this, &trace_names::launch_host_func, trace::sync_kind::none, s);
    stream_of(s).enqueue(std::move(fn));
  }

  void do_spin_async(std::chrono::nanoseconds duration, void* s) override {
    const api_span span(*this, &trace_names::launch, trace::sync_kind::none, s);
    host_stream& st = stream_of(s);
    st.enqueue(traced(gpu_event(trace::activity::kernel, st, span), &trace_names::spin,
                      [duration] { std::this_thread::sleep_for(duration); }));
  }

  void do_synchronize() override {
    const api_span span(*this, &trace_names::device_synchronize, trace::sync_kind::device, nullptr);
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
  void do_trace_begin(trace::recorder& r) override {
    const std::unique_lock lock(trace_mu_);
    names_ = trace_names{
        .memcpy = r.intern("memcpy"),
        .memset = r.intern("memset"),
        .spin = r.intern("spin"),
        .fill_pattern = r.intern("fill pattern"),
        .checksum = r.intern("checksum"),
        .copy_async = r.intern("copy_async"),
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
  // Waits for recordings in progress, so the recorder may be destroyed once this returns.
  void do_trace_end() override {
    const std::unique_lock lock(trace_mu_);
    tracer_.store(nullptr, std::memory_order_release);
  }

 private:
  // The string ids of the names this backend records, interned once per trace.
  struct trace_names {
    std::uint32_t memcpy, memset, spin, fill_pattern, checksum;
    std::uint32_t copy_async, memset_async, launch, launch_host_func, event_record, stream_wait;
    std::uint32_t stream_synchronize, event_synchronize, device_synchronize;
  };

  /// Calls fn(recorder, names) while a trace is on, holding it open against trace_end.
  template <class F>
  void with_tracer(F&& fn) noexcept {
    if (tracer_.load(std::memory_order_acquire) == nullptr) return;
    const std::shared_lock lock(trace_mu_);
    trace::recorder* r = tracer_.load(std::memory_order_acquire);
    if (r != nullptr) fn(*r, names_);
  }

  /// An API event on the calling thread from construction to destruction.
  class api_span {
   public:
    api_span(host_device& dev, std::uint32_t trace_names::*name, trace::sync_kind sync, void* s) noexcept
        : dev_(dev), name_(name), sync_(sync), stream_(s == nullptr ? 0 : stream_of(s).number()) {
      if (dev_.tracer_.load(std::memory_order_relaxed) == nullptr) return;
      start_ns_ = trace::now_ns();
      correlation_ = dev_.correlations_.fetch_add(1, std::memory_order_relaxed) + 1;
    }
    api_span(const api_span&) = delete;
    api_span& operator=(const api_span&) = delete;
    ~api_span() {
      if (start_ns_ == 0) return;
      dev_.with_tracer([&](trace::recorder& r, const trace_names& names) {
        trace::event e;
        e.kind = trace::activity::api;
        e.start_ns = start_ns_;
        e.end_ns = trace::now_ns();
        e.name = names.*name_;
        e.thread = trace::this_thread_id();
        e.stream = stream_;
        e.device = 0;
        e.sync = sync_;
        e.correlation = correlation_;
        r.record(e);
      });
    }
    /// Links the call with the GPU work it issues, as CUPTI's correlation ids do; 0 when not tracing.
    [[nodiscard]] std::uint64_t correlation() const noexcept { return correlation_; }

   private:
    host_device& dev_;
    std::uint32_t trace_names::*name_;
    trace::sync_kind sync_;
    std::uint64_t stream_;
    std::int64_t start_ns_ = 0;
    std::uint64_t correlation_ = 0;
  };

  /// A GPU event of `st`, correlated with the API call (span) that issues it.
  static trace::event gpu_event(trace::activity kind, const host_stream& st, const api_span& issued_by) noexcept {
    trace::event e;
    e.kind = kind;
    e.device = 0;
    e.stream = st.number();
    e.correlation = issued_by.correlation();
    return e;
  }

  /// `op`, recorded as event `e` (named by `name`) when it runs while a trace is on.
  host_stream::operation traced(trace::event e, std::uint32_t trace_names::*name, host_stream::operation op) {
    if (tracer_.load(std::memory_order_relaxed) == nullptr) return op;
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

  static trace::copy_kind to_copy_kind(copy_direction dir) noexcept {
    switch (dir) {
      case copy_direction::host_to_device: return trace::copy_kind::h2d;
      case copy_direction::device_to_host: return trace::copy_kind::d2h;
      case copy_direction::device_to_device: return trace::copy_kind::d2d;
      case copy_direction::host_to_host: return trace::copy_kind::h2h;
    }
    return trace::copy_kind::none;
  }

  static trace::mem_kind to_mem_kind(memory_kind k) noexcept {
    switch (k) {
      case memory_kind::device: return trace::mem_kind::device;
      case memory_kind::pinned: return trace::mem_kind::pinned;
      case memory_kind::pageable: return trace::mem_kind::pageable;
    }
    return trace::mem_kind::unknown;
  }

  void* alloc_device_memory(std::size_t bytes) {
    {
      const std::lock_guard lock(memory_mu_);
      const std::uint64_t total = opt_.device_memory_bytes;
      const std::uint64_t free_bytes = total - std::min(total, device_used_);
      if (bytes > free_bytes) {
        throw out_of_memory(fmt::format("device allocation of {} does not fit: the emulated device has {} free "
                                        "of {} (host_device_options::device_memory_bytes)",
                                        format_bytes(bytes), format_bytes(free_bytes), format_bytes(total)));
      }
      device_used_ += bytes;
    }
    void* p = aligned_alloc_or_null(device_alignment, bytes);
    if (p == nullptr) {
      const std::lock_guard lock(memory_mu_);
      device_used_ -= bytes;
      throw out_of_memory(fmt::format("device allocation of {} failed: the host backing the emulated device "
                                      "is out of memory",
                                      format_bytes(bytes)));
    }
    return p;
  }

  void* alloc_pinned_memory(std::size_t bytes) {
    if (bytes > std::numeric_limits<std::size_t>::max() - page_size()) {
      throw out_of_memory(fmt::format("pinned allocation of {} bytes is larger than any address space", bytes));
    }
    const std::size_t footprint = pinned_footprint(bytes);
    // Checking the limit, locking and counting happen under one lock: two threads that each fit alone
    // must not both pass the check.
    const std::lock_guard pin_lock(pin_mu_);
    const memlock_info limit = read_memlock();
    std::uint64_t locked = 0;
    {
      const std::lock_guard lock(memory_mu_);
      locked = locked_;
    }
    check_memlock(footprint, locked, limit);
    void* p = aligned_alloc_or_null(page_size(), footprint);
    if (p == nullptr) {
      throw out_of_memory(fmt::format("pinned allocation of {} failed: the host is out of memory",
                                      format_bytes(bytes)));
    }
    if (::mlock(p, footprint) != 0) {
      const int err = errno;
      std::free(p);
      // Other locked memory of the process (another device, a framework) counts against the same limit,
      // which is how this can fail after check_memlock passed.
      throw out_of_memory(fmt::format("pinning {} of host memory failed: mlock: {}; this device holds {} locked "
                                      "already and RLIMIT_MEMLOCK is {} (raise it with ulimit -l, or "
                                      "LimitMEMLOCK= for a service)",
                                      format_bytes(bytes), std::generic_category().message(err),
                                      format_bytes(locked), limit.describe()));
    }
    const std::lock_guard lock(memory_mu_);
    locked_ += footprint;
    return p;
  }

  [[nodiscard]] double bandwidth(copy_direction dir, bool pageable) const noexcept {
    switch (dir) {
      case copy_direction::host_to_device: return pageable ? opt_.pageable_h2d_gbps : opt_.h2d_gbps;
      case copy_direction::device_to_host: return pageable ? opt_.pageable_d2h_gbps : opt_.d2h_gbps;
      case copy_direction::device_to_device: return opt_.d2d_gbps;
      case copy_direction::host_to_host: return 0;  // unmodelled: a host memcpy
    }
    return 0;
  }

  // Runs on a stream thread. The copy is done in slices; after each, the thread sleeps until the modelled
  // time of the bytes copied so far (measured from the copy's start, so oversleeping never accumulates).
  // A copy therefore never finishes before its modelled duration, and takes memcpy's time when that is
  // longer.
  void run_copy(void* dst, const void* src, std::size_t bytes, copy_direction dir, double gbps) {
    auto* out = static_cast<std::byte*>(dst);
    const auto* in = static_cast<const std::byte*>(src);
    if (!opt_.model_link || dir == copy_direction::host_to_host) {
      std::memcpy(out, in, bytes);
      return;
    }
    copy_engine* own = nullptr;
    copy_engine* other = nullptr;
    if (dir == copy_direction::host_to_device) {
      own = &h2d_engine_;
      other = &d2h_engine_;
    } else if (dir == copy_direction::device_to_host) {
      own = &d2h_engine_;
      other = &h2d_engine_;
    }
    std::unique_lock<std::mutex> engine_lock;
    if (own != nullptr) {
      engine_lock = std::unique_lock(own->mu);
      own->busy.store(true, std::memory_order_relaxed);
    }
    const auto start = steady::now();
    // GB/s are 1e9 bytes per second: one byte per nanosecond.
    double due_ns = static_cast<double>(opt_.latency.count());
    std::size_t done = 0;
    while (done < bytes) {
      double rate = gbps;
      if (other != nullptr && other->busy.load(std::memory_order_relaxed)) {
        rate = std::min(rate, opt_.duplex_gbps / 2);
      }
      const auto slice_target = static_cast<std::size_t>(rate * copy_slice_ns);
      const std::size_t slice = std::min(bytes - done, std::max(min_copy_slice, slice_target));
      std::memcpy(out + done, in + done, slice);
      done += slice;
      due_ns += static_cast<double>(slice) / rate;
      std::this_thread::sleep_until(start + std::chrono::nanoseconds(std::llround(due_ns)));
    }
    if (own != nullptr) own->busy.store(false, std::memory_order_relaxed);
  }

  const host_device_options opt_;

  mutable std::mutex streams_mu_;
  std::unordered_map<void*, std::shared_ptr<host_stream>> streams_;  // live streams, by native handle
  std::uint64_t streams_made_ = 0;                                    // numbers streams for their jitter seed

  std::mutex events_mu_;
  std::unordered_map<void*, std::shared_ptr<host_event>> events_;  // live events, by native handle

  std::mutex pin_mu_;              // serializes pinning: limit check, mlock and count
  std::mutex memory_mu_;           // guards the two counters below
  std::uint64_t device_used_ = 0;  // bytes of emulated device memory allocated
  std::uint64_t locked_ = 0;       // bytes this device has mlock()ed

  copy_engine h2d_engine_;
  copy_engine d2h_engine_;

  std::atomic<std::uint64_t> profiler_starts_{0};
  std::atomic<std::uint64_t> profiler_stops_{0};
  std::atomic<trace::recorder*> tracer_{nullptr};  // set between trace_begin and trace_end
  std::shared_mutex trace_mu_;  // held shared while recording, exclusively to attach or detach
  trace_names names_{};         // guarded by trace_mu_
  std::atomic<std::uint64_t> correlations_{0};  // correlation ids handed out to traced API calls
};

}  // namespace

std::unique_ptr<device> make_host_device(const host_device_options& options) {
  return std::make_unique<host_device>(options);
}

}  // namespace ferry
