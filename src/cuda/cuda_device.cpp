// The cuda backend: the device interface on the CUDA runtime (linked statically).
#include <cuda_profiler_api.h>
#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <vector>

#include "ferry/core/memlock.hpp"
#include "ferry/core/units.hpp"
#include "ferry/cuda/cuda.hpp"
#include "ferry/cuda/detail/architectures.hpp"
#include "ferry/cuda/detail/cuda_try.hpp"
#include "ferry/cuda/detail/kernels.cuh"
#include "ferry/cupti/cupti_tracer.hpp"
#include "ferry/device/device.hpp"

namespace ferry {
namespace {

cudaStream_t as_stream(void* s) noexcept { return static_cast<cudaStream_t>(s); }
cudaEvent_t as_event(void* e) noexcept { return static_cast<cudaEvent_t>(e); }

cudaMemcpyKind memcpy_kind(copy_direction dir) noexcept {
  switch (dir) {
    case copy_direction::host_to_device: return cudaMemcpyHostToDevice;
    case copy_direction::device_to_host: return cudaMemcpyDeviceToHost;
    case copy_direction::device_to_device: return cudaMemcpyDeviceToDevice;
    case copy_direction::host_to_host: return cudaMemcpyHostToHost;
  }
  return cudaMemcpyDefault;
}

struct host_func_payload {
  std::function<void()> fn;
  std::function<void(std::exception_ptr)> on_error;
};

void CUDART_CB run_host_func(void* user) noexcept {
  std::unique_ptr<host_func_payload> payload(static_cast<host_func_payload*>(user));
  try {
    payload->fn();
  } catch (...) {
    payload->on_error(std::current_exception());
  }
}

class cuda_device final : public device {
 public:
  explicit cuda_device(int ordinal) : device(backend::cuda, ordinal), ordinal_(ordinal) {
    int count = 0;
    const cudaError_t status = cudaGetDeviceCount(&count);
    if (status != cudaSuccess) {
      static_cast<void>(cudaGetLastError());
      throw cuda_error(static_cast<int>(status),
                       fmt::format("cannot open GPU {} on the cuda backend: {} ({}); use the host backend on "
                                   "machines without a GPU",
                                   ordinal, cudaGetErrorString(status), cudaGetErrorName(status)));
    }
    FERRY_EXPECTS(ordinal >= 0 && ordinal < count,
                  fmt::format("GPU ordinal {} is out of range: this machine has {} GPU(s)", ordinal, count));
    peer_access_.assign(static_cast<std::size_t>(count), peer_access::unknown);
    FERRY_CUDA_TRY(cudaSetDevice(ordinal_));
    // Host threads that wait for the device (event and stream synchronize) sleep rather than spin, so a
    // pipeline's waiting threads leave the CPU cores to the threads that make and check data. A context a
    // framework created earlier keeps its own choice (the call then fails harmlessly).
    if (cudaSetDeviceFlags(cudaDeviceScheduleBlockingSync) != cudaSuccess)
      static_cast<void>(cudaGetLastError());
    FERRY_CUDA_TRY(cudaFree(nullptr));  // create the primary context now, not inside the first timed call
    cudaDeviceProp prop{};
    FERRY_CUDA_TRY(cudaGetDeviceProperties(&prop, ordinal_));
    info_.kind = backend::cuda;
    info_.name = prop.name;
    info_.ordinal = ordinal_;
    info_.memory_bytes = prop.totalGlobalMem;
    info_.copy_engines = prop.asyncEngineCount;
    char bus[32] = {};
    if (cudaDeviceGetPCIBusId(bus, sizeof bus, ordinal_) == cudaSuccess) info_.pci_bus_id = bus;
    // Refuse here, naming the GPU and the build, rather than at the first kernel a bench or codec launches.
    if (const cudaError_t load = cuda_kernels::check_kernels_load(); load != cudaSuccess) {
      static_cast<void>(cudaGetLastError());
      throw cuda_error(
          static_cast<int>(load),
          fmt::format("GPU {} ({}, compute capability {}.{}) cannot run ferry's kernels: this build "
                      "carries {} ({}: {}); rebuild for it with -DCMAKE_CUDA_ARCHITECTURES={}{} (cmake, or "
                      "FERRY_CMAKE_ARGS for pip install) or use the host backend",
                      ordinal_, prop.name, prop.major, prop.minor, cuda_architectures(),
                      cudaGetErrorName(load), cudaGetErrorString(load), prop.major, prop.minor));
    }
  }

