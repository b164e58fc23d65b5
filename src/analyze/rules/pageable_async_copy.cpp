// pageable_async_copy: an asynchronous copy from or to pageable memory. The driver stages it through
// its own pinned buffer and the call blocks until the copy, and the work queued before it on its stream,
// is done. The cost is the time the copies took beyond the pinned link's; the GPU idle while the issuing
// calls blocked is sync_copy's.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <iterator>
#include <map>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

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
  // The issuing calls: by correlation id, else the blocking copy call that was running when the copy began.
  std::unordered_map<std::uint64_t, std::size_t> call_of;
  std::vector<std::size_t> copy_calls;  // by start
  for (std::size_t i : m.cpu()) {
    const event& e = t.events[i];
    if (e.kind != activity::api) continue;
    if (e.correlation != 0) call_of.emplace(e.correlation, i);
    if (e.sync == sync_kind::copy) copy_calls.push_back(i);
  }
  std::vector<span> blocked;
  ns_t blocked_ns = 0;
  std::uint64_t small_d2h = 0;
  for (std::size_t i : copies) {
    const event& c = t.events[i];
    std::optional<std::size_t> call;
    if (auto it = call_of.find(c.correlation); c.correlation != 0 && it != call_of.end()) {
      call = it->second;
    } else {
      auto it2 = std::partition_point(copy_calls.begin(), copy_calls.end(),
                                      [&](std::size_t x) { return t.events[x].start_ns <= c.start_ns; });
      if (it2 != copy_calls.begin() && t.events[*std::prev(it2)].end_ns >= c.start_ns) call = *std::prev(it2);
    }
    if (call) {
      blocked.push_back({t.events[*call].start_ns, t.events[*call].end_ns});
      blocked_ns += t.events[*call].duration_ns();
    }
    if (c.copy == copy_kind::d2h && c.bytes < (std::uint64_t{1} << 20)) ++small_d2h;
  }
  const double idle_ns = static_cast<double>(m.idle_during(std::move(blocked)));
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
  f.numbers["cost_staging_ms_per_step"] = ms(m.per_step(cost_ns));
  f.numbers["blocked_idle_ms_per_step"] = ms(m.per_step(idle_ns));
  f.numbers["blocked_ms_per_step"] = ms(m.per_step(static_cast<double>(blocked_ns)));
  f.title = fmt::format(
      "{} asynchronous cop{} per step from or to pageable memory: the driver stages {} and the "
      "call blocks",
      count_text(m.per_step(static_cast<double>(count))), count == m.step_count() ? "y" : "ies",
      count == m.step_count() ? "it" : "them");
  f.evidence = fmt::format(
      "{}; the issuing calls blocked the launching thread {} per step, the GPU idling {} per step meanwhile "
      "(see sync_copy); at the pinned link the copies would take {} per step less",
      fmt::join(parts, "; "), ms_text(ms(m.per_step(static_cast<double>(blocked_ns)))),
      ms_text(ms(m.per_step(idle_ns))), ms_text(ms(m.per_step(cost_ns))));
  const bool read_backs = 2 * small_d2h >= copies.size();
  if (m.pytorch()) {
    // Outputs are D2H copies of 1 MiB and more on average; smaller ones are values read back (below).
    const auto d2h = dirs.find(copy_kind::d2h);
    const bool outputs =
        d2h != dirs.end() && d2h->second.bytes >= d2h->second.count * (std::uint64_t{1} << 20);
    const bool inputs = dirs.contains(copy_kind::h2d);
    if (inputs || outputs || !read_backs) f.fix = "pin the host side: " + torch_copy_fix(inputs, outputs);
  } else {
    f.fix =
        "pin the host buffers: ferry::ingest::prefetcher / ferry::egress::pipeline own pinned slots (ingest "
        "L2, egress L3/L4-pinned)";
  }
  if (read_backs)
    f.fix +=
        std::string(f.fix.empty() ? "" : "; ") +
        "small D2H copies into pageable memory are values read back (.item(), .cpu(), .tolist(), a "
        "printed tensor): each waits for all the GPU work queued before it, so read them less often, or copy "
        "them into pinned memory with non_blocking=True and read them after an event";
  out.push_back(std::move(f));
}

}  // namespace ferry::trace::detail
