// The analyzer's model of one timeline. Everything is interval arithmetic on one clock: the GPU's activity
// is merged into sorted, disjoint unions (all of it, and kernels alone, with prefix sums, so the covered
// length of any window costs O(log n)); each CPU thread's activity becomes a sorted segmentation labelled
// with its innermost activity, walked in order rather than held. Steps, idle gaps and the rules (rules.hpp)
// are then queries against those, O(n log n) in all. What is kept per event is a 4-byte index: a trace of
// 13 M events costs the analyzer a few hundred MB on top of the timeline itself.
//
// Building a model does everything but the findings: it checks the options, classifies the events,
// detects the steps, and fills the per-step breakdown and the idle attribution (breakdown.cpp).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ferry/analyze/analyze.hpp"
#include "ferry/trace/timeline.hpp"
#include "interval_union.hpp"

namespace ferry::trace::detail {

inline constexpr double ns_per_ms = 1e6;

/// Nanoseconds as milliseconds.
inline double ms(ns_t ns) { return static_cast<double>(ns) / ns_per_ms; }
inline double ms(double ns) { return ns / ns_per_ms; }

/// Exclusive GPU categories, in priority order: an instant covered by several counts as the first.
enum category : std::size_t { cat_compute, cat_comm, cat_d2d, cat_h2d, cat_d2h, cat_count };

/// A CPU activity that waited for the GPU: a sync event or a blocking API call.
[[nodiscard]] bool is_wait(const event& e);

/// A host-device copy whose host side is pageable memory.
[[nodiscard]] inline bool pageable_side(const event& c) {
  return (c.copy == copy_kind::h2d && c.src == mem_kind::pageable) ||
         (c.copy == copy_kind::d2h && c.dst == mem_kind::pageable);
}

/// Which CPU spans are steps.
struct step_matcher {
  std::string prefix;
  bool ferry_default = false;  // "step" exactly or "step ..." (not "step_x")
  [[nodiscard]] bool operator()(std::string_view name) const {
    if (ferry_default) return name == "step" || name.starts_with("step ");
    return !prefix.empty() && name.starts_with(prefix);
  }
};

/// One step's window on the timeline, and the thread whose span it came from (0 for the whole trace).
struct step_span {
  ns_t start = 0;
  ns_t end = 0;
  std::uint64_t thread = 0;
};

/// An event's position in timeline::events. The analyzer refuses timelines with more events than it holds.
using index_t = std::uint32_t;

/// A piece of one CPU thread's time, labelled with the innermost activity that covered it.
struct segment {
  ns_t start;
  ns_t end;
  std::uint64_t label;
};

class model;

/// One thread's activity as segments, in order: a piece is labelled with the innermost activity covering
/// it (the one that started last; on equal starts, the one that ends first), and adjacent pieces with the
/// same label are one segment. Holds only the activities open at the time it has reached.
class segment_walker {
 public:
  /// `evs`: the thread's event indices sorted by start; both must outlive the walker.
  segment_walker(const model& m, std::span<const index_t> evs);
  /// The next segment; false when there is none left.
  [[nodiscard]] bool next(segment& out);

 private:
  [[nodiscard]] bool next_piece(segment& out);
  const model& m_;
  const std::vector<event>& events_;
  std::span<const index_t> evs_;
  std::size_t i_ = 0;
  ns_t t_ = 0;
  std::vector<index_t> active_;  // a heap: the innermost open activity on top
  segment pending_{};
  bool has_pending_ = false;
};

/// Event indices grouped by thread: each thread's indices form one run of `order`, in the order given.
struct thread_groups {
  std::vector<index_t> order;
  std::map<std::uint64_t, std::pair<std::size_t, std::size_t>> runs;  // thread -> [begin, end) of order
  [[nodiscard]] std::span<const index_t> of(const std::pair<std::size_t, std::size_t>& run) const {
    return std::span<const index_t>(order).subspan(run.first, run.second - run.first);
  }
};

/// The indexed timeline and its breakdown, which every rule queries. Holds references to the timeline
/// and the options: both must outlive it.
class model {
 public:
  /// Labels of CPU activity: the name id, or for an unnamed sync event its kind with synthetic_bit set;
  /// blocking_bit marks a call that waited for the GPU.
  static constexpr std::uint64_t blocking_bit = std::uint64_t{1} << 63;
  static constexpr std::uint64_t synthetic_bit = std::uint64_t{1} << 62;

  /// Indexes `t` and computes its breakdown and idle attribution. Throws logic_error for options out of
  /// range, input_error when the timeline has no GPU activity in any step.
  model(const timeline& t, const analyze_options& opts);

  [[nodiscard]] const timeline& trace() const noexcept { return t_; }
  [[nodiscard]] const analyze_options& options() const noexcept { return opts_; }
  /// The fixes speak PyTorch (analyze_options::wording, resolved from the trace's origin).
  [[nodiscard]] bool pytorch() const noexcept { return pytorch_; }
  [[nodiscard]] std::string_view name(const event& e) const { return t_.name_of(e); }

  /// The analysis up to its findings: source, steps, their mean, the idle attribution.
  [[nodiscard]] const analysis& summary() const noexcept { return out_; }
  /// Moves the summary out of a model that is not used after.
  [[nodiscard]] analysis take_summary() && { return std::move(out_); }

