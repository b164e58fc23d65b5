// The device interface: one API for a GPU, implemented by the cuda backend (the CUDA runtime) and the host
// backend (an emulated device in plain C++ with the same asynchronous semantics).
//
// Semantics every backend honours:
// - A stream executes its operations in order; different streams run concurrently.
// - Every asynchronous operation names its stream. ferry never uses the legacy default stream.
// - event::record(s) marks the point reached by s; stream_view::wait(e) makes a stream wait for the most
//   recent record of e at the time of the call; synchronize()/query() observe it from the host.
// - Memory comes in three kinds (device, pinned host, pageable host); a copy's direction follows from the
//   kinds of its source and destination, and its size is checked against both.
// - Devices are numbered (ordinal). A peer copy (copy_peer_async) moves device memory of one device into
//   another's, on a stream of the source device; a stream may wait on an event of another device of the
//   same backend, which is how the destination waits for the copy.
// - Errors raised inside host callbacks are captured and rethrown at the next synchronize() of any
//   stream, event or the device.
//
// Lifetimes: a device outlives every stream, event and buffer made from it. Owning types (stream, event,
// buffer) are move-only; views (stream_view, mem_view) are cheap copies valid while their owner lives.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/core/unique_handle.hpp"

namespace ferry {

namespace trace {
class recorder;
}

class device;
class event;

/// Which implementation runs a device.
enum class backend : std::uint8_t { host, cuda };

/// Where a buffer lives. Pinned host memory is page-locked and reachable by the device's copy engines;
/// pageable host memory is ordinary memory, which a copy must stage.
enum class memory_kind : std::uint8_t { device, pinned, pageable };

/// The direction of a copy, derived from the memory kinds of its source and destination.
enum class copy_direction : std::uint8_t { host_to_device, device_to_host, device_to_device, host_to_host };

[[nodiscard]] std::string_view to_string(backend b) noexcept;
[[nodiscard]] std::string_view to_string(memory_kind k) noexcept;
[[nodiscard]] std::string_view to_string(copy_direction d) noexcept;
/// Parses "host" or "cuda"; throws logic_error naming the text otherwise.
[[nodiscard]] backend parse_backend(std::string_view text);

/// Direction of a copy from memory of kind `src` into memory of kind `dst`.
[[nodiscard]] constexpr copy_direction direction_of(memory_kind src, memory_kind dst) noexcept {
  const bool src_dev = src == memory_kind::device;
  const bool dst_dev = dst == memory_kind::device;
  if (src_dev && dst_dev) return copy_direction::device_to_device;
  if (src_dev) return copy_direction::device_to_host;
  if (dst_dev) return copy_direction::host_to_device;
  return copy_direction::host_to_host;
}

/// A non-owning view of a stream: one ferry made (stream::view), or a foreign handle (a framework's
/// stream) adopted with device::adopt_stream, which checks it. Cheap to copy; valid while the stream it
/// names lives.
class stream_view {
 public:
  stream_view(int) = delete;             // a view of stream 0 would be the legacy default stream
  stream_view(std::nullptr_t) = delete;  // likewise

  [[nodiscard]] device& dev() const noexcept { return *dev_; }
  [[nodiscard]] void* native() const noexcept { return native_; }

  /// Blocks the host until every operation queued on the stream so far has completed.
  /// Rethrows an error captured from a host callback.
  void synchronize() const;
  /// Device-side wait: work queued on this stream after the call waits for the most recent record of
  /// `e`. Never blocks the host. Throws logic_error if `e` was never recorded.
  void wait(const event& e) const;

  friend bool operator==(const stream_view& a, const stream_view& b) noexcept {
    return a.dev_ == b.dev_ && a.native_ == b.native_;
  }

