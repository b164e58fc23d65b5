// low_copy_bandwidth: pinned copies of at least 1 MiB far below the link (the options' or the trace's);
// the cost is their time beyond the link's, in the share no kernel hid. Quiet without a link.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <map>
#include <string>
#include <utility>

#include "ferry/core/units.hpp"
#include "rules.hpp"
#include "wording.hpp"

namespace ferry::trace::detail {

namespace {

// The bandwidth rule's smallest copy: smaller ones are dominated by per-copy latency, not the link.
constexpr std::uint64_t big_copy_bytes = std::uint64_t{1} << 20;

void find_for_direction(const model& m, copy_kind dir, std::vector<finding>& out) {
  const timeline& t = m.trace();
  const double link = m.link_gbps(dir);
  if (link <= 0) return;
  // Pageable copies are slow by nature: pageable_async_copy and sync_copy speak for them.
  const auto copies = m.copies_in_steps(
      [dir](const event& c) { return c.copy == dir && c.bytes >= big_copy_bytes && !pageable_side(c); });
  if (copies.empty()) return;
  std::uint64_t bytes = 0;
  ns_t total = 0;
  ns_t hidden = 0;  // copy time that ran under a kernel: a slow copy there costs the step nothing
  std::map<std::pair<mem_kind, mem_kind>, std::size_t> kinds;
  for (std::size_t i : copies) {
    const event& c = t.events[i];
    bytes += c.bytes;
    total += c.duration_ns();
    hidden += m.kernels().covered(c.start_ns, c.end_ns);
    ++kinds[{c.src, c.dst}];
  }
  if (total <= 0) return;
  // Bytes per ns are GB/s: gb_per_s's figure, without its two scalings by 1e9, which round differently in
  // the last digit of the JSON.
  const double achieved = static_cast<double>(bytes) / static_cast<double>(total);
  if (achieved >= m.options().low_bandwidth_fraction * link) return;
  std::vector<std::string> kind_text;
  for (const auto& [k, n] : kinds)
    kind_text.push_back(fmt::format("{} -> {} x{}", to_string(k.first), to_string(k.second), n));
  // The time the copies took beyond the link's, in the share of their time no kernel hid.
  const double exposed = 1.0 - static_cast<double>(hidden) / static_cast<double>(total);
  const double cost_ns =
      std::max(0.0, static_cast<double>(total) - static_cast<double>(bytes) / link) * std::max(0.0, exposed);
  const std::string d = upper_dir(dir);
  finding f;
  f.rule = "low_copy_bandwidth";
  f.cost_ms_per_step = ms(m.per_step(cost_ns));
  f.numbers = {{"achieved_gbps", achieved},
               {"link_gbps", link},
               {"fraction_of_link", achieved / link},
               {"bytes_per_step", m.per_step(static_cast<double>(bytes))},
               {"copy_ms_per_step", ms(m.per_step(static_cast<double>(total)))},
               {"count_per_step", m.per_step(static_cast<double>(copies.size()))},
               {"hidden_fraction", 1.0 - exposed},
               {"cost_slow_copy_ms_per_step", ms(m.per_step(cost_ns))}};
  f.title = fmt::format("{} copies run at {:.1f} GB/s, {} of the {:.1f} GB/s link", d, achieved,
                        pct(achieved / link), link);
  f.evidence = fmt::format(
      "{} {} cop{} of at least 1 MiB per step move {} per step in {}: {:.1f} GB/s against a "
      "{:.1f} GB/s link, {} of that time hidden behind kernels; memory: {}; their time beyond the link's, "
      "in the share no kernel hid: {} per step",
      count_text(m.per_step(static_cast<double>(copies.size()))), d,
      copies.size() == m.summary().steps.size() ? "y" : "ies",
      format_bytes(static_cast<std::uint64_t>(m.per_step(static_cast<double>(bytes)))),
      ms_text(ms(m.per_step(static_cast<double>(total)))), achieved, link, pct(1.0 - exposed),
      fmt::join(kind_text, ", "), ms_text(f.cost_ms_per_step));
  f.fix =
      m.pytorch()
          ? "copy from pinned memory in large pieces: DataLoader(..., pin_memory=True) and one .to(device, "
            "non_blocking=True) per batch rather than many small tensors, or ferry.torch.Prefetcher / "
            "ferry.torch.Egress, which copy whole slots; ferry probe measures the link"
          : "copy from pinned memory in large pieces (ferry::ingest::prefetcher / ferry::egress::pipeline "
            "slots); ferry probe measures the link";
  out.push_back(std::move(f));
}

}  // namespace

void find_low_copy_bandwidth(const model& m, std::vector<finding>& out) {
  find_for_direction(m, copy_kind::h2d, out);
  find_for_direction(m, copy_kind::d2h, out);
}

}  // namespace ferry::trace::detail
