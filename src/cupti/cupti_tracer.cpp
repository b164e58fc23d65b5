// The CUPTI recorder: CUPTI's activity API delivers records in buffers ferry hands it; each completed
// buffer is converted into trace::events and recorded (late) into the recorder of the running trace.
//
// Library: ferry links no CUPTI; the first begin() loads libcupti through ferry::shim (shim/cupti.hpp)
// and throws cuda_error naming every library tried when none opens. Nothing else needs CUPTI.
//
// Clock: ferry registers cuptiActivityRegisterTimestampCallback returning trace::now_ns() (steady_clock,
// i.e. CLOCK_MONOTONIC), so CUPTI stamps CPU records with ferry's clock and interpolates GPU timestamps
// onto it. begin() checks that the callback took effect (cuptiGetTimestamp() agrees with now_ns()); when
// it did not, it measures the offset between CUPTI's clock and now_ns() once and adds it to every record.
//
// NVTX: CUPTI sees NVTX ranges only as the process' NVTX injection library. begin() sets
// NVTX_INJECTION64_PATH to the libcupti ferry loaded (its full path) when it is unset. NVTX reads
// the variable once, at the process' first NVTX call: ranges are captured only when that first call comes
// after the first begin() (or when the variable was set before the process started).
//
// Threads: records name OS thread ids (gettid, as trace::this_thread_id), set with cuptiSetThreadIdType.
// CUPTI calls the buffer callbacks on its own threads (and on the thread of end(), which
// flushes); one mutex guards the session.
#include "ferry/cupti/cupti_tracer.hpp"

#include <cuda.h>
#include <cupti.h>
#include <cxxabi.h>
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "ferry/core/error.hpp"
#include "ferry/core/unique_handle.hpp"
#include "ferry/shim/cupti.hpp"
#include "ferry/trace/timeline.hpp"

