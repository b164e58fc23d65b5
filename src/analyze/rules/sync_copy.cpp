// sync_copy: a blocking copy that keeps the next launch waiting. The cost is the copy time no kernel
// overlapped plus the GPU idle while the main thread still waited after the copy.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <unordered_map>
#include <utility>

#include "ferry/core/units.hpp"
#include "rules.hpp"
#include "wording.hpp"

namespace ferry::trace::detail {

namespace {

// A wait that ends this soon after a copy ended waited for that copy: max(1 ms, 5% of the copy). A GPU
// wakes a waiting thread within tens of microseconds, but a loaded host (and the host backend's threads)
// can take a millisecond; a copy followed by an unrelated wait that soon is rare enough.
constexpr ns_t wait_slack_ns = 1'000'000;
constexpr double wait_slack_fraction = 0.05;

// Main-thread blocking waits sorted by end (all threads when there is no main thread).
std::vector<std::size_t> main_waits(const model& m) {
  const timeline& t = m.trace();
  std::vector<std::size_t> waits;
  for (std::size_t i : m.cpu()) {
    const event& e = t.events[i];
    if (is_wait(e) && (!m.main_thread() || e.thread == *m.main_thread())) waits.push_back(i);
  }
  std::sort(waits.begin(), waits.end(), [&t](std::size_t a, std::size_t b) {
    return std::tie(t.events[a].end_ns, a) < std::tie(t.events[b].end_ns, b);
  });
  return waits;
}

}  // namespace

void find_sync_copy(const model& m, std::vector<finding>& out) {
  const timeline& t = m.trace();
  const auto copies =
      m.copies_in_steps([](const event& c) { return c.copy == copy_kind::h2d || c.copy == copy_kind::d2h; });
  const std::vector<std::size_t> waits = main_waits(m);
  std::unordered_map<std::uint64_t, std::size_t> api_by_correlation;
  for (std::size_t i : m.cpu()) {
    const event& e = t.events[i];
    if (e.kind == activity::api && e.correlation != 0) api_by_correlation.emplace(e.correlation, i);
  }
  // Kernel starts and ends, each sorted (m.gpu() is by start), when there are copies to place among them.
  std::vector<ns_t> kernel_starts, kernel_ends;
  if (!copies.empty()) {
    for (const index_t i : m.gpu())
      if (t.events[i].kind == activity::kernel) {
        kernel_starts.push_back(t.events[i].start_ns);
        kernel_ends.push_back(t.events[i].end_ns);
      }
    std::sort(kernel_ends.begin(), kernel_ends.end());
  }
  std::size_t count = 0;
  std::map<copy_kind, std::pair<std::size_t, std::uint64_t>> dirs;  // count, bytes
  double blocked_ns = 0, lone_ns = 0, held_ns = 0, copy_ns = 0;
  for (std::size_t i : copies) {
    const event& c = t.events[i];
    const ns_t slack = std::max(wait_slack_ns, static_cast<ns_t>(wait_slack_fraction * c.duration_ns()));
    // The first main-thread wait that ends within the slack after the copy ended. For an async copy, the
    // call that issued it does not count (a pageable one blocks in it: pageable_async_copy's finding).
    const auto own_call = [&](const event& w) {
      return (c.correlation != 0 && w.correlation == c.correlation) ||
             (w.sync == sync_kind::copy && w.start_ns <= c.start_ns);
    };
    // The copy ends for the CPU when the GPU finished it and, for an issuing call that blocked, when that
    // call returned.
    ns_t done = c.end_ns;
    for (auto w = std::partition_point(waits.begin(), waits.end(),
                                       [&](std::size_t x) { return t.events[x].end_ns < c.end_ns; });
         w != waits.end() && t.events[*w].end_ns <= c.end_ns + slack; ++w)
      if (own_call(t.events[*w])) done = std::max(done, t.events[*w].end_ns);
    // With a correlation id the issuing call is known exactly, however late a loaded host returned from it.
    if (c.correlation != 0)
      if (auto a = api_by_correlation.find(c.correlation); a != api_by_correlation.end())
        done = std::max(done, t.events[a->second].end_ns);
    auto it = std::partition_point(waits.begin(), waits.end(),
                                   [&](std::size_t w) { return t.events[w].end_ns < c.end_ns; });
    std::optional<std::size_t> wait;
    for (; it != waits.end() && t.events[*it].end_ns <= done + slack; ++it) {
      if (c.async && own_call(t.events[*it])) continue;
      wait = *it;
      break;
    }
    auto next_kernel = std::lower_bound(kernel_starts.begin(), kernel_starts.end(), c.end_ns);
    if (c.async) {
      if (!wait) continue;
      const event& w = t.events[*wait];
      // The launch was not held when a kernel started before the wait ended. With no kernel after it in
      // the trace (the window's last step) the wait counts: nothing shows it was harmless.
      if (next_kernel != kernel_starts.end() && *next_kernel < w.end_ns) continue;
      // A wait that a kernel's end fell into waited for that kernel too (a device synchronize at the end
      // of a run, say): not a wait for the copy.
      if (std::upper_bound(kernel_ends.begin(), kernel_ends.end(), c.end_ns) !=
          std::upper_bound(kernel_ends.begin(), kernel_ends.end(), w.end_ns))
        continue;
    } else if (!wait && c.correlation != 0) {
      if (auto a = api_by_correlation.find(c.correlation); a != api_by_correlation.end()) wait = a->second;
    }
    const ns_t wait_end = wait ? std::max(c.end_ns, t.events[*wait].end_ns) : c.end_ns;
    const ns_t held_until =
        next_kernel == kernel_starts.end() ? wait_end : std::min(wait_end, std::max(c.end_ns, *next_kernel));
    // Cost: the copy time no kernel overlapped, plus the GPU idle while the CPU still waited after the copy.
    const ns_t lone = c.duration_ns() - m.kernels().covered(c.start_ns, c.end_ns);
    const ns_t held = m.busy().gaps(c.end_ns, held_until);
    ++count;
    auto& d = dirs[c.copy];
    ++d.first;
    d.second += c.bytes;
    copy_ns += static_cast<double>(c.duration_ns());
    blocked_ns += static_cast<double>(wait ? t.events[*wait].duration_ns() : c.duration_ns());
    lone_ns += static_cast<double>(lone);
    held_ns += static_cast<double>(held);
  }
  // Asynchronous copies into or out of pageable memory: their issuing call (known by correlation id) blocks
  // until the copy, and everything queued before it on its stream, is done. The GPU idle meanwhile counts
  // when it matters (material_fraction of the step): a value read back that waits for the stream to drain.
  std::vector<span> calls;
  std::size_t call_count = 0;
  std::map<copy_kind, std::pair<std::size_t, std::uint64_t>> call_dirs;  // count, bytes
  for (std::size_t i : copies) {
    const event& c = t.events[i];
    if (!c.async || !pageable_side(c) || c.correlation == 0) continue;
    const auto a = api_by_correlation.find(c.correlation);
    if (a == api_by_correlation.end()) continue;
    const event& call = t.events[a->second];
    if (m.main_thread() && call.thread != *m.main_thread()) continue;
    calls.push_back({call.start_ns, call.end_ns});
    ++call_count;
    auto& d = call_dirs[c.copy];
    ++d.first;
    d.second += c.bytes;
  }
  double call_idle_ns = static_cast<double>(m.idle_during(std::move(calls)));
  if (ms(m.per_step(call_idle_ns)) < material_fraction * m.summary().mean.wall_ms)
    call_idle_ns = 0, call_count = 0;
  if (count == 0 && call_count == 0) return;
  finding f;
  f.rule = "sync_copy";
  f.cost_ms_per_step = ms(m.per_step(lone_ns)) + ms(m.per_step(held_ns)) + ms(m.per_step(call_idle_ns));
  if (call_count > 0) {
    f.numbers["cost_call_idle_ms_per_step"] = ms(m.per_step(call_idle_ns));
    f.numbers["blocking_async_calls_per_step"] = m.per_step(static_cast<double>(call_count));
  }
  std::vector<std::string> parts;
  for (const auto& [k, d] : dirs) {
    parts.push_back(fmt::format(
        "{} {} per step ({} per step)", count_text(m.per_step(static_cast<double>(d.first))), upper_dir(k),
        format_bytes(static_cast<std::uint64_t>(m.per_step(static_cast<double>(d.second))))));
    const std::string key = k == copy_kind::h2d ? "h2d" : "d2h";
    f.numbers[key + "_count_per_step"] = m.per_step(static_cast<double>(d.first));
    f.numbers[key + "_bytes_per_step"] = m.per_step(static_cast<double>(d.second));
  }
  f.numbers["count_per_step"] = m.per_step(static_cast<double>(count));
  f.numbers["blocked_ms_per_step"] = ms(m.per_step(blocked_ns));
  f.numbers["copy_ms_per_step"] = ms(m.per_step(copy_ns));
  f.numbers["cost_lone_copy_ms_per_step"] = ms(m.per_step(lone_ns));
  f.numbers["cost_held_idle_ms_per_step"] = ms(m.per_step(held_ns));
  const std::size_t all = count + call_count;
  f.title = fmt::format("{} blocking cop{} per step hold{} back the next launch",
                        count_text(m.per_step(static_cast<double>(all))), all == m.step_count() ? "y" : "ies",
                        all == m.step_count() ? "s" : "");
  if (count > 0)
    f.evidence = fmt::format(
        "{}; the main thread was blocked {} per step waiting for them; the copies took {} per step, {} of it "
        "with no kernel running, and the GPU idled {} per step after them while the main thread still waited",
        fmt::join(parts, ", "), ms_text(ms(m.per_step(blocked_ns))), ms_text(ms(m.per_step(copy_ns))),
        ms_text(ms(m.per_step(lone_ns))), ms_text(ms(m.per_step(held_ns))));
  if (call_count > 0)
    f.evidence += fmt::format(
        "{}{} asynchronous cop{} per step into or out of pageable memory blocked in {} issuing call until "
        "their stream drained, the GPU idling {} per step meanwhile",
        count > 0 ? "; " : "", count_text(m.per_step(static_cast<double>(call_count))),
        call_count == m.step_count() ? "y" : "ies", call_count == m.step_count() ? "its" : "their",
        ms_text(ms(m.per_step(call_idle_ns))));
  if (m.pytorch()) {
    // What blocked, by direction: the blocking copies and the pageable ones whose call blocked. D2H copies
    // under 1 MiB on average are values read back (.item(), a loss printed), not outputs.
    for (const auto& [k, d] : call_dirs) {
      dirs[k].first += d.first;
      dirs[k].second += d.second;
    }
    const auto d2h = dirs.find(copy_kind::d2h);
    const bool outputs =
        d2h != dirs.end() && d2h->second.second >= d2h->second.first * (std::uint64_t{1} << 20);
    const bool read_backs = d2h != dirs.end() && !outputs;
    const bool inputs = dirs.contains(copy_kind::h2d);
    if (inputs || outputs)
      f.fix = "non-blocking copies from pinned memory: " + torch_copy_fix(inputs, outputs);
    if (read_backs)
      f.fix += std::string(f.fix.empty() ? "" : "; ") +
               "small D2H copies are values read back (.item(), .cpu(), a printed tensor): each waits for "
               "the GPU work queued before it, so read them less often (every few steps)";
  } else {
    f.fix =
        "non-blocking copy from pinned memory on a copy stream: ferry::ingest::prefetcher (ingest L2..L4) / "
        "ferry::egress::pipeline (egress L3..L4)";
  }
  out.push_back(std::move(f));
}

}  // namespace ferry::trace::detail
