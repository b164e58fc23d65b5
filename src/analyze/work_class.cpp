// The table of what CPU activity is (by name), and the advice for each class.
#include "work_class.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>

#include "ferry/trace/names.hpp"

namespace ferry::trace::detail {

namespace {

enum class match {
  prefix,
  contains,
  driver,  // a CUDA driver API name: "cu" and a capital letter ("cuCtxGetDevice"), case as written
};

struct pattern {
  match how;
  std::string_view text;  // compared without regard to case
  work_class cls;
};

bool starts_with_ignoring_case(std::string_view s, std::string_view p) noexcept {
  return s.size() >= p.size() && contains_ignoring_case(s.substr(0, p.size()), p);
}

// Read top to bottom; the first line that matches decides. Runtime and driver calls come first (their names
// are exact API names), then the framework's operators, the host waits, the words that say what user code
// does, and the framework's other names. Anything else is the user's code.
constexpr std::array table{
    // Launches.
    pattern{match::prefix, "cudaLaunchKernel", work_class::launch},
    pattern{match::prefix, "cudaLaunchCooperativeKernel", work_class::launch},
    pattern{match::prefix, "cuLaunchKernel", work_class::launch},
    pattern{match::prefix, "cuLaunchCooperativeKernel", work_class::launch},
    pattern{match::prefix, "cudaGraphLaunch", work_class::launch},
    pattern{match::prefix, "cuGraphLaunch", work_class::launch},
    // Allocation and release of device and pinned memory (the caching allocator's calls).
    pattern{match::prefix, "cudaMalloc", work_class::allocator},
    pattern{match::prefix, "cudaFree", work_class::allocator},
    pattern{match::prefix, "cudaHostAlloc", work_class::allocator},
    pattern{match::prefix, "cudaHostRegister", work_class::allocator},
    pattern{match::prefix, "cudaHostUnregister", work_class::allocator},
    pattern{match::prefix, "cuMemAlloc", work_class::allocator},
    pattern{match::prefix, "cuMemFree", work_class::allocator},
    pattern{match::prefix, "cuMemHostAlloc", work_class::allocator},
    pattern{match::prefix, "cuMemCreate", work_class::allocator},
    pattern{match::prefix, "cuMemMap", work_class::allocator},
    pattern{match::prefix, "cuMemUnmap", work_class::allocator},
    pattern{match::prefix, "cuMemRelease", work_class::allocator},
    pattern{match::contains, "CachingAllocator", work_class::allocator},
    pattern{match::contains, "empty_cache", work_class::allocator},
    // Copies.
    pattern{match::prefix, "cudaMemcpy", work_class::copy},
    pattern{match::prefix, "cuMemcpy", work_class::copy},
    // Waits for the GPU, including the operators that read a value back.
    pattern{match::contains, "Synchronize", work_class::sync},
    pattern{match::prefix, "cudaStreamWaitEvent", work_class::sync},
    pattern{match::prefix, "cudaStreamQuery", work_class::sync},
    pattern{match::prefix, "cudaEventQuery", work_class::sync},
    pattern{match::prefix, "aten::item", work_class::sync},
    pattern{match::prefix, "aten::_local_scalar_dense", work_class::sync},
    // Any other runtime or driver call.
    pattern{match::prefix, "cuda", work_class::runtime},
    pattern{match::driver, "cu", work_class::runtime},
    // The framework's operators and collectives, whose names would otherwise read as user words below
    // ("aten::batch_norm", "ProcessGroupNCCL").
    pattern{match::prefix, "aten::", work_class::framework},
    pattern{match::prefix, "autograd::", work_class::framework},
    pattern{match::prefix, "c10d::", work_class::framework},
    pattern{match::prefix, "nccl", work_class::framework},
    pattern{match::contains, "ProcessGroup", work_class::framework},
    // ferry trace's automatic Python ranges (python/ferry/_trace_site), whose model and optimizer class
    // names could otherwise read as user words below ("TransformerDecoder").
    pattern{match::prefix, "forward (", work_class::framework},
    pattern{match::prefix, "optimizer.step (", work_class::framework},
    pattern{match::prefix, "backward", work_class::framework},
    // ferry trace's operating-system calls ("munmap (libtorch_cpu.so)"): unmapping a large buffer is the
    // release of a DataLoader batch's shared memory on the thread that consumed it; the others wait.
    pattern{match::prefix, "munmap (", work_class::data},
    pattern{match::prefix, "madvise (", work_class::data},
    pattern{match::prefix, "poll (", work_class::host_wait},
    pattern{match::prefix, "ppoll (", work_class::host_wait},
    pattern{match::prefix, "select (", work_class::host_wait},
    pattern{match::prefix, "epoll_", work_class::host_wait},
    pattern{match::prefix, "read (", work_class::host_wait},
    pattern{match::prefix, "recv", work_class::host_wait},
    pattern{match::prefix, "sem_", work_class::host_wait},
    pattern{match::prefix, "waitpid (", work_class::host_wait},
    pattern{match::prefix, "pthread_join (", work_class::host_wait},
    // Waits for other host work.
    pattern{match::contains, "queue", work_class::host_wait},
    pattern{match::contains, "pthread_cond", work_class::host_wait},
    pattern{match::contains, "cond_wait", work_class::host_wait},
    pattern{match::contains, "futex", work_class::host_wait},
    pattern{match::contains, "mutex", work_class::host_wait},
    pattern{match::contains, "lock.acquire", work_class::host_wait},
    pattern{match::contains, "semaphore", work_class::host_wait},
    pattern{match::contains, "sleep", work_class::host_wait},
    pattern{match::contains, "free buffer", work_class::host_wait},
    pattern{match::contains, "free slot", work_class::host_wait},
    // What the user's code says it does.
    pattern{match::contains, "DataLoader", work_class::data},
    pattern{match::contains, "make", work_class::data},
    pattern{match::contains, "load", work_class::data},
    pattern{match::contains, "batch", work_class::data},
    pattern{match::contains, "sample", work_class::data},
    pattern{match::contains, "collate", work_class::data},
    pattern{match::contains, "decode", work_class::data},
    pattern{match::contains, "process", work_class::output},
    pattern{match::contains, "output", work_class::output},
    pattern{match::contains, "write", work_class::output},
    pattern{match::contains, "save", work_class::output},
    pattern{match::contains, "post", work_class::output},
    // Any other wait the user named ("wait for a result").
    pattern{match::prefix, "wait for", work_class::host_wait},
    // The framework's own work.
    pattern{match::contains, "backward", work_class::framework},
    pattern{match::contains, "forward", work_class::framework},
    pattern{match::contains, "DistributedDataParallel", work_class::framework},
    pattern{match::contains, "Optimizer", work_class::framework},
    pattern{match::prefix, "torch.", work_class::framework},
    pattern{match::prefix, "torch/", work_class::framework},
};

}  // namespace

std::string_view to_string(work_class c) noexcept {
  switch (c) {
    case work_class::data: return "data";
    case work_class::output: return "output";
    case work_class::user: return "user";
    case work_class::framework: return "framework";
    case work_class::launch: return "launch";
    case work_class::allocator: return "allocator";
    case work_class::copy: return "copy";
    case work_class::sync: return "sync";
    case work_class::host_wait: return "host_wait";
    case work_class::runtime: return "runtime";
  }
  return "user";
}

work_class classify_work(std::string_view name, bool gpu_wait) noexcept {
  const auto it = std::find_if(table.begin(), table.end(), [name](const pattern& p) {
    switch (p.how) {
      case match::prefix: return starts_with_ignoring_case(name, p.text);
      case match::contains: return contains_ignoring_case(name, p.text);
      case match::driver:
        return name.size() > 2 && name.starts_with(p.text) && name[2] >= 'A' && name[2] <= 'Z';
    }
    return false;
  });
  const work_class c = it != table.end() ? it->cls : work_class::user;
  // A call that waited for the GPU is a sync, unless it is a copy (the copy rules explain those).
  if (gpu_wait && c != work_class::copy) return work_class::sync;
  return c;
}

bool movable(work_class c) noexcept {
  return c == work_class::data || c == work_class::output || c == work_class::user;
}

namespace {

// The PyTorch wording of the advice for the classes whose C++ wording names ferry's C++ classes; empty
// for the others (their advice already speaks of PyTorch and the CUDA runtime).
std::string torch_idle_advice(work_class c, std::string_view activity) {
  switch (c) {
    case work_class::data:
      return "load batches in worker processes: DataLoader(num_workers=..., pin_memory=True), and copy the "
             "next batch to the device while this step runs: .to(device, non_blocking=True), or "
             "ferry.torch.Prefetcher(loader), which does both on ferry's threads and copy stream";
    case work_class::output:
      return "hand outputs to worker threads: ferry.torch.Egress(sink).submit(output) copies each off the "
             "device on its own stream and its sink workers process it while the GPU runs the next step, "
             "instead of .cpu() and processing in the loop";
    case work_class::user:
      return fmt::format(
          "move '{}' out of the loop that launches GPU work, or overlap it with the GPU: input work into "
          "the DataLoader's workers (num_workers=...), output work into ferry.torch.Egress's sink workers, "
          "so the loop keeps queueing work ahead",
          activity);
    case work_class::copy:
      return fmt::format(
          "the loop is blocked in the copy call '{}': a copy from or to pageable memory, or a synchronous "
          "one, returns only when the copy and the work queued before it are done (see the sync_copy and "
          "pageable_async_copy findings); pinned memory and .to(device, non_blocking=True) "
          "(DataLoader(pin_memory=True), or ferry.torch.Prefetcher and ferry.torch.Egress) let the launches "
          "run ahead",
          activity);
    case work_class::sync:
      if (contains_ignoring_case(activity, "device"))
        return fmt::format(
            "the loop waits in '{}' while the GPU drains; see the device_sync finding: take "
            "torch.cuda.synchronize() out of the loop and wait on events (ferry.torch.Prefetcher and "
            "ferry.torch.Egress record one per slot)",
            activity);
      return fmt::format(
          "the loop waits in '{}' instead of queueing the next work; see the sync_copy finding: read values "
          "back (.item(), .cpu(), a printed tensor) less often, and copy with .to(device, non_blocking=True) "
          "from pinned memory (ferry.torch.Prefetcher, ferry.torch.Egress) so the launches run ahead",
          activity);
    case work_class::host_wait:
      return fmt::format(
          "the loop waits in '{}' for other host work (a full queue, a pool with no free buffer): the "
          "host, not the GPU, bounds the pipeline; see the host_bound finding: more workers "
          "(DataLoader(num_workers=...), ferry.torch.Egress(workers=...)) or cheaper host processing",
          activity);
    case work_class::framework:
    case work_class::launch:
    case work_class::allocator:
    case work_class::runtime: return {};
  }
  return {};
}

}  // namespace

std::string idle_advice(work_class c, std::string_view activity, bool pytorch) {
  if (pytorch) {
    std::string torch = torch_idle_advice(c, activity);
    if (!torch.empty()) return torch;
  }
  switch (c) {
    case work_class::data:
      return "make batches on worker threads: ferry::ingest::loader (ingest ladder L1) with "
             "ferry::ingest::prefetcher, so the next batch is ready and on the device when the step starts; "
             "with a DataLoader, more workers";
    case work_class::output:
      return "hand outputs to worker threads: ferry::egress::pipeline's sinks (egress ladder L1) process "
             "them while the GPU runs the next step";
    case work_class::user:
      return fmt::format(
          "move '{}' off the thread that launches GPU work, or overlap it with the GPU: run it on "
          "worker threads (ferry::ingest::loader, ferry::egress::pipeline's sinks) and keep the "
          "launching thread queueing work ahead",
          activity);
    case work_class::framework:
      return fmt::format(
          "'{}' is the framework's own work on the launching thread: the GPU finishes each kernel before "
          "the CPU side of the next operator has launched it (CPU-overhead bound); fewer, larger kernels "
          "(torch.compile, larger batches) or CUDA graphs (torch.compile mode=\"reduce-overhead\", "
          "torch.cuda.graphs) cut the per-operator cost; it cannot move to another thread",
          activity);
    case work_class::launch:
      return fmt::format(
          "the launching thread spends the idle time launching kernels ('{}'): the kernels are shorter "
          "than their launches (launch-bound); CUDA graphs replay a step in one launch "
          "(torch.cuda.graphs, torch.compile mode=\"reduce-overhead\"), and fusing small kernels "
          "(torch.compile) or larger batches make each launch do more work",
          activity);
    case work_class::allocator:
      return fmt::format(
          "'{}' inside a step is the allocator going to the driver (cudaFree and cudaMalloc synchronize the "
          "device): with PyTorch, the caching allocator freeing blocks to make room (torch.cuda.empty_cache "
          "in the loop, fragmentation); do not call empty_cache in the loop, set "
          "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, and allocate staging buffers once (ferry's "
          "pools reserve theirs at construction)",
          activity);
    case work_class::copy:
      return fmt::format(
          "the launching thread is blocked in the copy call '{}': a copy from or to pageable memory, or a "
          "synchronous one, returns only when the copy and the work queued before it are done (see the "
          "sync_copy and pageable_async_copy findings); pinned buffers and non-blocking copies on a copy "
          "stream (ferry::ingest::prefetcher, ferry::egress::pipeline) let the launches run ahead",
          activity);
    case work_class::sync:
      if (contains_ignoring_case(activity, "device"))
        return fmt::format(
            "the main thread waits in '{}' while the GPU drains; see the device_sync finding: wait on "
            "events, not the device (the ferry pipelines record one event per slot)",
            activity);
      return fmt::format(
          "the main thread waits in '{}' instead of queueing the next work; see the sync_copy finding: "
          "non-blocking copies from pinned memory on a copy stream (ferry::ingest::prefetcher, "
          "ferry::egress::pipeline) let the launches run ahead; read values back (.item(), .cpu()) less "
          "often",
          activity);
    case work_class::host_wait:
      return fmt::format(
          "the launching thread waits in '{}' for other host work (a full queue, a pool with no free "
          "buffer): the host, not the GPU, bounds the pipeline; see the host_bound finding: more workers "
          "(ferry::egress::pipeline's sinks, ferry::ingest::loader's workers) or cheaper host processing",
          activity);
    case work_class::runtime:
      return fmt::format(
          "the launching thread is in the CUDA call '{}'; if it recurs every step, hoist it out of the loop "
          "(stream and event creation, attribute queries and pinning belong in setup)",
          activity);
  }
  return {};
}

}  // namespace ferry::trace::detail
