// drain_tail: work the host still does after the last step's GPU work ended: a whole output processed only
// once all of it arrived, say. It is latency at the end of a run, not time lost every step, so it costs
// nothing per step and is listed after the findings that do; it explains a wall-clock ratio that the
// steps' breakdown does not. Only named work counts (ranges and stage spans, not API calls or waits).
#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <string>
#include <utility>

#include "rules.hpp"
#include "wording.hpp"

namespace ferry::trace::detail {

void find_drain_tail(const model& m, std::vector<finding>& out) {
  const timeline& t = m.trace();
  if (m.step_spans().empty()) return;
  const ns_t tail_start = m.step_spans().back().end;
  std::map<std::uint64_t, std::vector<std::size_t>> per_thread;
  ns_t tail_end = tail_start;
  for (std::size_t i : m.cpu()) {
    const event& e = t.events[i];
    if (e.end_ns <= e.start_ns || m.excluded_activity(e)) continue;
    per_thread[e.thread].push_back(i);
    if ((e.kind == activity::range || e.kind == activity::stage) && e.end_ns > tail_start)
      tail_end = std::max(tail_end, e.end_ns);
  }
  const ns_t tail = tail_end - tail_start;
  const ns_t window = tail_end - m.step_spans().front().start;
  if (tail <= 0 || window <= 0 || static_cast<double>(tail) < material_fraction * static_cast<double>(window))
    return;
  // The named activity that covered most of the tail, over every thread.
  std::map<std::pair<std::uint64_t, std::uint64_t>, ns_t> covered;
  for (const auto& [thread, evs] : per_thread) {
    for (const segment& g : m.segment_thread(evs)) {
      if ((g.label & (model::blocking_bit | model::synthetic_bit)) != 0 || g.end <= tail_start) continue;
      covered[{thread, g.label}] += std::min(g.end, tail_end) - std::max(g.start, tail_start);
    }
  }
  std::pair<std::uint64_t, std::uint64_t> top{};
  ns_t top_ns = 0;
  for (const auto& [key, n] : covered)
    if (n > top_ns) top = key, top_ns = n;
  if (top_ns <= 0) return;
  const std::string activity_name = m.label_text(top.second);
  const std::string thread = m.thread_name(top.first);
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
      ms_text(tail_ms), activity_name, thread, ms_text(ms(top_ns)), m.summary().steps.size(),
      ms_text(tail_ms / m.step_count()));
  f.fix = mentions_any(activity_name, output_words)
              ? "process outputs in slot-sized chunks as they arrive (ferry::egress::pipeline), so the last "
                "output's processing overlaps its own copy instead of trailing the run"
              : fmt::format(
                    "overlap '{}' with the GPU work before it, or split it into smaller pieces that "
                    "start as their inputs arrive",
                    activity_name);
  f.numbers = {{"tail_ms", tail_ms},
               {"tail_fraction", static_cast<double>(tail) / static_cast<double>(window)},
               {"activity_ms", ms(top_ns)},
               {"tail_ms_per_step", tail_ms / m.step_count()}};
  out.push_back(std::move(f));
}

}  // namespace ferry::trace::detail