 private:
  // Views are made by the device (adopt_stream, after its checks) and by the streams it made.
  friend class device;
  friend class stream;
  stream_view(device& dev, void* native) noexcept : dev_(&dev), native_(native) {}
  device* dev_;
  void* native_;
};

/// An owning stream, made by device::make_stream. Move-only; the moved-from stream is empty. Foreign
/// handles are never owned: device::adopt_stream gives a view of them.
///
/// Views escape only from a stream that outlives them: view() and the conversion to stream_view are
/// deleted on temporaries, so `stream_view v = dev.make_stream();` (a view of a stream destroyed at the
/// `;`) does not compile.
class stream {
 public:
  stream() noexcept = default;
  stream(stream&&) noexcept = default;
  stream& operator=(stream&&) noexcept = default;
  stream(const stream&) = delete;
  stream& operator=(const stream&) = delete;
  ~stream() = default;

  [[nodiscard]] bool empty() const noexcept { return handle_.empty(); }
  /// A view of this stream, valid while it lives. Throws logic_error on an empty (moved-from) stream.
  [[nodiscard]] stream_view view() const&;
  // On a temporary the view would outlive the stream, which dies at the end of the full expression.
  stream_view view() const&& = delete;
  operator stream_view() const& { return view(); }  // NOLINT(google-explicit-constructor)
  operator stream_view() const&& = delete;
  void synchronize() const { view().synchronize(); }
  void wait(const event& e) const { view().wait(e); }

 private:
  friend class device;
  // What destroying a stream needs: the device that made it and its native handle.
  struct handle {
    device* dev = nullptr;
    void* native = nullptr;
  };
  struct traits {
    using handle_type = handle;
    static constexpr handle null() noexcept { return {}; }
    static bool is_null(const handle& h) noexcept { return h.native == nullptr; }
    static void close(const handle& h) noexcept { destroy(h); }
  };
  // Owns `native`, made by `dev`; only device::make_stream makes owning streams.
  stream(device& dev, void* native) noexcept : handle_(handle{&dev, native}) {}
  static void destroy(const handle& h) noexcept;
  unique_handle<traits> handle_;
};

/// A device event. Completion events (device::make_event) come from the device's pool and do no timing;
/// timing events (device::make_timing_event) can be passed to device::elapsed_ms. Move-only; the
/// moved-from event is empty. A pooled event returns its handle to the pool when destroyed.
class event {
 public:
  event() noexcept = default;
  event(event&&) noexcept = default;
  event& operator=(event&&) noexcept = default;
  event(const event&) = delete;
  event& operator=(const event&) = delete;
  ~event() = default;

  /// Marks the point `s` has reached: the event completes when all work queued on `s` so far is done.
  void record(stream_view s);
  /// Blocks the host until the most recent record has completed. Throws logic_error if never recorded.
  void synchronize() const;
  /// True when the most recent record has completed. Throws logic_error if never recorded.
  [[nodiscard]] bool query() const;

  [[nodiscard]] bool empty() const noexcept { return handle_.empty(); }
  [[nodiscard]] bool recorded() const noexcept { return handle_.get().recorded; }
  [[nodiscard]] bool timing() const noexcept { return handle_.get().timing; }
  [[nodiscard]] void* native() const noexcept { return handle_.get().native; }
  [[nodiscard]] device* dev() const noexcept { return handle_.get().dev; }

 private:
  friend class device;
  // Everything that moves with the native handle: where to return it, and its state.
  struct handle {
    device* dev = nullptr;
    void* native = nullptr;
    bool timing = false;
    bool recorded = false;
  };
  struct traits {
    using handle_type = handle;
    static constexpr handle null() noexcept { return {}; }
    static bool is_null(const handle& h) noexcept { return h.native == nullptr; }
    static void close(const handle& h) noexcept { release(h); }
  };
  event(device& dev, void* native, bool timing) noexcept : handle_(handle{&dev, native, timing, false}) {}
  static void release(const handle& h) noexcept;
  void expect_recorded(std::string_view what) const;
  unique_handle<traits> handle_;
};

/// A non-owning view of memory: a pointer, a size in bytes and the kind of memory. Views of foreign
/// memory (a framework's tensor) are made with device_view/pinned_view/pageable_view.
struct mem_view {
  void* data = nullptr;
  std::size_t bytes = 0;
  memory_kind kind = memory_kind::pageable;

