// pageable_async_copy: an asynchronous copy from or to pageable memory. The driver stages it through
// its own pinned buffer and the call blocks; the cost is the time the copy took beyond the pinned link's.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <map>
#include <string>

#include "ferry/core/units.hpp"
#include "rules.hpp"
#include "wording.hpp"

namespace ferry::trace::detail {

namespace {

// Without a known link, a pinned copy is assumed to take a quarter of a pageable one's time: staged
// pageable copies typically reach 1/4 to 1/8 of the pinned link (docs/PERFORMANCE.md records the probed
// pinned and pageable links), so 3/4 of the copy time is a conservative estimate of what pinning saves.
constexpr double pageable_saving_without_link = 0.75;

}  // namespace

void find_pageable_async_copy(const model& m, std::vector<finding>& out) {
  const timeline& t = m.trace();
  const auto copies = m.copies_in_steps([](const event& c) { return c.async && pageable_side(c); });
  if (copies.empty()) return;
  struct dir_totals {
    std::size_t count = 0;
    std::uint64_t bytes = 0;
    ns_t ns = 0;
    double cost_ns = 0;
  };
  std::map<copy_kind, dir_totals> dirs;
  double cost_ns = 0;
  for (std::size_t i : copies) {
    const event& c = t.events[i];
    dir_totals& d = dirs[c.copy];
    const double link = m.link_gbps(c.copy);
    // At the pinned link the copy would take bytes / link (GB/s = bytes per ns); without one, see
    // pageable_saving_without_link.
    const double saved =
        link > 0 ? std::max(0.0, static_cast<double>(c.duration_ns()) - static_cast<double>(c.bytes) / link)
                 : pageable_saving_without_link * static_cast<double>(c.duration_ns());
    ++d.count;
    d.bytes += c.bytes;
    d.ns += c.duration_ns();
    d.cost_ns += saved;
    cost_ns += saved;
  }
  finding f;
  f.rule = "pageable_async_copy";
  f.cost_ms_per_step = ms(m.per_step(cost_ns));
  std::vector<std::string> parts;
  std::size_t count = 0;
  for (const auto& [k, d] : dirs) {
    const std::string dir = upper_dir(k);
    const double gbps = gb_per_s(d.bytes, static_cast<double>(d.ns) / 1e9);
    const double link = m.link_gbps(k);
    parts.push_back(
        fmt::format("{} {} per step {} ({} per step) took {} per step at {:.1f} GB/s{}",
                    count_text(m.per_step(static_cast<double>(d.count))), dir,
                    k == copy_kind::h2d ? "from pageable memory" : "to pageable memory",
                    format_bytes(static_cast<std::uint64_t>(m.per_step(static_cast<double>(d.bytes)))),
                    ms_text(ms(m.per_step(static_cast<double>(d.ns)))), gbps,
                    link > 0 ? fmt::format(" (pinned link {:.1f} GB/s)", link) : std::string()));
    const std::string key = k == copy_kind::h2d ? "h2d" : "d2h";
    f.numbers[key + "_count_per_step"] = m.per_step(static_cast<double>(d.count));
    f.numbers[key + "_bytes_per_step"] = m.per_step(static_cast<double>(d.bytes));
    f.numbers[key + "_ms_per_step"] = ms(m.per_step(static_cast<double>(d.ns)));
    f.numbers[key + "_gbps"] = gbps;
    if (link > 0) f.numbers[key + "_link_gbps"] = link;
    count += d.count;
  }
  f.numbers["count_per_step"] = m.per_step(static_cast<double>(count));
  f.title = fmt::format(
      "{} asynchronous cop{} per step from or to pageable memory: the driver stages {} and the "
      "call blocks",
      count_text(m.per_step(static_cast<double>(count))), count == m.step_count() ? "y" : "ies",
      count == m.step_count() ? "it" : "them");
  f.evidence = fmt::format("{}", fmt::join(parts, "; "));
  f.fix =
      "pin the host buffers: ferry::ingest::prefetcher / ferry::egress::pipeline own pinned slots (ingest "
      "L2, egress L3/L4-pinned)";
  out.push_back(std::move(f));
}

}  // namespace ferry::trace::detail
