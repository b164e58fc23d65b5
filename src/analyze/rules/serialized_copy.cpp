// serialized_copy: host-device copies on a stream that also runs kernels, never overlapping them; the
// cost is the copy time no kernel hid, on the worst such stream.
#include <fmt/format.h>

#include <map>
#include <set>

#include "rules.hpp"
#include "wording.hpp"

namespace ferry::trace::detail {

namespace {

// A stream's copies are serialized when kernels overlap less than this fraction of their time, and they
// matter when they take more than material_fraction of the mean step.
constexpr double serialized_overlap_limit = 0.10;

}  // namespace

void find_serialized_copy(const model& m, std::vector<finding>& out) {
  const timeline& t = m.trace();
  struct stream_key {
    std::int32_t device;
    std::uint64_t stream;
    // clang-tidy 14 reads the defaulted <=>'s comparison with 0 as a null pointer constant.
    auto operator<=>(const stream_key&) const = default;  // NOLINT(modernize-use-nullptr)
  };
  std::set<stream_key> kernel_streams;
  for (std::size_t i : m.gpu()) {
    const event& e = t.events[i];
    if (e.kind == activity::kernel && m.step_of(e.start_ns) >= 0) kernel_streams.insert({e.device, e.stream});
  }
  struct totals {
    ns_t copy = 0;
    ns_t overlap = 0;
    std::size_t count = 0;
  };
  std::map<stream_key, totals> per_stream;
  for (std::size_t i : m.copies_in_steps(
           [](const event& c) { return c.copy == copy_kind::h2d || c.copy == copy_kind::d2h; })) {
    const event& c = t.events[i];
    // A pageable copy cannot overlap whatever its stream; pageable_async_copy or sync_copy names it.
    if (!kernel_streams.contains({c.device, c.stream}) || c.src == mem_kind::pageable ||
        c.dst == mem_kind::pageable)
      continue;
    totals& s = per_stream[{c.device, c.stream}];
    s.copy += c.duration_ns();
    s.overlap += m.kernels().covered(c.start_ns, c.end_ns);
    ++s.count;
  }
  const std::pair<const stream_key, totals>* worst = nullptr;
  for (const auto& entry : per_stream) {
    const totals& s = entry.second;
    if (s.copy <= 0) continue;
    const double overlap = static_cast<double>(s.overlap) / static_cast<double>(s.copy);
    const double copy_per_step = m.per_step(static_cast<double>(s.copy));
    if (overlap >= serialized_overlap_limit || copy_per_step <= material_fraction * m.mean_wall_ns())
      continue;
    if (worst == nullptr || s.copy - s.overlap > worst->second.copy - worst->second.overlap) worst = &entry;
  }
  if (worst == nullptr) return;
  const totals& s = worst->second;
  const double overlap = static_cast<double>(s.overlap) / static_cast<double>(s.copy);
  const double copy_ms = ms(m.per_step(static_cast<double>(s.copy)));
  finding f;
  f.rule = "serialized_copy";
  f.cost_ms_per_step = ms(m.per_step(static_cast<double>(s.copy - s.overlap)));
  f.numbers = {{"stream", static_cast<double>(worst->first.stream)},
               {"copy_ms_per_step", copy_ms},
               {"copy_overlap", overlap},
               {"copy_fraction_of_step", copy_ms / m.summary().mean.wall_ms},
               {"count_per_step", m.per_step(static_cast<double>(s.count))},
               {"cost_lone_copy_ms_per_step", f.cost_ms_per_step}};
  f.title = fmt::format("copies and kernels share {}: {} of copies per step run while no kernel does",
                        m.stream_name(worst->first.stream), ms_text(f.cost_ms_per_step));
  f.evidence = fmt::format(
      "{} host-device cop{} per step on {} take {} per step ({} of the step), {} of it "
      "overlapped with kernels: {} per step ran while no kernel did",
      count_text(m.per_step(static_cast<double>(s.count))), s.count == m.step_count() ? "y" : "ies",
      m.stream_name(worst->first.stream), ms_text(copy_ms), pct(copy_ms / m.summary().mean.wall_ms),
      pct(overlap), ms_text(f.cost_ms_per_step));
  f.fix = m.pytorch()
              ? "copy on a stream of its own and make compute wait for it: ferry.torch.Prefetcher(loader) "
                "copies the next batch on ferry's copy stream while this step computes (by hand: .to(device, "
                "non_blocking=True) from pinned memory inside torch.cuda.stream(copy_stream), then "
                "torch.cuda.current_stream().wait_stream(copy_stream)); for outputs, ferry.torch.Egress"
              : "copy on its own stream and make compute wait on an event: ingest L3 / "
                "ferry::ingest::prefetcher; egress L4 / ferry::egress::pipeline";
  out.push_back(std::move(f));
}

}  // namespace ferry::trace::detail