  /// The bytes [offset, offset + count). Throws logic_error naming the range and the size when it does
  /// not fit.
  [[nodiscard]] mem_view subview(std::size_t offset, std::size_t count) const;
  [[nodiscard]] std::byte* begin() const noexcept { return static_cast<std::byte*>(data); }
};

[[nodiscard]] mem_view device_view(void* ptr, std::size_t bytes);
[[nodiscard]] mem_view pinned_view(void* ptr, std::size_t bytes);
[[nodiscard]] mem_view pageable_view(void* ptr, std::size_t bytes);

/// Owning memory of one kind, allocated by a device. Move-only; the moved-from buffer is empty.
/// Pinned buffers are meant to be allocated once, up front: their cost is reported by
/// device::pinned_stats().
///
/// Views and pointers escape only from a buffer that outlives them: view(), the conversion to mem_view,
/// data() and host_bytes() are deleted on temporaries, so `mem_view m = dev.alloc_device(n);` (a view of
/// memory freed at the `;`) does not compile.
class buffer {
 public:
  buffer() noexcept = default;
  buffer(buffer&&) noexcept = default;
  buffer& operator=(buffer&&) noexcept = default;
  buffer(const buffer&) = delete;
  buffer& operator=(const buffer&) = delete;
  ~buffer() = default;

  /// The memory, valid while the buffer lives.
  [[nodiscard]] void* data() const& noexcept { return handle_.get().data; }
  void* data() const&& = delete;
  [[nodiscard]] std::size_t size() const noexcept { return handle_.get().bytes; }
  [[nodiscard]] memory_kind kind() const noexcept { return handle_.get().kind; }
  [[nodiscard]] bool empty() const noexcept { return handle_.empty(); }
  /// A view of the whole buffer, valid while it lives.
  [[nodiscard]] mem_view view() const& noexcept { return {data(), size(), kind()}; }
  mem_view view() const&& = delete;  // the buffer would be freed at the end of the full expression
  /// The bytes [offset, offset + count), as mem_view::subview (which throws when they do not fit).
  [[nodiscard]] mem_view view(std::size_t offset, std::size_t count) const& {
    return view().subview(offset, count);
  }
  mem_view view(std::size_t offset, std::size_t count) const&& = delete;
  operator mem_view() const& noexcept { return view(); }  // NOLINT(google-explicit-constructor)
  operator mem_view() const&& = delete;
  /// Host-side bytes of a pinned or pageable buffer, valid while it lives. Throws logic_error for device
  /// memory.
  [[nodiscard]] std::byte* host_bytes() const&;
  std::byte* host_bytes() const&& = delete;

 private:
  friend class device;
  // Everything freeing needs moves with the pointer: the device, the size and the kind of memory.
  struct handle {
    device* dev = nullptr;
    void* data = nullptr;
    std::size_t bytes = 0;
    memory_kind kind = memory_kind::pageable;
    bool registered = false;  // caller-owned memory registered by device::register_host: unregister, not free
  };
  struct traits {
    using handle_type = handle;
    static constexpr handle null() noexcept { return {}; }
    static bool is_null(const handle& h) noexcept { return h.data == nullptr; }
    static void close(const handle& h) noexcept { free_memory(h); }
  };
  buffer(device& dev, void* data, std::size_t bytes, memory_kind kind, bool registered = false) noexcept
      : handle_(handle{&dev, data, bytes, kind, registered}) {}
  static void free_memory(const handle& h) noexcept;
  unique_handle<traits> handle_;
};

/// What a device is.
struct device_info {
  backend kind = backend::host;
  std::string name;
  int ordinal = 0;
  std::uint64_t memory_bytes = 0;  // total device memory
  std::string pci_bus_id;          // empty on the host backend
  int copy_engines = 0;            // asynchronous copy engines
};

/// `i` as a JSON object: backend, name, ordinal, memory_bytes, pci_bus_id, copy_engines. The one shape of
/// a device wherever ferry writes one (the probe, the benches, the C ABI); `indent` < 0 for one line.
[[nodiscard]] std::string to_json(const device_info& i, int indent = -1);

/// Cost of pinning host memory so far: the pipelines report it, since it is paid up front.
struct pinned_stats {
  std::uint64_t bytes = 0;        // pinned bytes currently held
  std::uint64_t peak_bytes = 0;   // most held at once
  double seconds = 0;             // wall time spent allocating (pinning) them, all allocations
  std::uint64_t allocations = 0;  // count of pinned allocations
};

/// A GPU, or its emulation. Public member functions check their arguments (the same checks for every
/// backend) and forward to the backend's do_* hooks. Thread-safe: streams may be driven from any thread.
class device {
 public:
  device(const device&) = delete;
  device& operator=(const device&) = delete;
  /// Reports (never throws) pooled events a backend left behind: the base cannot free them, because
  /// do_event_destroy is gone by the time it runs, so every backend's destructor calls drain_event_pool().
  virtual ~device();

