// What each step's GPU time went to, and which CPU activity covered the GPU's idle time.
#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <map>
#include <span>
#include <tuple>
#include <utility>

#include "ferry/core/error.hpp"
#include "model.hpp"
#include "work_class.hpp"

namespace ferry::trace::detail {

void model::breakdown() {
  std::vector<ns_t> copy_ns(steps_.size(), 0), overlap_ns(steps_.size(), 0);
  bool any_activity = false;
  const std::vector<std::array<ns_t, cat_count>> level_cov = level_coverage();
  for (std::size_t k = 0; k < steps_.size(); ++k) {
    const step_span& s = steps_[k];
    step_breakdown b;
    b.index = static_cast<int>(k);
    b.start_ns = s.start;
    b.end_ns = s.end;
    b.wall_ms = ms(s.end - s.start);
    const std::array<ns_t, cat_count>& cov = level_cov[k];
    b.compute_ms = ms(cov[cat_compute]);
    b.comm_ms = ms(cov[cat_comm] - cov[cat_compute]);
    b.d2d_ms = ms(cov[cat_d2d] - cov[cat_comm]);
    b.h2d_ms = ms(cov[cat_h2d] - cov[cat_d2d]);
    b.d2h_ms = ms(cov[cat_d2h] - cov[cat_h2d]);
    b.idle_ms = ms((s.end - s.start) - cov[cat_d2h]);
    b.utilization = b.wall_ms > 0 ? 1.0 - b.idle_ms / b.wall_ms : 0;
    any_activity = any_activity || cov[cat_d2h] > 0;
    out_.steps.push_back(b);
  }
  if (!any_activity) {
    // GPU events of zero length cover no time: there is no busy span to name then.
    const std::string gpu_span = busy().empty() ? std::string("all of zero length")
                                                : fmt::format("the GPU's {:.3f} ms to {:.3f} ms",
                                                              ms(busy().first()), ms(busy().last()));
    throw input_error(
        fmt::format("the timeline has GPU activity ({} events) but none inside its {} '{}' step spans "
                    "({:.3f} ms to {:.3f} ms; {}); pick the steps with analyze_options::step_prefix",
                    gpu_.size(), steps_.size(), out_.step_prefix, ms(steps_.front().start),
                    ms(steps_.back().end), gpu_span));
  }
  // Copies: overlap per step (clipped to each step they touch); bytes to the step that launched them, else
  // to the step they start in. A copy the CPU ran ahead (the next batch's, on its own stream, while the
  // step's kernels wait behind earlier steps') may run before its step, even before the first one.
  for (const index_t i : gpu_) {
    const event& c = t_.events[i];
    if (c.kind != activity::memcpy) continue;
    auto it = std::partition_point(steps_.begin(), steps_.end(),
                                   [&](const step_span& s) { return s.end <= c.start_ns; });
    int bytes_step = launch_step(i);
    for (; it != steps_.end() && it->start < c.end_ns; ++it) {
      const auto k = static_cast<std::size_t>(it - steps_.begin());
      const ns_t a = std::max(c.start_ns, it->start), b = std::min(c.end_ns, it->end);
      copy_ns[k] += b - a;
      overlap_ns[k] += kernels_.covered(a, b);
      if (bytes_step < 0) bytes_step = static_cast<int>(k);
    }
    if (bytes_step >= 0) {
      if (c.copy == copy_kind::h2d) out_.steps[static_cast<std::size_t>(bytes_step)].h2d_bytes += c.bytes;
      if (c.copy == copy_kind::d2h) out_.steps[static_cast<std::size_t>(bytes_step)].d2h_bytes += c.bytes;
    }
  }
  ns_t all_copy = 0, all_overlap = 0;
  for (std::size_t k = 0; k < steps_.size(); ++k) {
    out_.steps[k].copy_overlap =
        copy_ns[k] > 0 ? static_cast<double>(overlap_ns[k]) / static_cast<double>(copy_ns[k]) : 0;
    all_copy += copy_ns[k];
    all_overlap += overlap_ns[k];
  }
  // The mean: each time and byte count averaged; utilization from the mean times; overlap over all copies.
  step_breakdown& m = out_.mean;
  m.index = -1;
  m.start_ns = steps_.front().start;
  m.end_ns = steps_.back().end;
  std::uint64_t h2d_bytes = 0, d2h_bytes = 0;
  for (const step_breakdown& b : out_.steps) {
    m.wall_ms += b.wall_ms;
    m.compute_ms += b.compute_ms;
    m.comm_ms += b.comm_ms;
    m.d2d_ms += b.d2d_ms;
    m.h2d_ms += b.h2d_ms;
    m.d2h_ms += b.d2h_ms;
    m.idle_ms += b.idle_ms;
    h2d_bytes += b.h2d_bytes;
    d2h_bytes += b.d2h_bytes;
  }
  const double n = static_cast<double>(out_.steps.size());
  for (double* v : {&m.wall_ms, &m.compute_ms, &m.comm_ms, &m.d2d_ms, &m.h2d_ms, &m.d2h_ms, &m.idle_ms})
    *v /= n;
  m.h2d_bytes = h2d_bytes / out_.steps.size();
  m.d2h_bytes = d2h_bytes / out_.steps.size();
  m.utilization = m.wall_ms > 0 ? 1.0 - m.idle_ms / m.wall_ms : 0;
  m.copy_overlap = all_copy > 0 ? static_cast<double>(all_overlap) / static_cast<double>(all_copy) : 0;
  mean_wall_ns_ = m.wall_ms * ns_per_ms;
}

// Each idle gap of each step is charged to the innermost activity of every CPU thread that covered it.
void model::attribute_idle() {
  ns_t total_idle = 0;
  for (const step_span& s : steps_) total_idle += busy().gaps(s.start, s.end);
  // The threads' activity, but for the spans that cover everything (steps, a bench's level) and a
  // profiler's operators (PyTorch's cpu_op): of those, only the outermost of each nest counts, and only
  // where nothing else of the thread covers the idle (an annotation or a call says more than the
  // operator around it).
  const thread_groups activity = group_by_thread(
      cpu_, [this](const event& e) { return e.end_ns > e.start_ns && !excluded_activity(e); });
  const thread_groups operators = group_by_thread(cpu_, [this](const event& e) {
    return e.end_ns > e.start_ns && excluded_activity(e) && e.domain != 0 &&
           t_.domain_of(e) == "pytorch.op" && !matcher_(name(e));
  });
  std::map<std::pair<std::uint64_t, std::uint64_t>, ns_t> covered;
  // f(idle span) for each part of a step's idle time inside [a, b).
  const auto gaps_in = [&](ns_t a, ns_t b, auto&& f) {
    auto s =
        std::partition_point(steps_.begin(), steps_.end(), [&](const step_span& x) { return x.end <= a; });
    for (; s != steps_.end() && s->start < b; ++s)
      busy().for_each_gap(std::max(a, s->start), std::min(b, s->end), f);
  };
  for (const auto& [th, run] : activity.runs) {
    const std::uint64_t thread = th;  // a structured binding cannot be captured before C++20 in clang 14
    segment_walker walk(*this, activity.of(run));
    ns_t* sum = nullptr;
    std::uint64_t sum_label = 0;
    for (segment s{}; walk.next(s);) {
      gaps_in(s.start, s.end, [&](span w) {
        if (sum == nullptr || sum_label != s.label) sum = &covered[{thread, s.label}], sum_label = s.label;
        *sum += w.end - w.start;
      });
    }
  }
  for (const auto& [th, run] : operators.runs) {
    const std::uint64_t thread = th;
    // The thread's other activity covers exactly the union of its events.
    interval_union others;
    if (auto it = activity.runs.find(thread); it != activity.runs.end()) {
      const std::span<const index_t> evs = activity.of(it->second);
      interval_union::sorted_builder b(evs.size());
      for (const index_t i : evs) b.add(t_.events[i].start_ns, t_.events[i].end_ns);
      others = std::move(b).finish();
    }
    ns_t outer_end = std::numeric_limits<ns_t>::min();
    for (const index_t i : operators.of(run)) {
      const event& o = t_.events[i];
      if (o.start_ns < outer_end) continue;  // inside the operator before it
      outer_end = o.end_ns;
      const std::uint64_t label = label_of(o);
      gaps_in(o.start_ns, o.end_ns, [&](span w) {
        if (const ns_t n = others.gaps(w.start, w.end); n > 0) covered[{thread, label}] += n;
      });
    }
  }
  for (const auto& [key, idle] : covered) {
    idle_attribution a;
    a.thread_id = key.first;
    a.thread = thread_name(key.first);
    a.activity = label_text(key.second);
    a.blocking = (key.second & blocking_bit) != 0;
    a.main_thread = main_thread_ && *main_thread_ == key.first;
    a.work = std::string(to_string(classify_work(a.activity, a.blocking)));
    a.idle_ms = ms(idle);
    a.fraction_of_idle = total_idle > 0 ? static_cast<double>(idle) / static_cast<double>(total_idle) : 0;
    out_.idle.push_back(std::move(a));
  }
  std::sort(out_.idle.begin(), out_.idle.end(), [](const idle_attribution& a, const idle_attribution& b) {
    return std::tie(b.idle_ms, b.main_thread, a.thread_id, a.activity, a.blocking) <
           std::tie(a.idle_ms, a.main_thread, b.thread_id, b.activity, b.blocking);
  });
}

}  // namespace ferry::trace::detail
