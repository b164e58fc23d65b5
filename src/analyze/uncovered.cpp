// GPU idle while the main thread ran nothing the trace recorded: plain Python between profiler operators,
// or a wait in code no annotation covers. The trace cannot say what ran there; it can say how much idle
// those stretches hold and what the thread did just before and just after them (a blocking copy that had
// just returned, a sync, a queue get), which is usually enough to find the code.
#include <algorithm>
#include <map>
#include <tuple>

#include "model.hpp"

namespace ferry::trace::detail {

namespace {

constexpr std::size_t max_neighbours = 3;

std::vector<idle_neighbour> ranked(const model& m, const std::map<std::uint64_t, idle_neighbour>& by_label) {
  std::vector<idle_neighbour> out;
  for (const auto& [label, n] : by_label) {
    idle_neighbour x = n;
    x.activity = m.label_text(label);
    out.push_back(std::move(x));
  }
  std::sort(out.begin(), out.end(), [](const idle_neighbour& a, const idle_neighbour& b) {
    return std::tie(b.idle_ms, b.gaps, a.activity) < std::tie(a.idle_ms, a.gaps, b.activity);
  });
  if (out.size() > max_neighbours) out.resize(max_neighbours);
  return out;
}

}  // namespace

void model::find_uncovered_idle() {
  if (!main_thread_) return;
  // Every recorded activity of the main thread counts, profiler operators included; only the spans that
  // cover everything (steps, a bench's level) do not.
  std::vector<index_t> evs;
  for (const index_t i : cpu_) {
    const event& e = t_.events[i];
    if (e.thread != *main_thread_ || e.end_ns <= e.start_ns) continue;
    if ((e.kind == activity::range || e.kind == activity::stage) &&
        (name(e) == "bench level" || matcher_(name(e))))
      continue;
    evs.push_back(i);
  }
  const ns_t from = steps_.front().start, to = steps_.back().end;
  ns_t total_idle = 0;
  for (const step_span& s : steps_) total_idle += busy().gaps(s.start, s.end);
  ns_t uncovered = 0;
  std::map<std::uint64_t, idle_neighbour> before, after;
  // The stretches without activity: before the first segment, between segments, after the last.
  const auto hole = [&](ns_t a, ns_t b, const segment* prev, const segment* next) {
    a = std::max(a, from);
    b = std::min(b, to);
    if (b <= a) return;
    const ns_t idle = busy().gaps(a, b);
    if (idle <= 0) return;
    uncovered += idle;
    ++out_.uncovered.gaps;
    if (prev != nullptr) {
      idle_neighbour& n = before[prev->label];
      ++n.gaps;
      n.idle_ms += ms(idle);
    }
    if (next != nullptr) {
      idle_neighbour& n = after[next->label];
      ++n.gaps;
      n.idle_ms += ms(idle);
    }
  };
  segment_walker walk(*this, evs);
  segment prev{}, cur{};
  if (!walk.next(cur)) {
    hole(from, to, nullptr, nullptr);
  } else {
    hole(from, cur.start, nullptr, &cur);
    prev = cur;
    while (walk.next(cur)) {
      if (prev.end < cur.start) hole(prev.end, cur.start, &prev, &cur);
      prev = cur;
    }
    hole(prev.end, to, &prev, nullptr);
  }
  out_.uncovered.idle_ms = ms(uncovered);
  out_.uncovered.fraction_of_idle =
      total_idle > 0 ? static_cast<double>(uncovered) / static_cast<double>(total_idle) : 0;
  out_.uncovered.before = ranked(*this, before);
  out_.uncovered.after = ranked(*this, after);
}

}  // namespace ferry::trace::detail