  [[nodiscard]] virtual device_info info() const = 0;
  [[nodiscard]] backend kind() const noexcept { return kind_; }
  /// This device's number, as info().ordinal: the GPU ordinal on cuda; host_device_options::ordinal (or
  /// its place in make_host_devices) on the host backend. Cheap, for hot paths.
  [[nodiscard]] int ordinal() const noexcept { return ordinal_; }

  // Streams
  /// A new stream that does not synchronize with any other stream.
  [[nodiscard]] stream make_stream();
  /// A view of a foreign stream handle (a cudaStream_t on the cuda backend). Throws logic_error for the
  /// null handle (the legacy default stream, which would serialize with every other stream) and for the
  /// legacy/per-thread pseudo-handles, on every backend; the host backend accepts only its live streams.
  [[nodiscard]] stream_view adopt_stream(void* native);

  // Events
  /// A completion event from the device's pool (no timing).
  [[nodiscard]] event make_event();
  /// An event that records timestamps, for elapsed_ms.
  [[nodiscard]] event make_timing_event();
  /// Milliseconds between two completed timing events. Throws logic_error for a non-timing or
  /// unrecorded event.
  [[nodiscard]] double elapsed_ms(const event& start, const event& stop);

  // Memory
  /// Device memory of `bytes` bytes. Throws logic_error for 0, out_of_memory naming the size and the
  /// device's free memory when it cannot be had.
  [[nodiscard]] buffer alloc_device(std::size_t bytes);
  /// Pinned (page-locked) host memory. Verified to be pinned; its cost is added to pinned_stats().
  /// Throws out_of_memory naming the size and, where the backend locks pages itself, RLIMIT_MEMLOCK.
  [[nodiscard]] buffer alloc_pinned(std::size_t bytes);
  /// Ordinary pageable host memory (page-aligned).
  [[nodiscard]] buffer alloc_pageable(std::size_t bytes);
  /// Page-locks host memory the caller owns, [p, p + bytes) (a shared mapping that other processes
  /// write, say), for this device's copies: the buffer views it as pinned memory and unregisters it when
  /// destroyed; it never frees it, and the caller keeps the mapping until then. p must be page-aligned.
  /// Verified to be pinned (cuda: cudaHostRegister, then the pointer's attributes; host backend: mlock,
  /// as alloc_pinned). Its cost is added to pinned_stats(). Throws logic_error for a null or unaligned p
  /// or 0 bytes, out_of_memory (naming RLIMIT_MEMLOCK where the backend locks pages itself) when the
  /// pages cannot be locked.
  [[nodiscard]] buffer register_host(void* p, std::size_t bytes);
  [[nodiscard]] pinned_stats pinned() const;