namespace ferry::cupti {
namespace {

using trace::activity;
using trace::copy_kind;
using trace::mem_kind;
using trace::sync_kind;

constexpr std::size_t buffer_bytes = std::size_t{8} << 20;
constexpr std::size_t buffer_align = ACTIVITY_RECORD_ALIGNMENT;
constexpr std::size_t pool_buffers = 4;  // allocated at begin(); the pool grows only if CUPTI wants more

// CUPTI's entry points (ferry::shim loads libcupti at the first trace_begin). Only called once begin()
// has loaded them: every CUPTI callback and end() run after a successful begin().
const shim::cupti_api& api() { return shim::cupti(); }

[[noreturn]] void throw_cupti_error(CUptiResult status, const char* call) {
  const char* text = nullptr;
  if (api().get_result_string(status, &text) != CUPTI_SUCCESS || text == nullptr)
    text = "unknown CUPTI result";
  std::string hint;
  if (status == CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED || status == CUPTI_ERROR_NOT_COMPATIBLE)
    hint = "; another profiler (Nsight Systems, the PyTorch profiler) may hold CUPTI in this process";
  else if (status == CUPTI_ERROR_INSUFFICIENT_PRIVILEGES)
    hint = "; the driver restricts profiling to admin users (NVreg_RestrictProfilingToAdminUsers)";
  throw cuda_error(static_cast<int>(status), fmt::format("{} failed: {} (CUPTI result {}){}", call, text,
                                                         static_cast<int>(status), hint));
}

// `what` names the CUPTI function as its documentation does (the call goes through ferry::shim's table).
#define FERRY_CUPTI_TRY(call, what)                        \
  do {                                                     \
    const CUptiResult ferry_cupti_status_ = (call);        \
    if (ferry_cupti_status_ != CUPTI_SUCCESS) [[unlikely]] \
      throw_cupti_error(ferry_cupti_status_, what);        \
  } while (0)

std::uint64_t CUPTIAPI ferry_timestamp() { return static_cast<std::uint64_t>(trace::now_ns()); }

copy_kind to_copy_kind(std::uint8_t k) noexcept {
  switch (k) {
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOD:
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOA: return copy_kind::h2d;
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOH:
    case CUPTI_ACTIVITY_MEMCPY_KIND_ATOH: return copy_kind::d2h;
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOD:
    case CUPTI_ACTIVITY_MEMCPY_KIND_ATOA:
    case CUPTI_ACTIVITY_MEMCPY_KIND_ATOD:
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOA: return copy_kind::d2d;
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOH: return copy_kind::h2h;
    case CUPTI_ACTIVITY_MEMCPY_KIND_PTOP: return copy_kind::p2p;
    default: return copy_kind::none;
  }
}

mem_kind to_mem_kind(unsigned k) noexcept {
  switch (k) {
    case CUPTI_ACTIVITY_MEMORY_KIND_PAGEABLE: return mem_kind::pageable;
    case CUPTI_ACTIVITY_MEMORY_KIND_PINNED: return mem_kind::pinned;
    case CUPTI_ACTIVITY_MEMORY_KIND_DEVICE:
    case CUPTI_ACTIVITY_MEMORY_KIND_DEVICE_STATIC:
    case CUPTI_ACTIVITY_MEMORY_KIND_ARRAY: return mem_kind::device;
    case CUPTI_ACTIVITY_MEMORY_KIND_MANAGED:
    case CUPTI_ACTIVITY_MEMORY_KIND_MANAGED_STATIC: return mem_kind::managed;
    default: return mem_kind::unknown;
  }
}

sync_kind to_sync_kind(CUpti_ActivitySynchronizationType t) noexcept {
  switch (t) {
    case CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_EVENT_SYNCHRONIZE: return sync_kind::event;
    case CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_STREAM_WAIT_EVENT: return sync_kind::stream_wait;
    case CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_STREAM_SYNCHRONIZE: return sync_kind::stream;
    case CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_CONTEXT_SYNCHRONIZE: return sync_kind::device;
    default: return sync_kind::none;
  }
}

std::string_view sync_api_name(sync_kind k) noexcept {
  switch (k) {
    case sync_kind::event: return "cudaEventSynchronize";
    case sync_kind::stream: return "cudaStreamSynchronize";
    case sync_kind::device: return "cudaDeviceSynchronize";
    case sync_kind::stream_wait: return "cudaStreamWaitEvent";
    default: return "cuda synchronization";
  }
}

// "cudaStreamSynchronize_ptsz_v7000" -> "cudaStreamSynchronize": the version and per-thread-stream
// suffixes of CUPTI's callback names.
std::string_view api_base_name(std::string_view name) noexcept {
  const std::size_t v = name.rfind("_v");
  if (v != std::string_view::npos && v + 2 < name.size() &&
      std::all_of(name.begin() + static_cast<std::ptrdiff_t>(v) + 2, name.end(),
                  [](char c) { return c >= '0' && c <= '9'; }))
    name = name.substr(0, v);
  for (std::string_view suffix : {"_ptsz", "_ptds"}) {
    if (name.size() > suffix.size() && name.substr(name.size() - suffix.size()) == suffix)
      name = name.substr(0, name.size() - suffix.size());
  }
  return name;
}

// What a runtime API call waited for, by its name.
sync_kind api_sync_kind(std::string_view name) noexcept {
  if (name == "cudaStreamSynchronize") return sync_kind::stream;
  if (name == "cudaDeviceSynchronize" || name == "cudaThreadSynchronize") return sync_kind::device;
  if (name == "cudaEventSynchronize") return sync_kind::event;
  if (name == "cudaStreamWaitEvent") return sync_kind::stream_wait;
  // cudaMemcpy, cudaMemcpy2D, cudaMemcpyPeer, cudaMemcpyToSymbol...: the blocking copies.
  if (name.starts_with("cudaMemcpy") && name.find("Async") == std::string_view::npos) return sync_kind::copy;
  return sync_kind::none;
}

// A demangled kernel name without its parameter list: "ferry::cuda_kernels::fill_pattern(...)" reads as
// "ferry::cuda_kernels::fill_pattern".
std::string kernel_display_name(const char* mangled) {
  if (mangled == nullptr) return "kernel";
  int status = 0;
  std::unique_ptr<char, decltype(&std::free)> demangled(
      abi::__cxa_demangle(mangled, nullptr, nullptr, &status), &std::free);
  std::string name = status == 0 && demangled ? demangled.get() : mangled;
  if (!name.empty() && name.back() == ')') {
    int depth = 0;
    for (std::size_t i = name.size(); i-- > 0;) {
      if (name[i] == ')') ++depth;
      if (name[i] == '(' && --depth == 0) {
        if (i > 0) name.resize(i);
        break;
      }
    }
  }
  return name;
}

// The buffers CUPTI fills. They outlive sessions: CUPTI may hand one back after end() (it should not,
// after a forced flush), and then it is freed rather than pooled.
class buffer_pool {
 public:
  void fill(std::size_t count) {
    const std::lock_guard lock(mu_);
    while (free_.size() < count) {
      void* p = std::aligned_alloc(buffer_align, buffer_bytes);
      if (p == nullptr)
        throw out_of_memory(
            fmt::format("CUPTI activity buffer of {} MiB cannot be allocated", buffer_bytes >> 20));
      free_.push_back(static_cast<std::uint8_t*>(p));
    }
    open_ = true;
  }
  // The pool's free buffers are released; buffers CUPTI still holds are freed when they come back.
  void drain() noexcept {
    const std::lock_guard lock(mu_);
    open_ = false;
    for (std::uint8_t* p : free_) std::free(p);
    free_.clear();
  }
  std::uint8_t* take() noexcept {
    {
      const std::lock_guard lock(mu_);
      if (!free_.empty()) {
        std::uint8_t* p = free_.back();
        free_.pop_back();
        return p;
      }
      ++grown_;
    }
    return static_cast<std::uint8_t*>(std::aligned_alloc(buffer_align, buffer_bytes));
  }
  void give_back(std::uint8_t* p) noexcept {
    if (p == nullptr) return;
    {
      const std::lock_guard lock(mu_);
      if (open_ && free_.size() < 64) {
        free_.push_back(p);
        return;
      }
    }
    std::free(p);
  }
  [[nodiscard]] std::uint64_t grown() const noexcept {
    const std::lock_guard lock(mu_);
    return grown_;
  }