  ~cuda_device() override { drain_event_pool(); }

  [[nodiscard]] device_info info() const override { return info_; }

 protected:
  void* do_stream_create() override {
    select();
    cudaStream_t s = nullptr;
    FERRY_CUDA_TRY(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    return s;
  }
  void do_stream_destroy(void* s) noexcept override {
    FERRY_CUDA_TRY_NOTHROW(cudaStreamDestroy(as_stream(s)));
  }
  void do_stream_synchronize(void* s) override { FERRY_CUDA_TRY(cudaStreamSynchronize(as_stream(s))); }
  void do_stream_wait(void* s, void* e) override {
    FERRY_CUDA_TRY(cudaStreamWaitEvent(as_stream(s), as_event(e), 0));
  }
  bool do_is_null_stream(void* s) const noexcept override {
    return s == nullptr || as_stream(s) == cudaStreamLegacy || as_stream(s) == cudaStreamPerThread;
  }

  void* do_event_create(bool timing) override {
    select();
    cudaEvent_t e = nullptr;
    // cudaEventBlockingSync: a thread in cudaEventSynchronize sleeps instead of spinning, also when a
    // framework created the context before ferry did, so cudaDeviceScheduleBlockingSync above never took.
    const unsigned flags = cudaEventBlockingSync | (timing ? 0U : cudaEventDisableTiming);
    FERRY_CUDA_TRY(cudaEventCreateWithFlags(&e, flags));
    return e;
  }
  void do_event_destroy(void* e) noexcept override { FERRY_CUDA_TRY_NOTHROW(cudaEventDestroy(as_event(e))); }
  void do_event_record(void* e, void* s) override {
    FERRY_CUDA_TRY(cudaEventRecord(as_event(e), as_stream(s)));
  }
  void do_event_synchronize(void* e) override { FERRY_CUDA_TRY(cudaEventSynchronize(as_event(e))); }
  bool do_event_query(void* e) override {
    const cudaError_t status = cudaEventQuery(as_event(e));
    if (status == cudaErrorNotReady) return false;
    FERRY_CUDA_TRY(status);
    return true;
  }
  double do_elapsed_ms(void* start, void* stop) override {
    float ms = 0;
    FERRY_CUDA_TRY(cudaEventElapsedTime(&ms, as_event(start), as_event(stop)));
    return ms;
  }

  void* do_alloc(std::size_t bytes, memory_kind kind) override {
    select();
    void* p = nullptr;
    switch (kind) {
      case memory_kind::device: {
        const cudaError_t status = cudaMalloc(&p, bytes);
        if (status == cudaErrorMemoryAllocation) {
          static_cast<void>(cudaGetLastError());
          std::size_t free_bytes = 0, total = 0;
          static_cast<void>(cudaMemGetInfo(&free_bytes, &total));
          throw out_of_memory(fmt::format("device_buffer of {} cannot be allocated on {}: {} free of {}",
                                          format_bytes(bytes), info_.name, format_bytes(free_bytes),
                                          format_bytes(total)));
        }
        FERRY_CUDA_TRY(status);
        return p;
      }
      case memory_kind::pinned: {
        const cudaError_t status = cudaHostAlloc(&p, bytes, cudaHostAllocPortable);
        if (status == cudaErrorMemoryAllocation) {
          static_cast<void>(cudaGetLastError());
          throw out_of_memory(fmt::format(
              "pinning {} of host memory failed (cudaHostAlloc: out of memory); RLIMIT_MEMLOCK is {}",
              format_bytes(bytes), read_memlock().describe()));
        }
        FERRY_CUDA_TRY(status);
        verify_pinned(p, bytes);
        return p;
      }
      case memory_kind::pageable: {
        constexpr std::size_t page = 4096;
        p = std::aligned_alloc(page, (bytes + page - 1) / page * page);
        if (p == nullptr)
          throw out_of_memory(fmt::format("pageable buffer of {} cannot be allocated", format_bytes(bytes)));
        return p;
      }
    }
    return nullptr;
  }

  void do_free(void* p, std::size_t /*bytes*/, memory_kind kind) noexcept override {
    switch (kind) {
      case memory_kind::device: FERRY_CUDA_TRY_NOTHROW(cudaFree(p)); break;
      case memory_kind::pinned: FERRY_CUDA_TRY_NOTHROW(cudaFreeHost(p)); break;
      case memory_kind::pageable: std::free(p); break;
    }
  }

  // Registration pins the pages the caller's mapping has (faulting them in); other processes that map the
  // same shared pages write into memory this process's copies read without staging.
  void do_register_host(void* p, std::size_t bytes) override {
    select();
    const cudaError_t status = cudaHostRegister(p, bytes, cudaHostRegisterDefault);
    if (status == cudaErrorMemoryAllocation) {
      static_cast<void>(cudaGetLastError());
      throw out_of_memory(fmt::format(
          "registering {} of host memory failed (cudaHostRegister: out of memory); RLIMIT_MEMLOCK is {}",
          format_bytes(bytes), read_memlock().describe()));
    }
    FERRY_CUDA_TRY(status);
    cudaPointerAttributes attr{};
    const cudaError_t query = cudaPointerGetAttributes(&attr, p);
    if (query != cudaSuccess || attr.type != cudaMemoryTypeHost) {
      static_cast<void>(cudaGetLastError());
      static_cast<void>(cudaHostUnregister(p));
      throw cuda_error(
          static_cast<int>(cudaErrorInvalidValue),
          fmt::format("memory of {} registered with cudaHostRegister is not pinned (pointer "
                      "type {}, query {})",
                      format_bytes(bytes), static_cast<int>(attr.type), static_cast<int>(query)));
    }
  }
  void do_unregister_host(void* p, std::size_t /*bytes*/) noexcept override {
    FERRY_CUDA_TRY_NOTHROW(cudaHostUnregister(p));
  }

  void do_copy_async(void* dst, const void* src, std::size_t bytes, copy_direction dir,
                     memory_kind /*src_kind*/, memory_kind /*dst_kind*/, void* s) override {
    FERRY_CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, memcpy_kind(dir), as_stream(s)));
  }