  // Work on streams
  /// Copies src.bytes bytes from src into dst, in stream order. Throws logic_error when dst is smaller
  /// than src. Copies from or to pageable memory return only when the host side has been consumed
  /// (as CUDA's do), so a pageable source may be reused at once.
  void copy_async(mem_view dst, mem_view src, stream_view s);
  /// Copies `bytes` bytes; throws logic_error naming the size when it exceeds either view.
  void copy_async(mem_view dst, mem_view src, std::size_t bytes, stream_view s);
  /// copy_async followed by s.synchronize().
  void copy(mem_view dst, mem_view src, stream_view s);
  /// Sets every byte of a device or pinned view to `value`, in stream order.
  void memset_async(mem_view dst, std::uint8_t value, stream_view s);
  /// Writes the verification pattern of `seed` (ferry/core/pattern.hpp) into a device or pinned view, in
  /// stream order: byte g of the view becomes byte g of the pattern. A kernel on the cuda backend.
  void fill_pattern_async(mem_view dst, std::uint64_t seed, stream_view s);
  /// Computes ferry's checksum (checksum64 of ferry/core/pattern.hpp) of a device or pinned view `src`
  /// into the first 8 bytes of `result`, which must be device memory, in stream order. A kernel on the
  /// cuda backend: the consumer's check that what arrived on the device is what the host sent.
  void checksum_async(mem_view src, mem_view result, stream_view s);
  /// Runs `fn` on a host thread once all prior work on `s` is done; later work on `s` waits for it.
  /// `fn` must not call into the device. An exception it throws is rethrown at the next synchronize().
  void launch_host_func(stream_view s, std::function<void()> fn);
  /// Occupies the stream for `duration` (a busy kernel on the cuda backend, a sleep on the host
  /// backend): the stand-in for compute in benches and tests.
  void spin_async(std::chrono::nanoseconds duration, stream_view s);

  // Peers: copies between the device memory of two devices of one backend.
  /// Whether copies between this device and `peer` go directly over a peer link: always for the device
  /// itself; on cuda, cudaDeviceCanAccessPeer (NVLink or PCIe peer-to-peer); on the host backend, for the
  /// devices of one make_host_devices group. False for a device of another backend. Never throws
  /// logic_error; cuda_error when the runtime fails.
  [[nodiscard]] bool can_access_peer(device& peer);
  /// Copies src.bytes bytes of this device's memory `src` into `dst`, device memory of `dst_dev`, in the
  /// order of `s`, a stream of this device (the source's: the copy is queued where its data is made). Work
  /// on `dst_dev` that reads `dst` waits for an event recorded on `s` after the copy (stream_view::wait
  /// accepts events of another device of the same backend). `dst_dev` may be this device: then it is a
  /// device-to-device copy_async. On cuda, cudaMemcpyPeerAsync, with peer access enabled on first use
  /// where can_access_peer is true (the runtime stages the copy through host memory where it is false);
  /// on the host backend, a real copy paced to the group's peer link (host_device_options::peer).
  /// Throws logic_error, before queuing anything, when `s` is not a stream of this device, `dst_dev` is of
  /// another backend, a view is null or not device memory, dst is smaller than src, or (host backend)
  /// the two devices are not of one make_host_devices group.
  void copy_peer_async(mem_view dst, device& dst_dev, mem_view src, stream_view s);
  /// Copies `bytes` bytes; throws logic_error naming the size when it exceeds either view.
  void copy_peer_async(mem_view dst, device& dst_dev, mem_view src, std::size_t bytes, stream_view s);

  /// Blocks the host until all work on every stream of this device has completed.
  void synchronize();

  // Profiler capture range, for users of external profilers (cudaProfilerStart/Stop on cuda; the host
  // backend only counts the calls).
  void profiler_start();
  void profiler_stop();

  /// Rethrows (and clears) an error captured from a host callback, if any.
  void rethrow_callback_error();

  // Tracing: this device's activity (GPU kernels, copies, memsets, synchronizations and the API calls
  // that issued them) goes into `r` between trace_begin and trace_end, while r is capturing. The cuda
  // backend records through CUPTI's activity API (process-wide: one device traces at a time); the host
  // backend records its emulated streams. trace_end flushes what is still buffered. Throws logic_error
  // when a trace is already running, cuda_error when CUPTI refuses.
  void trace_begin(trace::recorder& r);
  void trace_end();
  [[nodiscard]] bool tracing() const noexcept { return tracing_; }

 protected:
  device(backend kind, int ordinal) noexcept : kind_(kind), ordinal_(ordinal) {}

