// What a CPU activity that covered GPU idle time is, and therefore what to do about it. One table
// (work_class.cpp) maps activity names to a class; each class has its own explanation and fix. Only work
// that could leave the launching thread (making data, handling output, the user's own code) is told to
// move to ferry's workers; framework calls, launches, allocator calls, copies and waits each get theirs.
#pragma once

#include <string>
#include <string_view>

namespace ferry::trace::detail {

enum class work_class {
  data,       // makes or fetches input: a DataLoader's __next__, "make batch", collate
  output,     // handles output: post-processing, writing, saving
  user,       // the user's own code or annotation (record_function, FERRY_RANGE) not named otherwise
  framework,  // the framework's own work: forward/backward, autograd, DDP, optimizers, aten operators
  launch,     // kernel launches (cudaLaunchKernel, cuLaunchKernel, cudaGraphLaunch)
  allocator,  // device or pinned memory allocation and release (cudaMalloc, cudaFree, caching allocator)
  copy,       // a copy call (cudaMemcpy, cudaMemcpyAsync): it blocks for pageable or synchronous copies
  sync,       // a wait for the GPU (stream, event or device synchronize, a value read back)
  host_wait,  // a wait for other host work (a queue get, a lock, a condition variable, a sleep)
  runtime,    // any other CUDA runtime or driver call
};

/// Stable id ("data", "host_wait", ...), as the JSON writes it.
[[nodiscard]] std::string_view to_string(work_class c) noexcept;

/// The class of a CPU activity named `name`; `gpu_wait` is true for a call or sync event that waited
/// for the GPU (what the idle attribution marks as blocking). The first matching line of the table wins.
[[nodiscard]] work_class classify_work(std::string_view name, bool gpu_wait = false) noexcept;

/// True for work that could run off the thread that launches GPU work (data, output, user).
[[nodiscard]] bool movable(work_class c) noexcept;

/// The fix for GPU idle covered by `activity` of class `c` on the launching thread, as one sentence: in
/// PyTorch's words (DataLoader, ferry.torch) with `pytorch`, else in ferry's C++ API's.
[[nodiscard]] std::string idle_advice(work_class c, std::string_view activity, bool pytorch);

}  // namespace ferry::trace::detail