 private:
  mutable std::mutex mu_;
  std::vector<std::uint8_t*> free_;
  bool open_ = false;
  std::uint64_t grown_ = 0;
};

struct open_marker {
  std::int64_t start_ns = 0;
  std::uint32_t name = 0;
  std::uint32_t domain = 0;
  std::uint64_t thread = 0;
  bool skip = false;  // in the "ferry" domain, or started before begin()
};

struct api_info {
  std::uint32_t name = 0;
  sync_kind sync = sync_kind::none;
};

struct sync_caller {
  std::uint64_t thread = 0;
  std::uint32_t name = 0;
};

// One trace, from begin() to end(). Guarded by g_mu.
struct session {
  trace::recorder* rec = nullptr;
  std::int64_t begin_ns = 0;
  std::int64_t offset_ns = 0;  // added to CUPTI timestamps; 0 when the timestamp callback is in effect
  std::uint64_t dropped = 0;   // CUPTI's own dropped records
  std::uint64_t lost = 0;      // records ferry could not convert (out of memory while interning)
  std::uint64_t unclosed = 0;  // NVTX ranges still open at end()
  std::unordered_map<std::uint32_t, api_info> apis;        // runtime cbid -> name, sync kind
  std::unordered_map<std::string, std::uint32_t> kernels;  // mangled name -> display name id
  std::unordered_map<std::string, std::uint32_t> domains;  // NVTX domain -> id
  bool syncs = true;  // synchronization records come (options::syncs): their calls' threads are kept for them
  std::unordered_map<std::uint32_t, sync_caller> sync_callers;  // correlation -> thread of a sync API call
  std::vector<trace::event> pending_syncs;                      // sync records, threads resolved at end()
  std::unordered_map<std::uint32_t, open_marker> markers;       // NVTX range id -> its start
};

std::timed_mutex g_begin_end_mu;    // serializes begin(), flush(), end() and close()
std::atomic<bool> g_closed{false};  // close() or abandon() was called: no begin() is taken after it
std::mutex g_mu;                    // guards g_session and its contents
session* g_session = nullptr;
bool g_callbacks_registered = false;           // guarded by g_begin_end_mu
std::atomic<std::size_t> g_quiet_left_out{0};  // by the last begin()
// Never destroyed: CUPTI's threads may hand buffers back while the process exits.
buffer_pool& g_pool = *new buffer_pool;  // NOLINT(cert-err58-cpp): at load, out of memory ends the process

constexpr CUpti_ActivityKind all_kinds[] = {
    CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMCPY,  CUPTI_ACTIVITY_KIND_MEMSET,
    CUPTI_ACTIVITY_KIND_SYNCHRONIZATION,   CUPTI_ACTIVITY_KIND_RUNTIME, CUPTI_ACTIVITY_KIND_MARKER,
};
// The kinds the running trace enabled (a prefix of all_kinds, MARKER skipped when not asked for); set by
// begin() under g_begin_end_mu before any is enabled.
// NOLINTNEXTLINE(cert-err58-cpp): at load, out of memory ends the process
std::vector<CUpti_ActivityKind>& enabled_kinds = *new std::vector<CUpti_ActivityKind>;

std::int64_t to_ns(const session& s, std::uint64_t cupti_ts) noexcept {
  return static_cast<std::int64_t>(cupti_ts) + s.offset_ns;
}

// Fills the times of `e` from a record; false when the record has no timestamps or started before begin().
bool set_times(const session& s, trace::event& e, std::uint64_t start, std::uint64_t end) noexcept {
  if (start == 0 && end == 0) return false;
  e.start_ns = to_ns(s, start);
  e.end_ns = std::max(e.start_ns, to_ns(s, end));
  return e.start_ns >= s.begin_ns;
}

const api_info& api_of(session& s, std::uint32_t cbid) {
  auto it = s.apis.find(cbid);
  if (it != s.apis.end()) return it->second;
  const char* raw = nullptr;
  if (api().get_callback_name(CUPTI_CB_DOMAIN_RUNTIME_API, cbid, &raw) != CUPTI_SUCCESS || raw == nullptr)
    raw = "cuda runtime call";
  const std::string_view name = api_base_name(raw);
  api_info info{s.rec->intern(name), api_sync_kind(name)};
  return s.apis.emplace(cbid, info).first->second;
}

std::uint32_t domain_of(session& s, const char* domain) {
  if (domain == nullptr || *domain == '\0') return 0;
  auto it = s.domains.find(domain);
  if (it != s.domains.end()) return it->second;
  const std::uint32_t id = s.rec->intern(domain);
  s.domains.emplace(domain, id);
  return id;
}

void convert_kernel(session& s, const CUpti_ActivityKernel10& k) {
  trace::event e;
  e.kind = activity::kernel;
  if (!set_times(s, e, k.start, k.end)) return;
  const std::string mangled = k.name != nullptr ? k.name : "";
  auto it = s.kernels.find(mangled);
  if (it == s.kernels.end())
    it = s.kernels.emplace(mangled, s.rec->intern(kernel_display_name(k.name))).first;
  e.name = it->second;
  e.device = static_cast<std::int32_t>(k.deviceId);
  e.stream = k.streamId;
  e.correlation = k.correlationId;
  s.rec->record_late(e);
}

void convert_memcpy(session& s, const CUpti_ActivityMemcpy6& m) {
  trace::event e;
  e.kind = activity::memcpy;
  if (!set_times(s, e, m.start, m.end)) return;
  e.device = static_cast<std::int32_t>(m.deviceId);
  e.stream = m.streamId;
  e.correlation = m.runtimeCorrelationId != 0 ? m.runtimeCorrelationId : m.correlationId;
  e.bytes = m.bytes;
  e.copy = to_copy_kind(m.copyKind);
  e.src = to_mem_kind(m.srcKind);
  e.dst = to_mem_kind(m.dstKind);
  e.async = (m.flags & CUPTI_ACTIVITY_FLAG_MEMCPY_ASYNC) != 0;
  s.rec->record_late(e);
}

void convert_memset(session& s, const CUpti_ActivityMemset4& m) {
  trace::event e;
  e.kind = activity::memset;
  if (!set_times(s, e, m.start, m.end)) return;
  e.device = static_cast<std::int32_t>(m.deviceId);
  e.stream = m.streamId;
  e.correlation = m.correlationId;
  e.bytes = m.bytes;
  e.dst = to_mem_kind(m.memoryKind);
  s.rec->record_late(e);
}

void convert_api(session& s, const CUpti_ActivityAPI& a) {
  const api_info& info = api_of(s, a.cbid);
  // Sync records name only the call's correlation: remember which thread made each sync call (only when
  // those records come: each one claims and frees its entry).
  if (s.syncs && info.sync != sync_kind::none && info.sync != sync_kind::copy)
    s.sync_callers[a.correlationId] = sync_caller{a.threadId, info.name};
  trace::event e;
  e.kind = activity::api;
  if (!set_times(s, e, a.start, a.end)) return;
  e.name = info.name;
  e.thread = a.threadId;
  e.correlation = a.correlationId;
  e.sync = info.sync;
  s.rec->record_late(e);
}

void convert_sync(session& s, const CUpti_ActivitySynchronization2& y) {
  trace::event e;
  e.kind = activity::sync;
  if (!set_times(s, e, y.start, y.end)) return;
  e.sync = to_sync_kind(y.type);
  e.correlation = y.correlationId;
  if (y.streamId != CUPTI_INVALID_STREAM_ID) e.stream = y.streamId;
  s.pending_syncs.push_back(e);  // thread and name from the API record, at end()
}

void convert_marker(session& s, const CUpti_ActivityMarker2& m) {
  const std::int64_t t = to_ns(s, m.timestamp);
  const std::uint64_t thread = m.objectKind == CUPTI_ACTIVITY_OBJECT_THREAD ? m.objectId.pt.threadId : 0;
  const bool instant = (m.flags & CUPTI_ACTIVITY_FLAG_MARKER_INSTANTANEOUS) != 0;
  const bool start = (m.flags & CUPTI_ACTIVITY_FLAG_MARKER_START) != 0;
  const bool end = (m.flags & CUPTI_ACTIVITY_FLAG_MARKER_END) != 0;
  if (instant || start) {
    open_marker o;
    o.start_ns = t;
    o.thread = thread;
    // ferry's stage spans are recorded directly (FERRY_RANGE); their NVTX twins would be duplicates.
    o.skip = t < s.begin_ns || (m.domain != nullptr && std::string_view(m.domain) == "ferry");
    if (!o.skip) {
      o.name = m.name != nullptr ? s.rec->intern(m.name) : 0;
      o.domain = domain_of(s, m.domain);
    }
    if (start) {
      s.markers[m.id] = o;
      return;
    }
    if (o.skip) return;
    trace::event e;
    e.kind = activity::range;
    e.start_ns = e.end_ns = t;
    e.name = o.name;
    e.domain = o.domain;
    e.thread = o.thread;
    s.rec->record_late(e);
    return;
  }
  if (!end) return;
  auto it = s.markers.find(m.id);
  if (it == s.markers.end()) return;  // opened before begin()
  const open_marker o = it->second;
  s.markers.erase(it);
  if (o.skip) return;
  trace::event e;
  e.kind = activity::range;
  e.start_ns = o.start_ns;
  e.end_ns = std::max(o.start_ns, t);
  e.name = o.name;
  e.domain = o.domain;
  e.thread = o.thread != 0 ? o.thread : thread;
  s.rec->record_late(e);
}

void convert(session& s, const CUpti_Activity* record) {
  switch (record->kind) {
    case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL:
    case CUPTI_ACTIVITY_KIND_KERNEL:
      convert_kernel(s, *reinterpret_cast<const CUpti_ActivityKernel10*>(record));
      break;
    case CUPTI_ACTIVITY_KIND_MEMCPY:
      convert_memcpy(s, *reinterpret_cast<const CUpti_ActivityMemcpy6*>(record));
      break;
    case CUPTI_ACTIVITY_KIND_MEMSET:
      convert_memset(s, *reinterpret_cast<const CUpti_ActivityMemset4*>(record));
      break;
    case CUPTI_ACTIVITY_KIND_RUNTIME:
      convert_api(s, *reinterpret_cast<const CUpti_ActivityAPI*>(record));
      break;
    case CUPTI_ACTIVITY_KIND_SYNCHRONIZATION:
      convert_sync(s, *reinterpret_cast<const CUpti_ActivitySynchronization2*>(record));
      break;
    case CUPTI_ACTIVITY_KIND_MARKER:
      convert_marker(s, *reinterpret_cast<const CUpti_ActivityMarker2*>(record));
      break;
    default: break;
  }
}

void CUPTIAPI buffer_requested(std::uint8_t** buffer, std::size_t* size, std::size_t* max_records) {
  *buffer = g_pool.take();
  *size = *buffer != nullptr ? buffer_bytes : 0;  // no buffer: CUPTI drops records and counts them
  *max_records = 0;                               // as many as fit
}

// A buffer CUPTI handed back, waiting for its records to be converted (options::defer_conversion), with
// the count of records CUPTI dropped for its context and stream, read when it came back.
struct done_buffer {
  std::uint8_t* buffer = nullptr;
  std::size_t valid_size = 0;
  std::size_t dropped = 0;
};
constexpr std::size_t max_deferred = 16;  // buffers (128 MiB); past it they are converted in the callback

// The buffers set aside. Never destroyed, like the pool: CUPTI's threads may hand buffers back while the
// process exits. `defer` says whether buffer_completed sets them aside; it changes under the same lock, so a
// buffer is either set aside before end() takes the list, or converted in the callback after.
struct deferred_buffers {
  std::mutex mu;
  bool defer = false;
  std::vector<done_buffer> done;
};
deferred_buffers& g_deferred = *new deferred_buffers;  // NOLINT(cert-err58-cpp): as g_pool
// Held while deferred buffers are converted: end() waits for the writer's conversion in progress, so every
// record of the session is in it before end() resolves the synchronizations and lets the session go.
std::mutex g_convert_mu;

// Converts one buffer's records into the session (if any) and returns the buffer to the pool.
void convert_buffer(const done_buffer& b) noexcept {
  const shim::cupti_api& cupti = api();
  {
    const std::lock_guard lock(g_mu);
    if (g_session != nullptr && b.buffer != nullptr) {
      session& s = *g_session;
      CUpti_Activity* record = nullptr;
      while (cupti.activity_get_next_record(b.buffer, b.valid_size, &record) == CUPTI_SUCCESS) {
        try {
          convert(s, record);
        } catch (...) {
          ++s.lost;  // out of memory while interning a name: this record is lost, the trace goes on
        }
      }
      s.dropped += b.dropped;
    }
  }
  g_pool.give_back(b.buffer);
}

// Sets whether buffer_completed sets buffers aside (begin(), end()).
void set_deferring(bool on) noexcept {
  const std::lock_guard lock(g_deferred.mu);
  g_deferred.defer = on;
  if (on) g_deferred.done.reserve(max_deferred);  // no allocation in the callback, memory permitting
}

// Converts the buffers set aside, on the calling thread (the flushing one), outside CUPTI's callback.
void convert_deferred() noexcept {
  const std::lock_guard converting(g_convert_mu);
  std::vector<done_buffer> done;
  {
    const std::lock_guard lock(g_deferred.mu);
    if (g_deferred.done.empty()) return;
    done.swap(g_deferred.done);
  }
  for (const done_buffer& b : done) convert_buffer(b);
}

// CUPTI may call this from inside its own locked sections; torch.profiler's recorder keeps its callback to
// a hand-over and converts the records after its session. By default the records are converted here; with
// options::defer_conversion the buffer is set aside for the next flush() or end() (up to max_deferred).
void CUPTIAPI buffer_completed(CUcontext context, std::uint32_t stream_id, std::uint8_t* buffer,
                               std::size_t /*size*/, std::size_t valid_size) {
  done_buffer b{buffer, valid_size, 0};
  // Read here, while the context is sure to exist; ferry's lock is not held (CUPTI may take its own).
  if (api().activity_get_num_dropped_records(context, stream_id, &b.dropped) != CUPTI_SUCCESS) b.dropped = 0;
  if (buffer != nullptr && valid_size > 0) {
    try {
      const std::lock_guard lock(g_deferred.mu);
      if (g_deferred.defer && g_deferred.done.size() < max_deferred) {
        g_deferred.done.push_back(b);
        return;
      }
    } catch (...) {  // out of memory: converted here instead
    }
  }
  convert_buffer(b);
}

// Points NVTX at the libcupti ferry loaded (the same file, so NVTX's dlopen shares it). NVTX reads the
// environment, so there is no other channel; begin() calls this under g_begin_end_mu.
void enable_nvtx_injection() {
  if (std::getenv("NVTX_INJECTION64_PATH") != nullptr) return;  // NOLINT(concurrency-mt-unsafe): see above
  const std::string& path = api().path;
  if (!path.empty()) ::setenv("NVTX_INJECTION64_PATH", path.c_str(), 0);  // NOLINT(concurrency-mt-unsafe)
}

// The activity kinds begin() has enabled so far (the first `count` of enabled_kinds). Closing disables
// them and flushes what they recorded, so a begin() that fails half-way leaves CUPTI as it found it;
// after a successful begin() the session owns them and end() disables them, reporting failures.
struct enabled_kinds_traits {
  struct handle_type {
    std::size_t count = 0;
  };
  static constexpr handle_type null() noexcept { return {}; }
  static bool is_null(handle_type h) noexcept { return h.count == 0; }
  static void close(handle_type h) noexcept {
    for (std::size_t i = 0; i < h.count; ++i) static_cast<void>(api().activity_disable(enabled_kinds[i]));
    static_cast<void>(api().activity_flush_all(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED));
  }
};

// Turns off the records of the quiet runtime calls (quiet_runtime_call), CUPTI_ACTIVITY_KIND_RUNTIME being
// on (enabling it again turns them back on). CUPTI numbers the calls from 1; a newer libcupti than the
// header knows may number more, so the ids go on past the header's count while CUPTI still names them.
// Returns how many were left out; a refusal leaves that call recorded.
std::size_t leave_out_quiet_calls(const shim::cupti_api& cupti) noexcept {
  constexpr CUpti_CallbackId slack = 512;
  std::size_t left_out = 0;
  for (CUpti_CallbackId cbid = 1; cbid < CUPTI_RUNTIME_TRACE_CBID_SIZE + slack; ++cbid) {
    const char* raw = nullptr;
    if (cupti.get_callback_name(CUPTI_CB_DOMAIN_RUNTIME_API, cbid, &raw) != CUPTI_SUCCESS || raw == nullptr) {
      if (cbid >= CUPTI_RUNTIME_TRACE_CBID_SIZE) break;
      continue;
    }
    if (quiet_runtime_call(raw) && cupti.activity_enable_runtime_api(cbid, 0) == CUPTI_SUCCESS) ++left_out;
  }
  return left_out;
}

// Records the synchronizations whose API call has been seen (all of them when `all`, the others named
// by their kind). Under g_mu.
void resolve_syncs(session& s, bool all) {
  std::size_t kept = 0;
  for (trace::event e : s.pending_syncs) {
    auto it = s.sync_callers.find(static_cast<std::uint32_t>(e.correlation));
    if (it != s.sync_callers.end()) {
      e.thread = it->second.thread;
      e.name = it->second.name;
      s.sync_callers.erase(it);
    } else if (all) {
      e.name = s.rec->intern(sync_api_name(e.sync));
    } else {
      s.pending_syncs[kept++] = e;
      continue;
    }
    s.rec->record_late(e);
  }
  s.pending_syncs.resize(kept);
}

}  // namespace

bool quiet_runtime_call(std::string_view name) noexcept {
  name = api_base_name(name);
  // Queries of the device, the stream, the error state and the build that an eager framework makes
  // around every kernel: cudaGetDevice alone is 80% of a launch-bound PyTorch loop's calls. Not the
  // queries that may load a module under lazy loading (cudaFuncGetAttributes, cudaOccupancy..., ...):
  // those can take milliseconds, and the analyzer names a recurring one.
  static constexpr auto exact = std::to_array<std::string_view>({
      "cudaGetDevice",
      "cudaGetDeviceCount",
      "cudaGetDeviceFlags",
      "cudaGetLastError",
      "cudaPeekAtLastError",
      "cudaGetErrorString",
      "cudaGetErrorName",
      "cudaDeviceGetAttribute",
      "cudaDeviceGetLimit",
      "cudaDeviceGetStreamPriorityRange",
      "cudaDriverGetVersion",
      "cudaRuntimeGetVersion",
      "cudaPointerGetAttributes",
      "cudaStreamIsCapturing",
      "cudaStreamGetPriority",
      "cudaStreamGetFlags",
      "cudaStreamGetDevice",
      "cudaStreamGetId",
      "cudaThreadExchangeStreamCaptureMode",
  });
  // A family whose names carry a second version ("cudaStreamGetCaptureInfo_v2").
  return std::find(exact.begin(), exact.end(), name) != exact.end() ||
         name.starts_with("cudaStreamGetCaptureInfo");
}

void flush(bool forced) noexcept {
  // Held through CUPTI's calls: end() and close() wait for a flush in progress, so none runs after them.
  const std::lock_guard begin_end(g_begin_end_mu);
  {
    const std::lock_guard lock(g_mu);
    if (g_session == nullptr) return;
  }
  static_cast<void>(api().activity_flush_all(forced ? CUPTI_ACTIVITY_FLAG_FLUSH_FORCED : 0));
  convert_deferred();
  const std::lock_guard lock(g_mu);
  if (g_session == nullptr) return;
  try {
    resolve_syncs(*g_session, forced);
  } catch (...) {
    ++g_session->lost;  // out of memory while interning a name
  }
}

void begin(trace::recorder& r, const options& o) {
  const std::lock_guard begin_end(g_begin_end_mu);
  if (g_closed.load())
    throw std::logic_error("CUPTI trace: closed (the process is exiting; see cupti::close): no trace begins");
  {
    const std::lock_guard lock(g_mu);
    FERRY_EXPECTS(g_session == nullptr,
                  "CUPTI trace: a trace is already running in this process (CUPTI traces one at a time); "
                  "call trace_end first");
  }
  // Loads libcupti on the first trace; throws cuda_error naming every library tried when it is missing.
  const shim::cupti_api& cupti = shim::cupti();
  std::uint32_t version = 0;
  FERRY_CUPTI_TRY(cupti.get_version(&version), "cuptiGetVersion(&version)");
  if (version < CUPTI_API_VERSION)
    throw cuda_error(
        static_cast<int>(CUPTI_ERROR_NOT_COMPATIBLE),
        fmt::format("CUPTI trace: the loaded libcupti ({}) has API version {}, older than the {} "
                    "ferry was built with; put the toolkit's libcupti first on the library path",
                    cupti.path, version, CUPTI_API_VERSION));
  enable_nvtx_injection();
  g_pool.fill(pool_buffers);

  auto s = std::make_unique<session>();
  s->rec = &r;
  s->syncs = o.syncs && !o.lite;  // else no record would ever claim (and free) a sync call's entry
  // Thread ids as gettid() returns them (trace::this_thread_id), not CUPTI's default (pthread_self()
  // cut to 32 bits). Before the kinds are enabled; an earlier CUPTI user may have set it already.
  FERRY_CUPTI_TRY(cupti.set_thread_id_type(CUPTI_ACTIVITY_THREAD_ID_TYPE_SYSTEM),
                  "cuptiSetThreadIdType(CUPTI_ACTIVITY_THREAD_ID_TYPE_SYSTEM)");
  if (!g_callbacks_registered) {
    // Kept for the process' lifetime, like the library itself: nothing to undo at end().
    FERRY_CUPTI_TRY(cupti.activity_register_callbacks(buffer_requested, buffer_completed),
                    "cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed)");
    // Before any kind is enabled, as CUPTI asks; kept for the process' lifetime (it is the same clock).
    const CUptiResult ts = cupti.activity_register_timestamp_callback(ferry_timestamp);
    static_cast<void>(ts);  // checked below by comparing clocks, whatever it returned
    g_callbacks_registered = true;
  }
  // When the timestamp callback is in effect CUPTI's clock is now_ns(); else measure the offset once.
  std::uint64_t cupti_now = 0;
  FERRY_CUPTI_TRY(cupti.get_timestamp(&cupti_now), "cuptiGetTimestamp(&cupti_now)");
  const std::int64_t offset = trace::now_ns() - static_cast<std::int64_t>(cupti_now);
  constexpr std::int64_t same_clock_ns = 1'000'000;
  s->offset_ns = offset > -same_clock_ns && offset < same_clock_ns ? 0 : offset;
  r.set_metadata("cupti_clock", s->offset_ns == 0
                                    ? "timestamp callback (steady_clock)"
                                    : fmt::format("offset {} ns from cuptiGetTimestamp", offset));
  s->begin_ns = trace::now_ns();
  {
    const std::lock_guard lock(g_mu);
    g_session = s.release();
  }
  set_deferring(o.defer_conversion);  // none is left from an earlier session: its end() converted them

  enabled_kinds.clear();
  for (CUpti_ActivityKind kind : all_kinds) {
    const bool heavy = kind == CUPTI_ACTIVITY_KIND_SYNCHRONIZATION || kind == CUPTI_ACTIVITY_KIND_RUNTIME;
    if ((o.lite && heavy) || (!o.markers && kind == CUPTI_ACTIVITY_KIND_MARKER)) continue;
    if (!o.syncs && kind == CUPTI_ACTIVITY_KIND_SYNCHRONIZATION) continue;
    enabled_kinds.push_back(kind);
  }
  unique_handle<enabled_kinds_traits> enabled;
  try {
    for (CUpti_ActivityKind kind : enabled_kinds) {
      const CUptiResult status = cupti.activity_enable(kind);
      if (status != CUPTI_SUCCESS)
        throw_cupti_error(status,
                          fmt::format("cuptiActivityEnable(kind {})", static_cast<int>(kind)).c_str());
      ++enabled.get().count;
    }
  } catch (...) {
    enabled.reset();  // disables and flushes while the session still takes the records
    set_deferring(false);
    convert_deferred();
    const std::lock_guard lock(g_mu);
    delete g_session;
    g_session = nullptr;
    throw;
  }
  static_cast<void>(enabled.release());  // the session's now: end() disables every kind
  // After RUNTIME is enabled (which turns every call on): the quiet queries' records off, as Kineto does
  // for cudaGetDevice. CUPTI still intercepts those calls (measured on an H200: cudaGetDevice cost its
  // caller +0.43 us under torch.profiler, which turns its records off, +0.55 us with them on); what this
  // saves is most of the records, their conversion and the recording's size.
  const bool runtime_on = !o.lite;  // the RUNTIME kind is among enabled_kinds
  const std::size_t quiet = runtime_on && !o.all_runtime_calls && cupti.activity_enable_runtime_api != nullptr
                                ? leave_out_quiet_calls(cupti)
                                : 0;
  g_quiet_left_out.store(quiet);
  try {
    r.set_metadata("cupti_runtime_calls",
                   !runtime_on ? std::string("none")
                   : quiet > 0
                       ? fmt::format("all but {} quiet queries (cudaGetDevice, cudaGetLastError, ...)", quiet)
                       : std::string("all"));
  } catch (...) {  // out of memory: the recording goes on without the note
  }
}

std::size_t quiet_calls_left_out() noexcept { return g_quiet_left_out.load(); }

namespace {
void end_locked();
}  // namespace

void end() {
  const std::lock_guard begin_end(g_begin_end_mu);
  end_locked();
}

void close() {
  g_closed.store(true);
  // Waited for a second at most: the lock can be held by this very thread (a signal handler that exits,
  // run inside begin(), flush() or end()) or by one parked in ferry's SIGTERM handler; then CUPTI is left
  // as it is rather than waited for.
  std::unique_lock begin_end(g_begin_end_mu, std::defer_lock);
  if (!begin_end.try_lock_for(std::chrono::seconds(1))) return;
  end_locked();
}

void abandon() noexcept {
  g_closed.store(true);
  const std::lock_guard lock(g_mu);
  // Left, not freed: a begin(), flush() or end() of another thread may hold it, and a late buffer from
  // CUPTI finds no session and goes back to the pool.
  static_cast<void>(std::exchange(g_session, nullptr));  // NOLINT(clang-analyzer-cplusplus.NewDeleteLeaks)
}

namespace {
// end() under g_begin_end_mu.
void end_locked() {
  {
    const std::lock_guard lock(g_mu);
    if (g_session == nullptr) return;
  }
  // A session exists, so begin() loaded CUPTI: this does not throw.
  const shim::cupti_api& cupti = shim::cupti();
  // Flushing runs buffer_completed, which takes g_mu: not held here.
  const CUptiResult flushed = cupti.activity_flush_all(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  CUptiResult disabled = CUPTI_SUCCESS;
  for (CUpti_ActivityKind kind : enabled_kinds) {
    const CUptiResult status = cupti.activity_disable(kind);
    if (status != CUPTI_SUCCESS && disabled == CUPTI_SUCCESS) disabled = status;
  }
  // Records completed between the first flush and the disables.
  static_cast<void>(cupti.activity_flush_all(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED));
  set_deferring(false);  // from here a completed buffer is converted in the callback, into this session
  convert_deferred();    // waits for a conversion the writer has begun

  std::unique_ptr<session> s;
  {
    const std::lock_guard lock(g_mu);
    s.reset(std::exchange(g_session, nullptr));
  }
  std::size_t global_dropped = 0;
  if (cupti.activity_get_num_dropped_records(nullptr, 0, &global_dropped) == CUPTI_SUCCESS)
    s->dropped += global_dropped;
  trace::recorder& r = *s->rec;
  try {
    resolve_syncs(*s, true);
    s->unclosed = s->markers.size();
    for (const auto& [id, o] : s->markers) {
      if (o.skip) --s->unclosed;
    }
    r.set_metadata("cupti_dropped", std::to_string(s->dropped));
    r.count_dropped(s->dropped + s->lost);  // the timeline's drop count covers what never reached it
    if (s->lost > 0) r.set_metadata("cupti_lost", std::to_string(s->lost));
    if (s->unclosed > 0) r.set_metadata("cupti_unclosed_ranges", std::to_string(s->unclosed));
    if (g_pool.grown() > 0) r.set_metadata("cupti_buffers_grown", std::to_string(g_pool.grown()));
  } catch (...) {
    g_pool.drain();
    throw;
  }
  g_pool.drain();
  if (flushed != CUPTI_SUCCESS)
    throw_cupti_error(flushed, "cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED)");
  if (disabled != CUPTI_SUCCESS) throw_cupti_error(disabled, "cuptiActivityDisable");
}
}  // namespace

}  // namespace ferry::cupti