  virtual void* do_stream_create() = 0;
  virtual void do_stream_destroy(void* s) noexcept = 0;
  virtual void do_stream_synchronize(void* s) = 0;
  virtual void do_stream_wait(void* s, void* e) = 0;
  virtual bool do_is_null_stream(void* s) const noexcept = 0;
  /// Backend check of a foreign handle, run by adopt_stream after the checks every backend shares:
  /// throws logic_error naming the handle when this backend cannot run work on it. The default accepts
  /// any handle (the CUDA runtime validates its own); the host backend accepts only its live streams.
  virtual void do_check_adopted_stream(void* s) const { static_cast<void>(s); }

  virtual void* do_event_create(bool timing) = 0;
  virtual void do_event_destroy(void* e) noexcept = 0;
  virtual void do_event_record(void* e, void* s) = 0;
  virtual void do_event_synchronize(void* e) = 0;
  virtual bool do_event_query(void* e) = 0;
  virtual double do_elapsed_ms(void* start, void* stop) = 0;

  virtual void* do_alloc(std::size_t bytes, memory_kind kind) = 0;
  virtual void do_free(void* p, std::size_t bytes, memory_kind kind) noexcept = 0;
  virtual void do_register_host(void* p, std::size_t bytes) = 0;
  virtual void do_unregister_host(void* p, std::size_t bytes) noexcept = 0;

  virtual void do_copy_async(void* dst, const void* src, std::size_t bytes, copy_direction dir,
                             memory_kind src_kind, memory_kind dst_kind, void* s) = 0;
  virtual void do_memset_async(void* dst, std::uint8_t value, std::size_t bytes, memory_kind kind,
                               void* s) = 0;
  virtual void do_fill_pattern_async(void* dst, std::size_t bytes, std::uint64_t seed, memory_kind kind,
                                     void* s) = 0;
  virtual void do_checksum_async(const void* src, std::size_t bytes, void* result, void* s) = 0;
  /// Whether copies to and from `peer`, another device of this backend, go over a direct peer link.
  virtual bool do_can_access_peer(device& peer) = 0;
  /// Backend check of a peer copy's destination device (another device of this backend), run by
  /// copy_peer_async after the checks every backend shares: throws logic_error naming both devices when
  /// this backend cannot copy between them. The default accepts any (the CUDA runtime stages a copy it
  /// cannot make directly); the host backend accepts only devices of the same make_host_devices group.
  virtual void do_check_peer(device& peer) { static_cast<void>(peer); }
  /// Copies `bytes` from this device's `src` into `dst` on `dst_dev` (another device of this backend,
  /// accepted by do_check_peer) in the order of this device's stream `s`.
  virtual void do_copy_peer_async(void* dst, device& dst_dev, const void* src, std::size_t bytes,
                                  void* s) = 0;
  virtual void do_launch_host_func(void* s, std::function<void()> fn) = 0;
  virtual void do_spin_async(std::chrono::nanoseconds duration, void* s) = 0;
  virtual void do_synchronize() = 0;
  virtual void do_profiler_start() = 0;
  virtual void do_profiler_stop() = 0;
  virtual void do_trace_begin(trace::recorder& r) = 0;
  virtual void do_trace_end() = 0;

  /// For backends: stores the first exception escaping a host callback.
  void capture_callback_error(std::exception_ptr e) noexcept;
  /// Backends call this in their destructor, after their streams are idle, to free pooled events.
  void drain_event_pool() noexcept;

 private:
  friend class stream;
  friend class event;
  friend class buffer;
  friend class stream_view;

  void release_event(void* native, bool timing) noexcept;
  void free_buffer(void* p, std::size_t bytes, memory_kind kind, bool registered) noexcept;
  // Adds a pinning (an allocation or a registration) of `bytes` that took `took` to pinned_.
  void count_pinned(std::size_t bytes, std::chrono::duration<double> took);

