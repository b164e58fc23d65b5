// drain_tail: work the host still does after the last step's GPU work ended: the last output processed
// once all of it arrived, say. Up to one step's worth it is the latency of the last step's work, not time
// lost every step, so it costs nothing per step and is listed after the findings that do; it explains a
// wall-clock ratio that the steps' breakdown does not. A longer tail is a backlog the host built up while
// the GPU ran ahead: host_bound names that instead. Only named work counts (ranges and stage spans, not
// API calls or waits).
#include <fmt/format.h>

#include <string>

#include "rules.hpp"
#include "wording.hpp"
#include "work_class.hpp"

namespace ferry::trace::detail {

void find_drain_tail(const model& m, std::vector<finding>& out) {
  const trailing_work w = find_trailing_work(m);
  const ns_t tail = w.length();
  const ns_t window = w.end - m.step_spans().front().start;
  if (tail <= 0 || window <= 0 || w.top_ns <= 0 ||
      static_cast<double>(tail) < material_fraction * static_cast<double>(window))
    return;
  if (static_cast<double>(tail) > m.mean_wall_ns()) return;  // a backlog: host_bound's finding
  const std::string activity_name = m.label_text(w.label);
  const std::string thread = m.thread_name(w.thread);
  const double tail_ms = ms(tail);
  finding f;
  f.rule = "drain_tail";
  f.cost_ms_per_step = 0;
  f.title = fmt::format(
      "after the last step the host works {} more ({} of the traced time), mostly {} in '{}'",
      ms_text(tail_ms), pct(static_cast<double>(tail) / static_cast<double>(window)), thread, activity_name);
  f.evidence = fmt::format(
      "the last step's GPU work ended {} before the last host work; '{}' on {} covered {} "
      "of that; over {} steps this adds {} per step to a run's wall time",
      ms_text(tail_ms), activity_name, thread, ms_text(ms(w.top_ns)), m.summary().steps.size(),
      ms_text(tail_ms / m.step_count()));
  f.fix =
      classify_work(activity_name) == work_class::output
          ? (m.pytorch() ? "hand outputs to ferry.torch.Egress as they are made: its sink workers "
                           "process each in slot-sized chunks as they arrive, so the last output's "
                           "processing overlaps its own copy instead of trailing the run"
                         : "process outputs in slot-sized chunks as they arrive (ferry::egress::pipeline), "
                           "so the last output's processing overlaps its own copy instead of trailing the "
                           "run")
          : fmt::format(
                "overlap '{}' with the GPU work before it, or split it into smaller pieces that "
                "start as their inputs arrive",
                activity_name);
  f.numbers = {{"tail_ms", tail_ms},
               {"tail_fraction", static_cast<double>(tail) / static_cast<double>(window)},
               {"activity_ms", ms(w.top_ns)},
               {"tail_ms_per_step", tail_ms / m.step_count()}};
  out.push_back(std::move(f));
}

}  // namespace ferry::trace::detail
