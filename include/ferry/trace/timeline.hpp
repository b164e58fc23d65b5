// The trace model: one timeline of GPU activity (kernels, copies, memsets) and CPU activity (runtime API
// calls, synchronizations, NVTX ranges, ferry's stage spans), on one clock, whichever source recorded it:
// ferry's CUPTI recorder (cuda backend), the host backend's emulated streams, or an imported trace (a
// ferry Chrome trace or a PyTorch profiler / Kineto trace). The analyzer and the exporters read only this.
//
// Host only: no CUDA header is reachable from here.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace ferry::trace {

/// What an event is.
enum class activity : std::uint8_t {
  kernel,  // GPU: a kernel (or the host backend's emulated kernel)
  memcpy,  // GPU: a copy; see event::copy, src, dst, bytes, async
  memset,  // GPU: a memset
  sync,    // CPU thread blocked until GPU work completed; see event::sync
  api,     // CPU: a runtime API call (cudaLaunchKernel, cudaMemcpyAsync, ...) or a device-interface call
  range,   // CPU: an NVTX range (push/pop or start/end) in any domain, or a profiler annotation
  stage,   // CPU: one of ferry's own stage spans (FERRY_RANGE), or a bench's step span
};

/// A copy's direction.
enum class copy_kind : std::uint8_t { none, h2d, d2h, d2d, h2h, p2p };

/// The kind of memory at one end of a copy. pageable vs pinned decides whether an async copy is async.
enum class mem_kind : std::uint8_t { unknown, pageable, pinned, device, managed };

/// What a sync event or a blocking API call waited for.
enum class sync_kind : std::uint8_t {
  none,
  event,        // cudaEventSynchronize / event::synchronize
  stream,       // cudaStreamSynchronize / stream::synchronize
  device,       // cudaDeviceSynchronize / device::synchronize
  stream_wait,  // cudaStreamWaitEvent (a device-side wait; the CPU does not block)
  copy,         // a blocking copy (cudaMemcpy, device::copy): the CPU waits for the copy it issued
};

[[nodiscard]] std::string_view to_string(activity a) noexcept;
[[nodiscard]] std::string_view to_string(copy_kind k) noexcept;
[[nodiscard]] std::string_view to_string(mem_kind k) noexcept;
[[nodiscard]] std::string_view to_string(sync_kind k) noexcept;
/// Inverse of to_string; throws input_error naming the text and the accepted words.
[[nodiscard]] activity parse_activity(std::string_view text);
[[nodiscard]] copy_kind parse_copy_kind(std::string_view text);
[[nodiscard]] mem_kind parse_mem_kind(std::string_view text);
[[nodiscard]] sync_kind parse_sync_kind(std::string_view text);

/// One event. Times are nanoseconds on the timeline's clock; end_ns >= start_ns (equal for instants).
/// Names are ids into the timeline's (or recorder's) string table, so recording copies no strings.
/// 72 bytes, wide fields first: an imported trace may hold 16 Mi of them.
struct event {
  std::int64_t start_ns = 0;
  std::int64_t end_ns = 0;
  std::uint64_t stream = 0;       // GPU activity (and stream waits): stream id within its device
  std::uint64_t thread = 0;       // CPU activity: the OS thread id
  std::uint64_t correlation = 0;  // links an API call with the GPU activity it launched; 0 = none
  std::uint64_t bytes = 0;        // memcpy, memset
  std::uint32_t name = 0;         // string id: kernel name, API name, range text
  std::uint32_t domain = 0;       // string id of the NVTX domain (ranges); 0 = none
  std::int32_t device = -1;       // GPU activity: device ordinal
  activity kind = activity::kernel;
  copy_kind copy = copy_kind::none;
  mem_kind src = mem_kind::unknown;
  mem_kind dst = mem_kind::unknown;
  sync_kind sync = sync_kind::none;
  bool async = false;  // memcpy: issued by an asynchronous API call

  [[nodiscard]] bool on_gpu() const noexcept {
    return kind == activity::kernel || kind == activity::memcpy || kind == activity::memset;
  }
  [[nodiscard]] std::int64_t duration_ns() const noexcept { return end_ns - start_ns; }
};
static_assert(sizeof(event) == 72);

