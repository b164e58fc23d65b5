// gpu_idle: the GPU idles above the threshold; the evidence is the CPU activity that covered the idle
// time, and the fix follows from what that activity is.
#include <fmt/format.h>

#include "rules.hpp"
#include "wording.hpp"

namespace ferry::trace::detail {

namespace {

std::string idle_fix(const idle_attribution& a) {
  if (a.blocking) {
    if (contains_ignoring_case(a.activity, "device"))
      return fmt::format(
          "the main thread waits in '{}' while the GPU drains; see the device_sync finding: wait on "
          "events, not the device (the ferry pipelines record one event per slot)",
          a.activity);
    return fmt::format(
        "the main thread waits in '{}' instead of queueing the next work; see the sync_copy finding: "
        "non-blocking copies from pinned memory on a copy stream (ferry::ingest::prefetcher, "
        "ferry::egress::pipeline) let the launches run ahead",
        a.activity);
  }
  if (mentions_any(a.activity, data_words))
    return "make batches on worker threads: ferry::ingest::loader (ingest ladder L1) with "
           "ferry::ingest::prefetcher, so the next batch is ready and on the device when the step starts";
  if (mentions_any(a.activity, output_words))
    return "hand outputs to worker threads: ferry::egress::pipeline's sinks (egress ladder L1) process them "
           "while the GPU runs the next step";
  return fmt::format(
      "move '{}' off the thread that launches GPU work, or overlap it with the GPU: run it on "
      "worker threads (ferry::ingest::loader, ferry::egress::pipeline's sinks) and keep the "
      "launching thread queueing work ahead",
      a.activity);
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
               {"wall_ms_per_step", mean.wall_ms},
               {"idle_fraction", fraction},
               {"steps", m.step_count()}};
  const idle_attribution* top = nullptr;
  for (const idle_attribution& a : s.idle)
    if (a.main_thread) {
      top = &a;
      break;
    }
  const std::string step_word = m.whole_trace() ? "of the trace" : "of each step";
  f.evidence = fmt::format("the GPU idled {} of {} {} ({}) over {} step{}", ms_text(mean.idle_ms),
                           ms_text(mean.wall_ms), m.whole_trace() ? "(the whole trace)" : "per step",
                           pct(fraction), s.steps.size(), s.steps.size() == 1 ? "" : "s");
  if (top != nullptr) {
    f.title = fmt::format("GPU idle {} {} while the main thread is in '{}'", pct(fraction), step_word,
                          top->activity);
    f.evidence += fmt::format(
        "; the main thread ({}) was in '{}' for {} per step of it ({} of the idle time)", top->thread,
        top->activity, ms_text(m.per_step(top->idle_ms)), pct(top->fraction_of_idle));
    f.numbers["attributed_ms_per_step"] = m.per_step(top->idle_ms);
    f.numbers["attributed_fraction"] = top->fraction_of_idle;
    f.fix = idle_fix(*top);
  } else {
    f.title = fmt::format("GPU idle {} {}", pct(fraction), step_word);
    if (!s.idle.empty()) {
      const idle_attribution& a = s.idle.front();
      f.evidence += fmt::format("; no range of the main thread covered it, {} was in '{}' for {} per step",
                                a.thread, a.activity, ms_text(m.per_step(a.idle_ms)));
    } else {
      f.evidence += "; no CPU range or blocking call covered it";
    }
    f.fix =
        "annotate the host loop (FERRY_RANGE, NVTX or torch.profiler.record_function) to see what the CPU "
        "does while the GPU waits; then move that work to worker threads (ferry::ingest::loader, "
        "ferry::egress::pipeline's sinks)";
  }
  out.push_back(std::move(f));
}

}  // namespace ferry::trace::detail
