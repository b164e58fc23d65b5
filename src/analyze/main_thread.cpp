// Which CPU thread runs the loop: the one whose idle time and waits the findings speak of. The rules, in
// order (analysis::main_thread_rule names the one that decided):
//   step_spans        the thread holding the step spans (PyTorch's ProfilerStep#, ferry's step)
//   tid_is_pid        the thread whose id is its process's id (a process's first thread)
//   most_annotations  the thread issuing the most annotations (record_function, NVTX, ferry's stages)
//   most_api_calls    the thread issuing the most CUDA runtime and driver calls
//   autograd_only     the autograd engine's thread, when no other thread has any of the above
// The autograd engine's threads (PyTorch's "pt_autograd_0", ...) launch the backward pass's kernels, so
// they often issue the most calls; they never run the loop, so they are taken only when nothing else is.
#include <map>
#include <set>

#include "ferry/trace/names.hpp"
#include "model.hpp"

namespace ferry::trace::detail {

bool model::autograd_thread(std::uint64_t thread) const {
  const auto it = t_.thread_names.find(thread);
  return it != t_.thread_names.end() && contains_ignoring_case(it->second, "autograd");
}

void model::pick_main_thread() {
  const auto take = [this](std::uint64_t thread, std::string_view rule) {
    main_thread_ = thread;
    out_.main_thread = thread_name(thread);
    out_.main_thread_rule = std::string(rule);
  };
  // The thread with the highest count, ties to the lowest id; autograd threads only when `autograd`.
  const auto best = [this](const std::map<std::uint64_t, std::size_t>& counts,
                           bool autograd) -> std::optional<std::uint64_t> {
    std::optional<std::uint64_t> top;
    std::size_t top_n = 0;
    for (const auto& [thread, n] : counts)
      if (n > top_n && autograd_thread(thread) == autograd) top = thread, top_n = n;
    return top;
  };
  if (!whole_trace_) {
    std::map<std::uint64_t, std::size_t> per_thread;
    for (const step_span& s : steps_) ++per_thread[s.thread];
    std::optional<std::uint64_t> t = best(per_thread, false);
    if (!t) t = best(per_thread, true);
    if (t) return take(*t, "step_spans");
  }
  std::map<std::uint64_t, std::size_t> annotations, api_calls;
  std::set<std::uint64_t> threads;
  for (std::size_t i : cpu_) {
    const event& e = t_.events[i];
    threads.insert(e.thread);
    if (e.kind == activity::api) ++api_calls[e.thread];
    if ((e.kind == activity::range || e.kind == activity::stage) && !excluded_activity(e))
      ++annotations[e.thread];
  }
  for (std::uint64_t thread : threads) {
    const auto p = t_.thread_processes.find(thread);
    if (p != t_.thread_processes.end() && p->second == thread && !autograd_thread(thread))
      return take(thread, "tid_is_pid");
  }
  if (const auto t = best(annotations, false)) return take(*t, "most_annotations");
  if (const auto t = best(api_calls, false)) return take(*t, "most_api_calls");
  if (auto t = best(annotations, true)) return take(*t, "autograd_only");
  if (auto t = best(api_calls, true)) return take(*t, "autograd_only");
}

}  // namespace ferry::trace::detail
