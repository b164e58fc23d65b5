// The host work that trails the last step (shared by drain_tail and host_bound): named work (ranges and
// stage spans, not API calls or waits) on any thread that ends after the last step's GPU work, and the
// activity that covered most of that time.
#include <algorithm>
#include <map>
#include <utility>

#include "rules.hpp"
#include "work_class.hpp"

namespace ferry::trace::detail {

trailing_work find_trailing_work(const model& m) {
  const timeline& t = m.trace();
  trailing_work w;
  if (m.step_spans().empty()) return w;
  w.start = m.step_spans().back().end;
  if (!m.busy().empty()) w.start = std::max(w.start, m.busy().last());
  w.end = w.start;
  // Another thread's wait is no work (ferry trace records blocking calls as ranges: a pool thread parked
  // in 'pthread_cond_wait' until the process exits would stretch the tail to the exit). The main thread's
  // wait stays: it may be the only record of a tail whose work the trace does not name (a join of sink
  // workers whose writes are too short to record).
  std::map<std::uint32_t, bool> waits;  // name id -> a wait for other host work
  const auto parked = [&](const event& e) {
    if (m.main_thread() && e.thread == *m.main_thread()) return false;
    const auto [it, fresh] = waits.try_emplace(e.name, false);
    if (fresh) it->second = classify_work(m.name(e), false) == work_class::host_wait;
    return it->second;
  };
  for (const index_t i : m.cpu()) {
    const event& e = t.events[i];
    if ((e.kind == activity::range || e.kind == activity::stage) && e.end_ns > w.start &&
        e.end_ns > e.start_ns && !m.excluded_activity(e) && !parked(e))
      w.end = std::max(w.end, e.end_ns);
  }
  if (w.end <= w.start) return w;
  // Only activity still open after w.start decides what covered the time after it.
  const thread_groups groups = m.group_by_thread(m.cpu(), [&](const event& e) {
    return e.end_ns > e.start_ns && e.end_ns > w.start && !m.excluded_activity(e) && !parked(e);
  });
  std::map<std::pair<std::uint64_t, std::uint64_t>, ns_t> covered;
  for (const auto& [thread, run] : groups.runs) {
    segment_walker walk(m, groups.of(run));
    for (segment g{}; walk.next(g);) {
      // Only the part inside [w.start, w.end) counts (an API call after the tail covers none of it).
      if ((g.label & (model::blocking_bit | model::synthetic_bit)) != 0 || g.end <= w.start ||
          g.start >= w.end)
        continue;
      covered[{thread, g.label}] += std::min(g.end, w.end) - std::max(g.start, w.start);
    }
  }
  for (const auto& [key, n] : covered)
    if (n > w.top_ns) w.thread = key.first, w.label = key.second, w.top_ns = n;
  // Named work that covers little of the tail does not explain it (a 0.1 ms wait at the end of an exit
  // that took 0.9 s): no trailing work then.
  if (static_cast<double>(w.top_ns) < cause_share * static_cast<double>(w.length())) w.top_ns = 0;
  return w;
}

}  // namespace ferry::trace::detail