  /// Indices of GPU events, by start (then end).
  [[nodiscard]] const std::vector<index_t>& gpu() const noexcept { return gpu_; }
  /// Indices of CPU events, by start (then end).
  [[nodiscard]] const std::vector<index_t>& cpu() const noexcept { return cpu_; }
  [[nodiscard]] const std::vector<step_span>& step_spans() const noexcept { return steps_; }
  /// The number of steps, for per-step figures.
  [[nodiscard]] double step_count() const { return static_cast<double>(steps_.size()); }
  [[nodiscard]] double per_step(double total) const { return total / step_count(); }
  /// No step spans were found: the trace is one step spanning its GPU activity.
  [[nodiscard]] bool whole_trace() const noexcept { return whole_trace_; }
  /// The thread that runs the loop (main_thread.cpp says how it is picked), if any.
  [[nodiscard]] const std::optional<std::uint64_t>& main_thread() const noexcept { return main_thread_; }
  [[nodiscard]] double mean_wall_ns() const noexcept { return mean_wall_ns_; }

  /// Everything the GPU did (the union of every category).
  [[nodiscard]] const interval_union& busy() const noexcept { return busy_; }
  /// Kernels alone.
  [[nodiscard]] const interval_union& kernels() const noexcept {
    return kernels_are_busy_ ? busy_ : kernels_;
  }
  /// Compute kernels alone (every kernel but the communication kernels).
  [[nodiscard]] const interval_union& compute() const noexcept {
    return comm_events_.empty() ? kernels() : compute_;
  }
  /// Communication alone: communication kernels (trace::is_comm_kernel) and peer copies.
  [[nodiscard]] const interval_union& comm() const noexcept { return comm_; }
  /// Communication kernels and peer copies, by start.
  [[nodiscard]] const std::vector<index_t>& comm_events() const noexcept { return comm_events_; }

  /// GPU idle inside the steps during any of `windows` (each instant counted once, however many windows
  /// hold it): what the CPU's blocking in those windows cost the GPU.
  [[nodiscard]] ns_t idle_during(std::vector<span> windows) const;

  /// The step holding time t (by start), or -1.
  [[nodiscard]] int step_of(ns_t t) const;
  /// The step whose span launched copy `i` (known through correlation ids), or -1.
  [[nodiscard]] int launch_step(index_t i) const;

  /// Copies for which pred(event) holds that start inside a step, by start.
  template <class Pred>
  [[nodiscard]] std::vector<std::size_t> copies_in_steps(Pred&& pred) const {
    std::vector<std::size_t> out;
    for (const index_t i : gpu_) {
      const event& c = t_.events[i];
      if (c.kind == activity::memcpy && step_of(c.start_ns) >= 0 && pred(c)) out.push_back(i);
    }
    return out;
  }

  /// The link ceiling for copies of kind k in GB/s: the options', else the trace's; 0 when unknown.
  [[nodiscard]] double link_gbps(copy_kind k) const;

  [[nodiscard]] std::string thread_name(std::uint64_t thread) const;
  [[nodiscard]] std::string stream_name(std::uint64_t stream) const;
  /// The text of a segment's label.
  [[nodiscard]] std::string label_text(std::uint64_t label) const;
  /// Activity that says nothing about what the CPU did (steps, a bench's level span, profiler operators).
  [[nodiscard]] bool excluded_activity(const event& e) const;
  /// The label of an activity in segments: its name id, or for an unnamed sync event its kind with
  /// synthetic_bit set; blocking_bit marks a call that waited for the GPU.
  [[nodiscard]] std::uint64_t label_of(const event& e) const;
  /// The events of `evs` (indices sorted by start) for which keep(event) holds, grouped by thread.
  template <class Keep>
  [[nodiscard]] thread_groups group_by_thread(const std::vector<index_t>& evs, Keep&& keep) const {
    thread_groups g;
    std::map<std::uint64_t, std::size_t> counts;
    std::size_t kept = 0;
    for (const index_t i : evs)
      if (keep(t_.events[i])) ++counts[t_.events[i].thread], ++kept;
    std::size_t at = 0;
    for (const auto& [thread, n] : counts) {
      g.runs[thread] = {at, at};
      at += n;
    }
    g.order.resize(kept);
    auto run = g.runs.end();
    for (const index_t i : evs) {
      const event& e = t_.events[i];
      if (!keep(e)) continue;
      if (run == g.runs.end() || run->first != e.thread) run = g.runs.find(e.thread);
      g.order[run->second.second++] = i;
    }
    return g;
  }

 private:
  void check_options() const;
  void classify();
  void detect_steps();
  void pick_main_thread();
  [[nodiscard]] bool autograd_thread(std::uint64_t thread) const;
  void place_steps_on_gpu();
  void build_unions();
  void breakdown();
  void attribute_idle();
  void find_uncovered_idle();
  [[nodiscard]] std::vector<std::array<ns_t, cat_count>> level_coverage() const;

  const timeline& t_;
  const analyze_options& opts_;
  bool pytorch_ = false;
  analysis out_;
  std::vector<index_t> gpu_;
  std::vector<index_t> cpu_;
  step_matcher matcher_;
  std::vector<step_span> steps_;
  std::vector<std::pair<index_t, index_t>> copy_steps_;  // (copy, the step that launched it), by copy
  bool whole_trace_ = false;
  std::optional<std::uint64_t> main_thread_;
  interval_union busy_;
  interval_union kernels_;            // when not every GPU event is a kernel
  bool kernels_are_busy_ = false;     // every GPU event is a kernel: kernels() is busy_
  interval_union compute_;            // kernels that are not communication, when there is communication
  interval_union comm_;               // communication kernels and peer copies
  std::vector<index_t> comm_events_;  // the same events, by start
  double mean_wall_ns_ = 0;
};

}  // namespace ferry::trace::detail
