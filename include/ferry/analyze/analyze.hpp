// The analyzer: turns a timeline (recorded by ferry or imported from a PyTorch profiler trace) into a
// per-step breakdown of what the GPU did, what the CPU did while the GPU idled, and findings: each names
// a bottleneck with its evidence (times, counts, bytes) and the fix (a ferry component or ladder level).
//
// Host only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/trace/timeline.hpp"

namespace ferry::trace {

/// Whose words the findings' fixes use.
enum class fix_wording {
  automatic,  // from the trace's origin (wording_for): PyTorch's for a PyTorch profiler trace and for
              // `ferry trace` of a Python program (its "ferry.python" annotation), else C++
  cpp,        // ferry's C++ API and the bench ladders: ferry::ingest::prefetcher, egress L3
  pytorch,    // PyTorch's: DataLoader(num_workers=..., pin_memory=True), .to(device, non_blocking=True),
              // ferry.torch.Prefetcher and ferry.torch.Egress
};

/// The wording `automatic` picks for a timeline from `source` (timeline::source): pytorch for what the
/// Chrome trace importer read (a PyTorch profiler export, or another Chrome trace ferry did not write),
/// cpp for a trace ferry recorded.
[[nodiscard]] fix_wording wording_for(std::string_view source) noexcept;

/// Every rule id a finding can carry (finding::rule), in ranking order: what --fail-on accepts.
[[nodiscard]] const std::vector<std::string>& rule_ids();

struct analyze_options {
  /// Step spans: ranges or stage spans whose name starts with this prefix, on any CPU thread. Empty:
  /// "ProfilerStep#" (PyTorch profiler) or else "step" (ferry's benches), whichever the trace has. A
  /// trace without step spans is analyzed as one step spanning its GPU activity.
  std::string step_prefix;
  /// GPU idle above this fraction of a step is a finding.
  double idle_threshold = 0.10;
  /// Copies below this fraction of the link are a finding ("far below the probed link").
  double low_bandwidth_fraction = 0.5;
  /// Link ceilings in GB/s; 0 takes the trace's own (timeline::link_*), and when that is 0 too the
  /// bandwidth rule compares pinned copies with nothing and stays quiet.
  double link_h2d_gbps = 0;
  double link_d2h_gbps = 0;
  /// The words of the fixes.
  fix_wording wording = fix_wording::automatic;
};

/// What one step's GPU time went to. Times in milliseconds; categories are exclusive, taken in the order
/// compute, comm, d2d, h2d, d2h (so a copy overlapping a kernel counts as compute), and idle is what no
/// GPU activity covers. overlap: the fraction of copy time that ran while a kernel ran.
struct step_breakdown {
  int index = 0;
  std::int64_t start_ns = 0;
  std::int64_t end_ns = 0;
  double wall_ms = 0;
  double compute_ms = 0;
  double h2d_ms = 0;
  double d2h_ms = 0;
  double d2d_ms = 0;   // device to device copies and memsets
  double comm_ms = 0;  // communication kernels (NCCL) and peer copies
  double idle_ms = 0;
  double utilization = 0;   // 1 - idle / wall
  double copy_overlap = 0;  // copy time overlapped by kernels / copy time; 0 when no copies
  std::uint64_t h2d_bytes = 0;
  std::uint64_t d2h_bytes = 0;
};

/// Where GPU idle time went on the CPU side: the innermost range (NVTX, stage or annotation) or blocking
/// API call of one thread that covered the idle time.
struct idle_attribution {
  std::string thread;    // thread name, or "thread <id>"
  std::string activity;  // the range or call name
  double idle_ms = 0;    // idle time it covered, over all analyzed steps
  double fraction_of_idle = 0;
  std::uint64_t thread_id = 0;
  bool blocking = false;     // a call that waited for the GPU (a sync event or a blocking API call)
  bool main_thread = false;  // the thread that runs the loop (analysis::main_thread)
  /// What the activity is, which decides the advice: data, output, user (work that could move off the
  /// launching thread), framework, launch, allocator, copy, sync, host_wait, runtime.
  std::string work;
};

/// A CPU activity next to the main thread's stretches without recorded activity, and how much of the GPU
/// idle those stretches held.
struct idle_neighbour {
  std::string activity;
  std::size_t gaps = 0;  // stretches it came just before (or just after)
  double idle_ms = 0;    // GPU idle in those stretches, over all analyzed steps
};

/// GPU idle while the main thread ran nothing the trace recorded (plain Python between profiler
/// operators, a wait in code no annotation covers), and what the thread did just before and just after.
struct uncovered_idle {
  double idle_ms = 0;  // over all analyzed steps
  double fraction_of_idle = 0;
  std::size_t gaps = 0;                // stretches of the main thread without activity that held GPU idle
  std::vector<idle_neighbour> before;  // the activity that ended just before a stretch, most idle first
  std::vector<idle_neighbour> after;   // the activity that started just after it
};

/// One finding. `rule` is a stable id:
///   gpu_idle              GPU idle above the threshold (evidence: the CPU activity that covered it)
///   pageable_async_copy   an asynchronous copy from or to pageable memory (it is staged and blocks)
///   sync_copy             a blocking copy that keeps the next launch waiting
///   device_sync           a device-wide synchronize every step
///   serialized_copy       copies and kernels on one stream, never overlapping
///   exposed_comm          communication (NCCL kernels, peer copies) running while no compute kernel does:
///                         the all-reduce left exposed after backward, which the next compute waits for
///   low_copy_bandwidth    copies far below the probed link
///   compute_bound         no transfer bottleneck: the GPU computes nearly all the time (informational)
///   host_bound            the host bounds the pipeline: GPU idle while the main thread waits on other
///                         host work (a queue, a free buffer), or a backlog of host work after the last
///                         GPU activity longer than a step
///   drain_tail            host work that goes on after the last step's GPU work for up to a step (latency
///                         at the end of a run, not lost per step: cost 0, listed last)
/// A finding that costs no GPU time per step is not listed, but for compute_bound (the verdict when
/// nothing else costs) and drain_tail (its cost is at the end of the run, not per step).
struct finding {
  std::string rule;
  std::string title;                      // one line: what is wrong
  std::string evidence;                   // times, counts, bytes
  std::string fix;                        // what to change, naming the ferry component or ladder level
  double cost_ms_per_step = 0;            // estimated GPU time lost per step; findings are sorted by it
  std::map<std::string, double> numbers;  // the evidence as numbers, for --json and tests
  /// gpu_idle: the kind of the activity it names as the cause (idle_attribution::work), "" when none. A
  /// gpu_idle whose cause a more specific finding explains (a copy: sync_copy, pageable_async_copy; a
  /// wait on host work: host_bound) gives way to that finding when it costs 3% of the step.
  std::string cause = {};
};

struct analysis {
  std::string source;
  std::string device_name;
  std::uint64_t dropped = 0;  // the recorder's dropped events: the analysis may miss activity
  std::map<std::string, std::uint64_t>
      skipped;              // records the importer skipped, by reason (timeline::skipped)
  std::string step_prefix;  // what the steps were taken from ("" = whole trace)
  std::string main_thread;  // the thread that runs the loop; "" = none
  /// The rule that picked it: step_spans (it holds the step spans), tid_is_pid (its id is its process's),
  /// most_annotations, most_api_calls, or autograd_only (the autograd engine's thread, nothing else
  /// qualified); "" = no main thread.
  std::string main_thread_rule;
  std::vector<step_breakdown> steps;
  step_breakdown mean;                 // the mean over steps (index -1)
  std::vector<idle_attribution> idle;  // largest first
  uncovered_idle uncovered;            // GPU idle the main thread's recorded activity does not cover
  std::vector<finding> findings;       // costliest first; never empty (compute_bound at least)
  /// The rule of the first finding: what bounds this workload.
  [[nodiscard]] const std::string& bottleneck() const { return findings.front().rule; }
};

/// Analyzes `t`. Throws input_error when the timeline has no GPU activity in any step.
[[nodiscard]] analysis analyze(const timeline& t, const analyze_options& opts = {});

/// One process of a multi-process recording (`ferry trace`), as the session analysis lists it.
struct process_summary {
  std::uint64_t key = 0;  // timeline::processes' key
  std::uint64_t pid = 0;
  std::uint64_t parent = 0;  // the parent's key; 0 when it was not recorded
  std::string name;
  std::string command;
  std::string started;
  std::string ended;
  bool gpu = false;
  std::size_t events = 0;
  double cpu_cores = -1;  // mean CPU use over the launcher's samples (1 = one core); -1 without samples
  std::map<std::string, std::string> notes;
};

/// A descendant process of a GPU-owning process (a DataLoader worker, a post-processing worker) while
/// that process's GPU idled.
struct worker_activity {
  std::string process;       // "DataLoader worker 2 [1240]"
  double cpu_cores = 0;      // mean CPU use in the samples taken while the GPU idled
  double busy_fraction = 0;  // the share of those samples in which it used at least 0.9 of a core
};

/// The analysis of one GPU-owning process (a rank), with its descendants' events and CPU use.
struct process_analysis {
  std::uint64_t key = 0;
  std::string name;  // "python train.py [1234]"
  analysis result;
  std::vector<worker_activity> workers;  // busiest first
  double workers_cores = 0;              // their CPU use while the GPU idled, together
};

/// The analysis of a multi-process recording: the process tree, one analysis per GPU-owning process,
/// the straggler among several, and what the recording cost when the steps before the capture are known.
struct session_analysis {
  std::vector<process_summary> processes;  // by start time
  std::vector<process_analysis> ranks;     // the processes with GPU activity
  /// With two or more ranks: the one that computes longest per step (the others wait for it in their
  /// collectives), and by how much, as a fraction of the fastest.
  std::string straggler;
  double straggler_excess = 0;
  double launcher_cpu_cores = -1;  // the launcher's own CPU use; -1 when unknown
  /// Step time before the capture opened and while it ran (`ferry trace --delay/--steps`), and the cost
  /// (during / before - 1); -1 when not measured.
  std::size_t steps_before = 0;  // whole steps recorded before the capture opened (uncaptured)
  std::size_t steps_during = 0;  // whole steps inside the capture
  double steps_before_ms = -1;
  double steps_during_ms = -1;
  double recording_cost = -1;
  std::vector<std::string> notes;  // what the reader should know: a handover, CUPTI missing, a killed process
};

/// Analyzes a multi-process timeline (read_process_traces). A recording without GPU activity still
/// lists its processes (ranks empty).
[[nodiscard]] session_analysis analyze_session(const timeline& t, const analyze_options& opts = {});
/// Sets s.straggler from s.ranks (two or more): for per-rank traces analyzed one by one (a directory of
/// torch.profiler traces) as for a recording.
void find_straggler(session_analysis& s);
[[nodiscard]] std::string format_text(const session_analysis& s);
[[nodiscard]] std::string to_json(const session_analysis& s);

/// A human-readable report: breakdown table, idle attribution, findings with evidence and fix.
[[nodiscard]] std::string format_text(const analysis& a);
/// The analysis as JSON (the same content as the text).
[[nodiscard]] std::string to_json(const analysis& a);

}  // namespace ferry::trace