/// Interned strings: id 0 is the empty string. Each text is stored once (the index holds views of it).
/// Not thread-safe; the recorder guards its own.
class string_table {
 public:
  string_table();
  string_table(const string_table& other);
  string_table& operator=(const string_table& other);
  string_table(string_table&&) noexcept = default;
  string_table& operator=(string_table&&) noexcept = default;
  ~string_table() = default;
  [[nodiscard]] std::uint32_t intern(std::string_view text);
  [[nodiscard]] std::string_view operator[](std::uint32_t id) const;
  [[nodiscard]] std::size_t size() const noexcept { return strings_.size(); }

 private:
  // A deque never moves its elements, so the views in ids_ stay valid as it grows (and when it moves).
  std::deque<std::string> strings_;
  std::unordered_map<std::string_view, std::uint32_t> ids_;
};

/// One process of a multi-process recording (`ferry trace`; process_trace.hpp).
struct process_info {
  std::uint64_t pid = 0;     // the OS process id
  std::uint64_t parent = 0;  // the parent's key in timeline::processes; 0 when it was not recorded
  std::int64_t start_ns = 0;
  std::int64_t end_ns = 0;  // its exit, or its last event when it left no exit record
  std::string name;         // what the viewers show: "python train.py", "DataLoader worker 2"
  std::string command;      // its command line
  std::string started;      // "exec" or "fork"
  std::string ended;        // "exit 0", "exit 3", or "no exit record (killed?)"
  bool gpu = false;         // it has GPU activity
  std::map<std::string, std::string> notes;  // what its recorder noted ("cupti", "cupti_handover", ...)
};

/// One sample of a process's CPU use, taken by `ferry trace`'s launcher from /proc.
struct cpu_sample {
  std::int64_t t_ns = 0;
  std::uint64_t process = 0;  // key in timeline::processes
  float cores = 0;            // CPU time used since the previous sample / wall time (1 = one core busy)
  std::uint32_t running = 0;  // threads running or runnable (state R) at the sample
  std::uint32_t threads = 0;  // threads in all
};

/// A recorded or imported timeline.
struct timeline {
  std::string source;       // "ferry host", "ferry cuda (CUPTI)", "pytorch profiler", ...
  std::string device_name;  // the GPU's name, or the emulated device's
  string_table strings;
  std::vector<event> events;
  std::uint64_t dropped = 0;  // events lost because the recorder's buffer was full
  // Records an importer skipped instead of refusing the file, by reason ("cuda_sync with stream -1"):
  // odd fields in traces ferry did not write. The analysis reports them.
  std::map<std::string, std::uint64_t> skipped;
  // Ceilings to compare copies with (GB/s, 0 = unknown): the probed pinned link of the recording machine.
  double link_h2d_gbps = 0;
  double link_d2h_gbps = 0;
  std::map<std::uint64_t, std::string> thread_names;  // OS thread id -> name ("main", "egress sink 0")
  std::map<std::uint64_t, std::string> stream_names;  // stream id -> name ("compute", "egress copy")
  // OS thread id -> its process id, where the source says (a profiler's pid): the analyzer takes the
  // thread whose id is its process's id as the process's main thread when no step spans say otherwise.
  std::map<std::uint64_t, std::uint64_t> thread_processes;
  std::map<std::string, std::string> metadata;  // free-form: bench level, command line, ...
  // A multi-process recording (`ferry trace`): its processes by key (the pid, or the pid plus a multiple
  // of 2^22 for a later process that reused it), which process each GPU stream belongs to (streams are
  // renumbered per process), and the launcher's CPU samples. Empty for a one-process trace.
  std::map<std::uint64_t, process_info> processes;
  std::map<std::uint64_t, std::uint64_t> stream_processes;
  std::vector<cpu_sample> cpu_samples;

  [[nodiscard]] std::string_view name_of(const event& e) const { return strings[e.name]; }
  [[nodiscard]] std::string_view domain_of(const event& e) const { return strings[e.domain]; }
  /// Sorts events by start time (stable), as the analyzer and exporters expect.
  void sort();
};

