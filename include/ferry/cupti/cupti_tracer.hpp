// The cuda backend's recorder: CUPTI's activity API delivering kernels, copies, memsets,
// synchronizations, runtime API calls and NVTX ranges into a trace::recorder, on ferry's host clock.
#pragma once

#include <cstddef>
#include <string_view>

namespace ferry::trace {
class recorder;
}

namespace ferry::cupti {

/// Enables the activity kinds and routes their records into `r` (records arriving after r stops
/// capturing still land if they describe work inside the window). Process-wide: one at a time.
/// Loads libcupti at the first call. Throws cuda_error (with the CUPTI result) when CUPTI refuses or
/// cannot be loaded (the message names every library tried), logic_error when already running.
/// What begin() records.
struct options {
  /// Kernels, copies and memsets only: no synchronizations and no runtime API calls, which cost a
  /// launch-bound program the most (`ferry trace --lite`).
  bool lite = false;
  /// CUPTI's synchronization records (which stream or event a wait was for). Off keeps the runtime
  /// calls that wait, as calls (`ferry trace --no-syncs`); `lite` turns them off too.
  bool syncs = true;
  /// Every runtime call. By default the records of the queries that PyTorch makes around every kernel and
  /// that neither wait nor start work (quiet_runtime_call: cudaGetDevice, cudaGetLastError,
  /// cudaDeviceGetAttribute, cudaStreamIsCapturing, ...) are left out: most of an eager program's calls.
  /// CUPTI still intercepts them, so this shrinks the recording, not its cost (`ferry trace
  /// --all-runtime-calls` keeps them).
  bool all_runtime_calls = false;
  /// CUPTI's NVTX markers. Off when another NVTX tool records the ranges (`ferry trace`'s injection
  /// library is the process's NVTX tool itself).
  bool markers = true;
  /// Converts the records on the thread that calls flush() or end(), not inside CUPTI's buffer callback,
  /// which CUPTI may call from inside its own locked sections (torch.profiler's recorder keeps that
  /// callback to a hand-over). Off by default until measured on a GPU (`FERRY_TRACE_DEFER_CONVERSION=1`
  /// under `ferry trace`); up to 16 buffers wait, past that they are converted in the callback.
  bool defer_conversion = false;
};

void begin(trace::recorder& r, const options& o = {});
/// Whether a runtime call, by its CUPTI callback name ("cudaGetDevice_v3020"; the version and
/// per-thread-stream suffixes are ignored), is one of the queries left out unless
/// options::all_runtime_calls: it neither waits for the GPU nor starts work.
[[nodiscard]] bool quiet_runtime_call(std::string_view name) noexcept;
/// How many runtime calls the last begin() left out (0: every call recorded, or none).
[[nodiscard]] std::size_t quiet_calls_left_out() noexcept;
/// Delivers the records CUPTI has completed into the recorder (forced: also the buffers it is still
/// filling), with the synchronizations whose calls have been seen. For a recorder that is drained while
/// the program runs (`ferry trace`). No-op without a running trace. Never throws.
void flush(bool forced) noexcept;
/// Flushes every buffered record into the recorder, disables the activity kinds and detaches.
void end();
/// end(), after which no begin() is taken in this process (it throws logic_error): for a process about to
/// tear CUDA down, where a CUPTI call would crash it. Waits for a begin(), flush() or end() in progress on
/// another thread, so none of theirs runs after it; for a second at most, after which it returns leaving
/// CUPTI as it is. Without a running trace it makes no CUPTI call.
void close();
/// For a process whose CUDA may already be torn down: drops the running trace without a CUPTI call (its
/// records not yet delivered are lost) and takes no begin() after it.
void abandon() noexcept;

}  // namespace ferry::cupti