  void do_memset_async(void* dst, std::uint8_t value, std::size_t bytes, memory_kind kind, void* s) override {
    if (kind == memory_kind::device) {
      FERRY_CUDA_TRY(cudaMemsetAsync(dst, value, bytes, as_stream(s)));
      return;
    }
    // Pinned host memory is written by the host, in stream order, so no kernel touches it over the link.
    do_launch_host_func(s, [dst, value, bytes] { std::memset(dst, value, bytes); });
  }

  void do_fill_pattern_async(void* dst, std::size_t bytes, std::uint64_t seed, memory_kind /*kind*/,
                             void* s) override {
    // Pinned memory is mapped into the device's address space (UVA), so the kernel writes it directly.
    select();
    FERRY_CUDA_TRY(cuda_kernels::launch_fill_pattern(dst, bytes, seed, as_stream(s)));
  }

  void do_checksum_async(const void* src, std::size_t bytes, void* result, void* s) override {
    select();
    FERRY_CUDA_TRY(cudaMemsetAsync(result, 0, sizeof(std::uint64_t), as_stream(s)));
    FERRY_CUDA_TRY(
        cuda_kernels::launch_checksum(src, bytes, static_cast<std::uint64_t*>(result), as_stream(s)));
  }

  bool do_can_access_peer(device& peer) override {
    if (peer.ordinal() == ordinal_) return true;  // another device object of this GPU
    int can = 0;
    FERRY_CUDA_TRY(cudaDeviceCanAccessPeer(&can, ordinal_, peer.ordinal()));
    return can != 0;
  }

  void do_copy_peer_async(void* dst, device& dst_dev, const void* src, std::size_t bytes, void* s) override {
    const int to = dst_dev.ordinal();
    enable_peer_access(to);
    FERRY_CUDA_TRY(cudaMemcpyPeerAsync(dst, to, src, ordinal_, bytes, as_stream(s)));
  }