/// The OS id of the calling thread (gettid on Linux): what CUPTI and profilers call a thread id.
[[nodiscard]] std::uint64_t this_thread_id() noexcept;

/// Names the calling thread (the OS name, cut to 15 characters), so traces and debuggers show it.
void name_this_thread(std::string_view name) noexcept;

/// Nanoseconds on the clock of every event ferry records on the host (std::chrono::steady_clock, i.e.
/// CLOCK_MONOTONIC); the CUPTI recorder converts GPU timestamps onto it.
[[nodiscard]] std::int64_t now_ns() noexcept;

/// A bounded, thread-safe event buffer with a capture switch. Events recorded while not capturing, or
/// once `capacity` events are held, are not kept; the latter are counted as dropped. The buffer is
/// reserved up front, so recording allocates nothing (an intern of a new string aside).
class recorder {
 public:
  static constexpr std::size_t default_capacity = std::size_t{1} << 20;
  /// Throws logic_error when capacity is 0 or above 1<<26 (64 Mi events).
  explicit recorder(std::size_t capacity = default_capacity);
  recorder(const recorder&) = delete;
  recorder& operator=(const recorder&) = delete;

  /// Opens and closes the capture window (e.g. around the timed steps after warm-up).
  void start() noexcept;
  void stop() noexcept;
  [[nodiscard]] bool capturing() const noexcept;

  /// Keeps `e` when capturing and there is room; counts a drop when capturing and full.
  void record(const event& e) noexcept;
  /// Keeps `e` whatever the capture switch says (room permitting): for events a source delivers late,
  /// e.g. CUPTI records of work done inside the window but flushed after it closed.
  void record_late(const event& e) noexcept;
  [[nodiscard]] std::uint32_t intern(std::string_view text);
  /// Counts `n` events a source lost before they reached the recorder (CUPTI's dropped records, say), so
  /// the timeline's drop count covers them.
  void count_dropped(std::uint64_t n) noexcept;
  void name_thread(std::uint64_t thread, std::string name);
  void name_stream(std::uint64_t stream, std::string name);
  void set_metadata(std::string key, std::string value);

  [[nodiscard]] std::size_t size() const;
  [[nodiscard]] std::size_t capacity() const noexcept { return capacity_; }
  /// Unique per recorder made in this process (never reused, unlike an address).
  [[nodiscard]] std::uint64_t serial() const noexcept { return serial_; }
  /// The string id of the "ferry" NVTX domain, which ferry's stage spans carry.
  [[nodiscard]] std::uint32_t ferry_domain() const noexcept { return ferry_domain_; }
  [[nodiscard]] std::uint64_t dropped() const;

  /// Moves everything recorded so far into a timeline (sorted) and empties the buffer.
  [[nodiscard]] timeline take(std::string source, std::string device_name);

 private:
  void keep(const event& e) noexcept;
  const std::size_t capacity_;
  const std::uint64_t serial_;
  std::uint32_t ferry_domain_ = 0;
  mutable std::mutex mu_;
  bool capturing_ = false;
  std::vector<event> events_;
  std::uint64_t dropped_ = 0;
  timeline meta_;  // strings, names and metadata
};

/// The recorder that ferry's stage spans (FERRY_RANGE) and the host backend's streams record into, or
/// nullptr. Set by a recording_scope; reading it costs one atomic load.
[[nodiscard]] recorder* current_recorder() noexcept;

/// Makes `r` the current recorder for the scope's lifetime (scopes nest; the previous one is restored).
class recording_scope {
 public:
  explicit recording_scope(recorder& r) noexcept;
  recording_scope(const recording_scope&) = delete;
  recording_scope& operator=(const recording_scope&) = delete;
  ~recording_scope();

 private:
  recorder* previous_;
};

/// Records a stage span [start_ns, now) on the calling thread into the current recorder, if capturing.
void record_stage(const char* name, std::int64_t start_ns) noexcept;

}  // namespace ferry::trace
