// The host work that trails the last step (shared by drain_tail and host_bound): named work (ranges and
// stage spans, not API calls or waits) on any thread that ends after the last step's GPU work, and the
// activity that covered most of that time.
#include <algorithm>
#include <map>
#include <utility>

#include "rules.hpp"

namespace ferry::trace::detail {

trailing_work find_trailing_work(const model& m) {
  const timeline& t = m.trace();
  trailing_work w;
  if (m.step_spans().empty()) return w;
  w.start = m.step_spans().back().end;
  if (!m.busy().empty()) w.start = std::max(w.start, m.busy().last());
  w.end = w.start;
  std::map<std::uint64_t, std::vector<std::size_t>> per_thread;
  for (std::size_t i : m.cpu()) {
    const event& e = t.events[i];
    if (e.end_ns <= e.start_ns || m.excluded_activity(e)) continue;
    per_thread[e.thread].push_back(i);
    if ((e.kind == activity::range || e.kind == activity::stage) && e.end_ns > w.start)
      w.end = std::max(w.end, e.end_ns);
  }
  if (w.end <= w.start) return w;
  std::map<std::pair<std::uint64_t, std::uint64_t>, ns_t> covered;
  for (const auto& [thread, evs] : per_thread) {
    for (const segment& g : m.segment_thread(evs)) {
      if ((g.label & (model::blocking_bit | model::synthetic_bit)) != 0 || g.end <= w.start) continue;
      covered[{thread, g.label}] += std::min(g.end, w.end) - std::max(g.start, w.start);
    }
  }
  for (const auto& [key, n] : covered)
    if (n > w.top_ns) w.thread = key.first, w.label = key.second, w.top_ns = n;
  return w;
}

}  // namespace ferry::trace::detail