  void do_launch_host_func(void* s, std::function<void()> fn) override {
    auto payload = std::make_unique<host_func_payload>(
        host_func_payload{std::move(fn), [this](std::exception_ptr e) { capture_callback_error(e); }});
    FERRY_CUDA_TRY(cudaLaunchHostFunc(as_stream(s), run_host_func, payload.get()));
    static_cast<void>(payload.release());  // owned by run_host_func from here on
  }

  void do_spin_async(std::chrono::nanoseconds duration, void* s) override {
    select();
    FERRY_CUDA_TRY(cuda_kernels::launch_spin(static_cast<std::uint64_t>(duration.count()), as_stream(s)));
  }

  void do_synchronize() override {
    select();
    FERRY_CUDA_TRY(cudaDeviceSynchronize());
  }
  void do_profiler_start() override {
    select();
    FERRY_CUDA_TRY(cudaProfilerStart());
  }
  void do_profiler_stop() override {
    select();
    FERRY_CUDA_TRY(cudaProfilerStop());
  }
  void do_trace_begin(trace::recorder& r) override {
    select();
    cupti::begin(r);
  }
  void do_trace_end() override {
    select();
    cupti::end();
  }

 private:
  // What copy_peer_async found out about each other GPU.
  enum class peer_access : std::uint8_t { unknown, enabled, staged };

  // The current device is per host thread; pipelines drive a device from several threads.
  void select() const { FERRY_CUDA_TRY(cudaSetDevice(ordinal_)); }

  // A buffer ferry calls pinned must be page-locked: a silently pageable "pinned" buffer makes every
  // asynchronous copy a slow synchronous one.
  static void verify_pinned(void* p, std::size_t bytes) {
    cudaPointerAttributes attr{};
    FERRY_CUDA_TRY(cudaPointerGetAttributes(&attr, p));
    if (attr.type != cudaMemoryTypeHost) {
      static_cast<void>(cudaFreeHost(p));
      throw cuda_error(static_cast<int>(cudaErrorInvalidValue),
                       fmt::format("buffer of {} returned by cudaHostAlloc is not registered as pinned "
                                   "(pointer type {})",
                                   format_bytes(bytes), static_cast<int>(attr.type)));
    }
  }

  // Lets this GPU reach GPU `to`'s memory directly, once, where the hardware allows it; without it
  // cudaMemcpyPeerAsync stages the copy through host memory. Access enabled by someone else in this
  // process (a framework, NCCL) is kept as it is.
  void enable_peer_access(int to) {
    if (to == ordinal_) return;
    const std::lock_guard lock(peer_mu_);
    peer_access& state = peer_access_.at(static_cast<std::size_t>(to));
    if (state != peer_access::unknown) return;
    int can = 0;
    FERRY_CUDA_TRY(cudaDeviceCanAccessPeer(&can, ordinal_, to));
    if (can != 0) {
      select();
      const cudaError_t status = cudaDeviceEnablePeerAccess(to, 0);
      if (status == cudaErrorPeerAccessAlreadyEnabled) {
        static_cast<void>(cudaGetLastError());  // clear what the runtime keeps for cudaGetLastError
      } else {
        FERRY_CUDA_TRY(status);
      }
    }
    state = can != 0 ? peer_access::enabled : peer_access::staged;
  }

  int ordinal_;
  device_info info_;
  std::mutex peer_mu_;
  std::vector<peer_access> peer_access_;  // by GPU ordinal; guarded by peer_mu_
};

}  // namespace

bool cuda_available() noexcept {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) static_cast<void>(cudaGetLastError());
  return status == cudaSuccess && count > 0;
}

int cuda_device_count() noexcept {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    static_cast<void>(cudaGetLastError());
    return 0;
  }
  return count;
}

std::string cuda_unavailable_reason() {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    static_cast<void>(cudaGetLastError());
    return fmt::format("no usable GPU: {} ({})", cudaGetErrorString(status), cudaGetErrorName(status));
  }
  if (count == 0) return "no GPU visible to the CUDA runtime";
  return {};
}

std::string cuda_architectures() { return detail::describe_cuda_architectures(FERRY_CUDA_ARCHITECTURES); }

std::unique_ptr<device> make_cuda_device(int ordinal) { return std::make_unique<cuda_device>(ordinal); }

}  // namespace ferry