  backend kind_;
  int ordinal_;
  bool tracing_ = false;
  mutable std::mutex mu_;
  std::vector<void*> event_pool_;
  std::exception_ptr callback_error_;
  pinned_stats pinned_{};
};

/// The modelled link between the emulated devices of one make_host_devices group, which their peer
/// copies (device::copy_peer_async) share. Each device sends at `gbps` and receives at `gbps` at once
/// (full duplex); a device's sends take turns, and so do its receives, so copies from one device to two
/// others (or from two into one) share its bandwidth, while a ring's copies (0->1, 1->2, 2->0) all run
/// at once. A copy lasts latency + bytes / gbps. docs/DEVICE.md says where the presets' figures come from.
struct peer_link_profile {
  double gbps = 390.0;                     // one direction of one device, decimal GB/s
  std::chrono::nanoseconds latency{5000};  // per copy, before the first byte

  /// NVLink between two H200s (NV18): a peer copy's measured one-direction bandwidth. The default.
  [[nodiscard]] static peer_link_profile nvlink() noexcept { return {390.0, std::chrono::nanoseconds{5000}}; }
  /// No peer path (NCCL_P2P_DISABLE=1 on the same pair): traffic staged through host memory, at the
  /// bandwidth NCCL reached there.
  [[nodiscard]] static peer_link_profile pcie_host() noexcept {
    return {27.3, std::chrono::nanoseconds{10000}};
  }
};

/// Options of the emulated host device. The link defaults model a PCIe gen5 x16 host link (docs/DEVICE.md
/// says where its figures come from; docs/PERFORMANCE.md holds measured ones); change them to ask "what
/// if the link were slower" without a GPU.
struct host_device_options {
  int ordinal = 0;                 // info().ordinal; make_host_devices numbers its devices from here
  double h2d_gbps = 53.6;          // pinned host to device
  double d2h_gbps = 54.8;          // pinned device to host
  double pageable_h2d_gbps = 6.7;  // through a staging buffer
  double pageable_d2h_gbps = 11.8;
  double duplex_gbps = 72.0;               // both directions at once, in total
  double d2d_gbps = 1500.0;                // device memory to device memory (reads + writes counted once)
  std::chrono::nanoseconds latency{5000};  // per copy, before the first byte
  std::uint64_t device_memory_bytes = 8 * (std::uint64_t{1} << 30);
  // Seeded random delays injected before stream operations, so tests shake out races.
  std::uint64_t seed = 0;
  double jitter_probability = 0.0;  // chance that an operation is delayed
  std::chrono::nanoseconds jitter_max{0};
  bool model_link = true;  // false: copies (peer copies too) run at memcpy speed
  // Pinned memory is mlock()ed, as a GPU's is locked. Where RLIMIT_MEMLOCK does not allow it (an
  // unprivileged user's 8 MiB), false uses unlocked memory instead, with a one-line note on stderr once
  // per process (the emulator needs no locked memory); true refuses as a GPU would: out_of_memory
  // naming RLIMIT_MEMLOCK.
  bool require_locked_pinned = false;
  // The link between the devices of one make_host_devices group; NVLink-like by default.
  peer_link_profile peer{};
};

/// Makes an emulated device: one thread per stream, real copies, an optional link model. Destroying one
/// of its streams waits for the work queued on it. It has no peers but itself (make_host_devices makes
/// devices that do). Throws logic_error for options out of range.
[[nodiscard]] std::unique_ptr<device> make_host_device(const host_device_options& options = {});

/// The most devices one make_host_devices group may hold.
inline constexpr int max_host_devices = 256;

/// Makes `n` emulated devices, each as make_host_device(options) would, numbered options.ordinal,
/// options.ordinal + 1, ... (0..n-1 by default), that share one peer link (options.peer): they are peers
/// of each other (can_access_peer, copy_peer_async). Jitter is seeded per device (options.seed mixed with
/// the ordinal). Destroy the devices' streams, events and buffers before the devices; the devices may be
/// destroyed in any order. Throws logic_error naming `n` outside [1, max_host_devices], or an option
/// out of range.
[[nodiscard]] std::vector<std::unique_ptr<device>> make_host_devices(int n,
                                                                     const host_device_options& options = {});

}  // namespace ferry
