// gpu_idle: the GPU idles above the threshold. The evidence is the main thread's activity that covered
// the idle time, named only when it covers a real share of it (cause_share); the fix follows from what that
// activity is (work_class.hpp). When the main thread ran nothing recorded during the idle, the finding
// says so, with what the thread did just before and after, and how to see more.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <string>
#include <vector>

#include "rules.hpp"
#include "wording.hpp"
#include "work_class.hpp"

namespace ferry::trace::detail {

namespace {

// "'cudaMemcpyAsync' (12 stretches, 3.10 ms per step)".
std::string neighbours_text(const model& m, const std::vector<idle_neighbour>& ns) {
  std::vector<std::string> parts;
  for (const idle_neighbour& n : ns)
    parts.push_back(fmt::format("'{}' ({} stretch{}, {} per step)", n.activity, n.gaps,
                                n.gaps == 1 ? "" : "es", ms_text(m.per_step(n.idle_ms))));
  return fmt::format("{}", fmt::join(parts, ", "));
}

// "; the main thread ran nothing the profiler recorded for 5.00 ms per step of it (40% of the idle, in 12
// stretches); just before them it was in ..., just after in ...".
std::string uncovered_text(const model& m) {
  const uncovered_idle& u = m.summary().uncovered;
  std::string out = fmt::format(
      "; the main thread ran nothing the trace recorded for {} per step of it ({} of the idle, in {} "
      "stretch{})",
      ms_text(m.per_step(u.idle_ms)), pct(u.fraction_of_idle), u.gaps, u.gaps == 1 ? "" : "es");
  if (!u.before.empty()) out += fmt::format("; just before them it was in {}", neighbours_text(m, u.before));
  if (!u.after.empty()) out += fmt::format("; just after them in {}", neighbours_text(m, u.after));
  return out;
}

// How to make the main thread's unrecorded time show up in the next trace.
std::string see_more(const model& m) {
  return m.pytorch()
             ? "see what the main thread runs there: wrap the suspect code (output handling, a queue "
               "get, a buffer wait) in torch.profiler.record_function and record with "
               "with_stack=True to see the Python lines; the analysis then names it and the fix "
               "that fits it"
             : "see what the main thread runs there: wrap the suspect code (output handling, a queue "
               "get, a buffer wait) in FERRY_RANGE (or an NVTX range); the analysis then names it and "
               "the fix that fits it";
}

}  // namespace

void find_gpu_idle(const model& m, std::vector<finding>& out) {
  const analysis& s = m.summary();
  const step_breakdown& mean = s.mean;
  const double fraction = mean.wall_ms > 0 ? mean.idle_ms / mean.wall_ms : 0;
  if (!(fraction > m.options().idle_threshold)) return;
  finding f;
  f.rule = "gpu_idle";
  f.cost_ms_per_step = mean.idle_ms;
  f.numbers = {{"idle_ms_per_step", mean.idle_ms},
               {"cost_idle_ms_per_step", mean.idle_ms},
               {"wall_ms_per_step", mean.wall_ms},
               {"idle_fraction", fraction},
               {"steps", m.step_count()},
               {"uncovered_ms_per_step", m.per_step(s.uncovered.idle_ms)},
               {"uncovered_fraction", s.uncovered.fraction_of_idle}};
  const idle_attribution* top = nullptr;
  for (const idle_attribution& a : s.idle)
    if (a.main_thread) {
      top = &a;
      break;
    }
  const bool named = top != nullptr && top->fraction_of_idle >= cause_share;
  const bool uncovered = s.uncovered.fraction_of_idle >= cause_share;
  const std::string step_word = m.whole_trace() ? "of the trace" : "of each step";
  f.evidence = fmt::format("the GPU idled {} of {} {} ({}) over {} step{}", ms_text(mean.idle_ms),
                           ms_text(mean.wall_ms), m.whole_trace() ? "(the whole trace)" : "per step",
                           pct(fraction), s.steps.size(), s.steps.size() == 1 ? "" : "s");
  if (const delegation d = delegated_work(m); d.wait != nullptr) {
    // The main thread waits for another thread of its process, which launches the GPU's work: that
    // thread's work is the cause, and its fix the advice.
    const idle_attribution& wait = *d.wait;
    // thread_name gives "thread <id>" for a thread with no name.
    const std::string thread =
        d.thread_name.starts_with("thread ") ? d.thread_name : fmt::format("thread {}", d.thread_name);
    f.title = fmt::format(
        "GPU idle {} {} while the main thread waits in '{}' for {}, which launches the GPU's work",
        pct(fraction), step_word, wait.activity, thread);
    f.evidence += fmt::format(
        "; the main thread ({}) waited in '{}' for {} per step of it ({} of the idle); {} was awake (in no "
        "wait of its own) through {} of the idle inside those waits and launched {:.0f} calls per step in "
        "them",
        wait.thread, wait.activity, ms_text(m.per_step(wait.idle_ms)), pct(wait.fraction_of_idle), thread,
        pct(d.awake_fraction), m.per_step(static_cast<double>(d.launches)));
    if (d.activity != nullptr)
      f.evidence += fmt::format(" (its most covering: '{}', {} per step)", d.activity->activity,
                                ms_text(m.per_step(d.activity->idle_ms)));
    f.evidence += ": the main thread waits for that thread's work";
    if (uncovered) f.evidence += uncovered_text(m);
    f.numbers["attributed_ms_per_step"] = m.per_step(d.awake_ms);
    f.numbers["attributed_fraction"] = mean.idle_ms > 0 ? m.per_step(d.awake_ms) / mean.idle_ms : 0;
    f.cause = std::string(to_string(work_class::launch));
    f.fix = idle_advice(work_class::launch, d.activity != nullptr ? d.activity->activity : "cudaLaunchKernel",
                        m.pytorch());
    if (m.pytorch() && d.thread_name.starts_with("pt_autograd"))
      f.fix += fmt::format(
          "; {} is PyTorch's autograd engine, which runs a CUDA backward while the thread "
          "that called backward() waits",
          d.thread_name);
  } else if (named) {
    f.title = fmt::format("GPU idle {} {} while the main thread is in '{}'", pct(fraction), step_word,
                          top->activity);
    f.evidence += fmt::format(
        "; the main thread ({}) was in '{}' for {} per step of it ({} of the idle time)", top->thread,
        top->activity, ms_text(m.per_step(top->idle_ms)), pct(top->fraction_of_idle));
    if (uncovered) f.evidence += uncovered_text(m);
    f.numbers["attributed_ms_per_step"] = m.per_step(top->idle_ms);
    f.numbers["attributed_fraction"] = top->fraction_of_idle;
    const work_class cause = classify_work(top->activity, top->blocking);
    // Another real cause on the main thread keeps this finding: it names work the other finding does not.
    const bool sole = std::none_of(s.idle.begin(), s.idle.end(), [&](const idle_attribution& a) {
      return a.main_thread && &a != top && a.fraction_of_idle >= cause_share;
    });
    if (sole) f.cause = std::string(to_string(cause));
    f.fix = idle_advice(cause, top->activity, m.pytorch());
  } else if (uncovered) {
    f.title = fmt::format("GPU idle {} {} while the main thread runs code the trace did not record",
                          pct(fraction), step_word);
    f.evidence += uncovered_text(m);
    if (top != nullptr)
      f.evidence += fmt::format("; its most covering activity, '{}', covered only {}", top->activity,
                                pct(top->fraction_of_idle));
    f.fix = see_more(m);
  } else {
    f.title = fmt::format("GPU idle {} {}", pct(fraction), step_word);
    const idle_attribution* other = nullptr;
    for (const idle_attribution& a : s.idle)
      if (!a.main_thread && a.fraction_of_idle >= cause_share) {
        other = &a;
        break;
      }
    if (top != nullptr)
      f.evidence += fmt::format("; no single activity of the main thread covered {} of it ('{}' covered {})",
                                pct(cause_share), top->activity, pct(top->fraction_of_idle));
    else if (s.main_thread.empty())
      f.evidence += "; the trace names no main thread";
    else
      f.evidence += "; no recorded activity of the main thread covered it";
    if (other != nullptr)
      f.evidence +=
          fmt::format("; {} was in '{}' for {} per step ({} of the idle)", other->thread, other->activity,
                      ms_text(m.per_step(other->idle_ms)), pct(other->fraction_of_idle));
    if (s.uncovered.idle_ms > 0) f.evidence += uncovered_text(m);
    f.fix = see_more(m);
  }
  out.push_back(std::move(f));
}

}  // namespace ferry::trace::detail
