// host_bound: the host, not the GPU, bounds the pipeline. Two signs, each costed in GPU time per step:
// - inside the steps, GPU idle while the launching thread waits on other host work (a queue get, a lock,
//   a condition variable, a sleep: work_class::host_wait), e.g. a producer blocked on a pool whose buffers
//   the workers have not returned;
// - after the last GPU activity, named host work that goes on for more than one mean step: the GPU ran
//   ahead and the run then waits for the host to drain its backlog (worker processes writing outputs).
//   The first step's worth is the latency of the last step's own work (drain_tail's); the rest, spread
//   over the steps, is what the backlog adds to each.
// The cost is bounded by the mean step.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <string>

#include "rules.hpp"
#include "wording.hpp"
#include "work_class.hpp"

namespace ferry::trace::detail {

void find_host_bound(const model& m, std::vector<finding>& out) {
  const analysis& s = m.summary();
  const double wall = s.mean.wall_ms;
  // Inside the steps: main-thread waits on host work, but its top wait when that is a wait for another
  // thread of the process that launches the GPU's work (delegated_work: gpu_idle names that thread).
  const idle_attribution* delegated_wait = delegated_work(m).wait;
  double wait_ms = 0;  // over all steps
  const idle_attribution* top_wait = nullptr;
  for (const idle_attribution& a : s.idle) {
    if (!a.main_thread || &a == delegated_wait ||
        classify_work(a.activity, a.blocking) != work_class::host_wait)
      continue;
    wait_ms += a.idle_ms;
    if (top_wait == nullptr) top_wait = &a;
  }
  const double wait_cost = std::min(wall, m.per_step(wait_ms));
  // After the last GPU activity: the backlog beyond one step's worth.
  const trailing_work w = find_trailing_work(m);
  const double tail_ms = ms(std::max<ns_t>(0, w.length()));
  const double backlog_ms = w.top_ns > 0 ? std::max(0.0, tail_ms - wall) : 0.0;
  const double tail_cost = std::min(wall - wait_cost, m.per_step(backlog_ms));
  const double cost = wait_cost + tail_cost;
  if (cost < material_fraction * wall) return;
  finding f;
  f.rule = "host_bound";
  f.cost_ms_per_step = cost;
  f.numbers = {{"cost_wait_idle_ms_per_step", wait_cost},
               {"cost_backlog_ms_per_step", tail_cost},
               {"wait_idle_ms_per_step", m.per_step(wait_ms)},
               {"tail_ms", tail_ms},
               {"backlog_ms", backlog_ms}};
  std::vector<std::string> parts;
  if (top_wait != nullptr && wait_cost > 0)
    parts.push_back(fmt::format(
        "inside the steps the GPU idled {} per step while the main thread ({}) waited on host work, mostly "
        "in '{}' ({} of the idle)",
        ms_text(wait_cost), top_wait->thread, top_wait->activity, pct(top_wait->fraction_of_idle)));
  std::string tail_activity;
  if (tail_cost > 0) {
    tail_activity = m.label_text(w.label);
    parts.push_back(fmt::format(
        "after the last GPU activity the host worked {} more ({:.1f} mean steps), mostly {} in '{}' ({}); "
        "beyond the first step's worth that is {} of backlog, {} per step over {} steps{}",
        ms_text(tail_ms), wall > 0 ? tail_ms / wall : 0.0, m.thread_name(w.thread), tail_activity,
        ms_text(ms(w.top_ns)), ms_text(backlog_ms), ms_text(tail_cost), s.steps.size(),
        tail_cost < m.per_step(backlog_ms) ? " (counted up to the step's length)" : ""));
  }
  f.evidence = fmt::format("{}", fmt::join(parts, "; "));
  f.title = wait_cost >= tail_cost
                ? fmt::format("host-bound: the GPU waits {} per step while the main thread waits on '{}'",
                              ms_text(cost), top_wait->activity)
                : fmt::format("host-bound: the GPU finishes early and the run waits {} for '{}' after it",
                              ms_text(tail_ms), tail_activity);
  f.fix = m.pytorch()
              ? "give the host work more hands or less to do: more DataLoader workers (num_workers=...) for "
                "inputs, more sink workers for outputs (ferry.torch.Egress(sink, workers=...)), enough slots "
                "that the producer never waits for a free one (Egress(slots=...), Prefetcher(depth=...)), "
                "and cheaper per-output processing (no copy into a fresh object before writing)"
              : "give the host work more hands or less to do: more sink workers (ferry::egress::pipeline's "
                "sinks, egress L1) or loader workers (ferry::ingest::loader), a pool deep enough that the "
                "producer never waits for a free buffer, and cheaper per-output processing (no copy into a "
                "fresh object before writing)";
  out.push_back(std::move(f));
}

}  // namespace ferry::trace::detail
