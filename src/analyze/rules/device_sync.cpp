// device_sync: a device-wide synchronize every step drains the GPU's queue; the cost is the GPU idle
// while the CPU waited in it.
#include <fmt/format.h>

#include <set>
#include <string>

#include "rules.hpp"
#include "wording.hpp"

namespace ferry::trace::detail {

void find_device_sync(const model& m, std::vector<finding>& out) {
  const timeline& t = m.trace();
  std::set<int> steps_with;
  std::size_t count = 0;
  double idle_ns = 0;
  std::uint32_t name_id = 0;
  for (std::size_t i : m.cpu()) {
    const event& e = t.events[i];
    if (!is_wait(e) || e.sync != sync_kind::device) continue;
    const int k = m.step_of(e.start_ns);
    if (k < 0) continue;
    steps_with.insert(k);
    ++count;
    if (name_id == 0) name_id = e.name;
    // Cost: the GPU idle while the CPU waited (the queue drained and nothing new could be launched).
    idle_ns += static_cast<double>(m.busy().gaps(e.start_ns, e.end_ns));
  }
  // One step (a trace without step spans is one): a single device sync there is usually the end of the
  // run, so it takes two; with steps, at least half of them.
  const bool fires = m.step_spans().size() >= 2 ? 2 * steps_with.size() >= m.step_spans().size()
                                                : count >= (m.whole_trace() ? 2u : 1u);
  if (!fires) return;
  const std::string call = name_id != 0 ? std::string(t.strings[name_id]) : "device synchronize";
  finding f;
  f.rule = "device_sync";
  f.cost_ms_per_step = ms(m.per_step(idle_ns));
  f.numbers = {{"count_per_step", m.per_step(static_cast<double>(count))},
               {"steps_with_sync", static_cast<double>(steps_with.size())},
               {"steps", m.step_count()},
               {"idle_ms_per_step", ms(m.per_step(idle_ns))},
               {"cost_idle_ms_per_step", ms(m.per_step(idle_ns))}};
  f.title = fmt::format("a device-wide synchronize ('{}') in {} of {} steps drains the GPU", call,
                        steps_with.size(), m.step_spans().size());
  f.evidence =
      fmt::format("{} device synchronize{} per step; the GPU idled {} per step while the CPU waited in them",
                  count_text(m.per_step(static_cast<double>(count))), count == m.step_count() ? "" : "s",
                  ms_text(ms(m.per_step(idle_ns))));
  f.fix = m.pytorch()
              ? "take torch.cuda.synchronize() out of the loop and wait on events for the work you need "
                "(torch.cuda.Event: record(), then synchronize() or a stream's wait_event()); "
                "ferry.torch.Prefetcher and ferry.torch.Egress record one event per slot, so the CPU waits "
                "only for the batch or output it needs"
              : "wait on events, not the device: the ferry pipelines record one event per slot "
                "(ferry::ingest::prefetcher, ferry::egress::pipeline), so the CPU waits only for the work it "
                "needs";
  out.push_back(std::move(f));
}

}  // namespace ferry::trace::detail
