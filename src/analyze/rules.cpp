// The rules table and the ranking of what the rules find.
#include "rules.hpp"

#include <algorithm>
#include <array>
#include <cstddef>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "work_class.hpp"

namespace ferry::trace::detail {

namespace {

// Every rule, in ranking order.
constexpr std::array table{
    rule{"compute_bound", find_compute_bound, true},
    rule{"gpu_idle", find_gpu_idle},
    rule{"host_bound", find_host_bound},
    rule{"sync_copy", find_sync_copy},
    rule{"pageable_async_copy", find_pageable_async_copy},
    rule{"device_sync", find_device_sync},
    rule{"serialized_copy", find_serialized_copy},
    rule{"exposed_comm", find_exposed_comm},
    rule{"low_copy_bandwidth", find_low_copy_bandwidth},
    rule{"drain_tail", find_drain_tail},
};

std::size_t rank_of(std::string_view id) {
  const auto it = std::find_if(table.begin(), table.end(), [id](const rule& r) { return r.id == id; });
  return static_cast<std::size_t>(it - table.begin());
}

// The rules that explain GPU idle whose cause is of a kind (finding::cause).
struct explained_by {
  std::string_view cause;
  std::array<std::string_view, 2> rules;
};
constexpr std::array explanations{
    explained_by{"copy", {"sync_copy", "pageable_async_copy"}},
    explained_by{"host_wait", {"host_bound", "host_bound"}},
};

// True when `f` is a gpu_idle finding whose cause another finding of `fs` explains at a material cost.
bool explained_elsewhere(const finding& f, const std::vector<finding>& fs, double material_ms) {
  if (f.rule != "gpu_idle" || f.cause.empty()) return false;
  for (const explained_by& e : explanations) {
    if (e.cause != f.cause) continue;
    return std::any_of(fs.begin(), fs.end(), [&](const finding& g) {
      return (g.rule == e.rules[0] || g.rule == e.rules[1]) && g.cost_ms_per_step >= material_ms;
    });
  }
  return false;
}

// A finding that costs the steps nothing is not worth a line, unless its cost lies elsewhere (drain_tail:
// latency at the end of the run). Below half of the 0.01 ms the report prints is nothing.
bool costs_nothing(const finding& f) { return f.rule != "drain_tail" && f.cost_ms_per_step < 0.005; }

}  // namespace

delegation delegated_work(const model& m) {
  const analysis& s = m.summary();
  const idle_attribution* wait = nullptr;
  for (const idle_attribution& a : s.idle)
    if (a.main_thread) {
      wait = &a;
      break;
    }
  // A wait for another thread of the process: a condition variable or a futex. Waits for other processes
  // (poll, read, select, a semaphore: a DataLoader's queues) are host_bound's.
  if (wait == nullptr || wait->fraction_of_idle < cause_share ||
      classify_work(wait->activity, wait->blocking) != work_class::host_wait ||
      !(wait->activity.find("cond") != std::string::npos ||
        wait->activity.find("futex") != std::string::npos))
    return {};
  const timeline& t = m.trace();
  const auto owner = [&](std::uint64_t thread) {
    const auto it = t.thread_processes.find(thread);
    return it != t.thread_processes.end() ? it->second : 0;
  };
  std::map<std::uint64_t, work_class> classes;  // label -> its class
  const auto class_of = [&](const event& e) {
    const std::uint64_t label = m.label_of(e);
    const auto [it, fresh] = classes.try_emplace(label, work_class::user);
    if (fresh) it->second = classify_work(m.label_text(label), (label & model::blocking_bit) != 0);
    return it->second;
  };
  // The main thread's waits of that name, and the GPU idle inside them.
  std::map<std::uint64_t, bool> named_like_wait;  // label -> named like the wait
  std::vector<span> waits;
  for (const index_t i : m.cpu()) {
    const event& e = t.events[i];
    if (e.thread != wait->thread_id || e.end_ns <= e.start_ns) continue;
    const std::uint64_t label = m.label_of(e);
    const auto [it, fresh] = named_like_wait.try_emplace(label, false);
    if (fresh) it->second = m.label_text(label) == wait->activity;
    if (it->second) waits.push_back({e.start_ns, e.end_ns});
  }
  const ns_t waited = m.idle_during(waits);
  if (waited <= 0) return {};
  const interval_union inside(std::move(waits));
  // Each other thread of the process: the GPU work it launched during those waits, and its own waits
  // there (clipped to them).
  struct other {
    std::size_t launches = 0;
    std::vector<span> asleep;
  };
  std::map<std::uint64_t, other> others;
  const std::vector<span>& w = inside.spans();
  const std::uint64_t process = owner(wait->thread_id);
  // A thread's own waits count only for threads that launch (a parked pool thread adds a span per window).
  std::vector<index_t> sleeps;
  for (const index_t i : m.cpu()) {
    const event& e = t.events[i];
    if (e.thread == wait->thread_id || e.thread == 0 || owner(e.thread) != process) continue;
    const work_class c = class_of(e);
    if (c == work_class::launch && m.step_of(e.start_ns) >= 0 &&
        inside.covered(e.start_ns, e.start_ns + 1) > 0)
      ++others[e.thread].launches;
    else if (c == work_class::host_wait && e.end_ns > e.start_ns)
      sleeps.push_back(i);
  }
  for (const index_t i : sleeps) {
    const event& e = t.events[i];
    const auto o = others.find(e.thread);
    if (o == others.end()) continue;
    auto it = std::partition_point(w.begin(), w.end(), [&](const span& x) { return x.end <= e.start_ns; });
    for (; it != w.end() && it->start < e.end_ns; ++it)
      o->second.asleep.push_back({std::max(it->start, e.start_ns), std::min(it->end, e.end_ns)});
  }
  // The thread that launches and is awake (in no wait of its own) through most of the main thread's wait:
  // the one it waits for (ties: the one that launched more).
  delegation best;
  ns_t best_awake = 0;
  for (auto& [thread, o] : others) {
    const ns_t awake = waited - m.idle_during(std::move(o.asleep));
    if (2 * awake < waited || awake < best_awake || (awake == best_awake && o.launches <= best.launches))
      continue;
    best_awake = awake;
    best.wait = wait;
    best.thread = thread;
    best.launches = o.launches;
  }
  // Launch-bound work: a launch at least every launch_gap_ns of the time it was awake in the waits, on
  // average (PyTorch's autograd engine in a launch-bound backward: one every 51 us). A thread that launches
  // seldom (a producer that decodes on the CPU, then launches one kernel) bounds the GPU with its CPU work,
  // which the trace does not name: the wait keeps its own reading then.
  constexpr double launch_gap_ns = 200'000;
  if (best.wait == nullptr ||
      static_cast<double>(best.launches) * launch_gap_ns < static_cast<double>(best_awake))
    return {};
  best.thread_name = m.thread_name(best.thread);
  best.awake_ms = ms(best_awake);
  best.awake_fraction = static_cast<double>(best_awake) / static_cast<double>(waited);
  for (const idle_attribution& a : s.idle) {
    if (a.thread_id != best.thread) continue;
    const work_class c = classify_work(a.activity, a.blocking);
    if (c == work_class::launch || c == work_class::framework) {
      best.activity = &a;  // s.idle is sorted by idle time: the most covering one
      break;
    }
  }
  return best;
}

std::vector<finding> find_all(const model& m) {
  std::vector<finding> fs;
  for (const rule& r : table)
    if (!r.fallback) r.find(m, fs);
  const double material = material_fraction * m.summary().mean.wall_ms;
  std::vector<bool> drop(fs.size());
  for (std::size_t i = 0; i < fs.size(); ++i)
    drop[i] = costs_nothing(fs[i]) || explained_elsewhere(fs[i], fs, material);
  std::vector<finding> kept;
  for (std::size_t i = 0; i < fs.size(); ++i)
    if (!drop[i]) kept.push_back(std::move(fs[i]));
  fs = std::move(kept);
  std::stable_sort(fs.begin(), fs.end(), [](const finding& a, const finding& b) {
    if (a.cost_ms_per_step != b.cost_ms_per_step) return a.cost_ms_per_step > b.cost_ms_per_step;
    const std::size_t ra = rank_of(a.rule), rb = rank_of(b.rule);
    if (ra != rb) return ra < rb;
    return a.title < b.title;
  });
  const bool bound =
      std::any_of(fs.begin(), fs.end(), [&](const finding& f) { return f.cost_ms_per_step >= material; });
  if (bound) return fs;
  std::vector<finding> leading;
  for (const rule& r : table)
    if (r.fallback) r.find(m, leading);
  fs.insert(fs.begin(), std::make_move_iterator(leading.begin()), std::make_move_iterator(leading.end()));
  return fs;
}

}  // namespace ferry::trace::detail

namespace ferry::trace {

const std::vector<std::string>& rule_ids() {
  static const std::vector<std::string> ids = [] {
    std::vector<std::string> out;
    for (const detail::rule& r : detail::table) out.emplace_back(r.id);
    return out;
  }();
  return ids;
}

}  // namespace ferry::trace
