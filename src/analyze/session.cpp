// analyze_session(): a multi-process recording (`ferry trace`) analyzed per GPU-owning process. Each such
// process gets the step analysis of its own GPU activity and CPU threads, with the CPU events of its
// descendant processes (DataLoader workers, post-processing workers) beside them under names that say
// whose they are, and the descendants' CPU use while its GPU idled from the launcher's /proc samples.
// When that use is high, the gpu_idle or host_bound finding says so: the workers, not the main thread,
// bound the loop.
#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <string_view>
#include <system_error>
#include <unordered_set>
#include <utility>
#include <vector>

#include "ferry/analyze/analyze.hpp"
#include "ferry/core/error.hpp"
#include "interval_union.hpp"

namespace ferry::trace {

namespace {

std::string label(const process_info& p) { return fmt::format("{} [{}]", p.name, p.pid); }

bool descends_from(const timeline& t, std::uint64_t key, std::uint64_t ancestor) {
  for (int depth = 0; depth < 64 && key != 0; ++depth) {
    if (key == ancestor) return true;
    const auto it = t.processes.find(key);
    if (it == t.processes.end()) return false;
    key = it->second.parent;
  }
  return false;
}

std::uint64_t process_of(const timeline& t, const event& e) {
  if (e.on_gpu()) {
    const auto it = t.stream_processes.find(e.stream);
    return it != t.stream_processes.end() ? it->second : 0;
  }
  const auto it = t.thread_processes.find(e.thread);
  return it != t.thread_processes.end() ? it->second : 0;
}

// The id of `text` in t's strings, or 0 when it is not there.
std::uint32_t lookup(const timeline& t, std::string_view text) {
  for (std::uint32_t i = 1; i < t.strings.size(); ++i)
    if (t.strings[i] == text) return i;
  return 0;
}

// Keeps the steps after the first (the warm-up: CUDA's and cuDNN's first-use costs) when there are four
// or more "step N" spans of ferry trace's Python ranges on the main thread, and only the events that
// overlap them, as an in-process recording captures the timed steps only. Returns the steps kept.
std::size_t keep_steady_steps(timeline& r, std::uint64_t main_thread) {
  std::vector<std::pair<std::int64_t, std::int64_t>> steps;
  for (const event& e : r.events)
    if (e.kind == activity::range && e.thread == main_thread && r.name_of(e).starts_with("step ") &&
        r.domain_of(e) == "ferry.python")
      steps.emplace_back(e.start_ns, e.end_ns);
  if (steps.size() < 4) return steps.size();
  std::sort(steps.begin(), steps.end());
  const std::int64_t from = steps[1].first;
  const std::int64_t to = steps.back().second;
  // The last step's GPU work runs after its CPU side ended: GPU events launched inside the window stay.
  std::unordered_set<std::uint64_t> launched;
  for (const event& e : r.events)
    if (e.kind == activity::api && e.correlation != 0 && e.start_ns >= from && e.start_ns <= to)
      launched.insert(e.correlation);
  std::erase_if(r.events, [&](const event& e) {
    if (e.on_gpu() && e.start_ns > to && e.correlation != 0 && launched.contains(e.correlation)) return false;
    if (e.end_ns < from || e.start_ns > to) return true;
    return e.kind == activity::range && e.start_ns < from && r.name_of(e).starts_with("step ") &&
           r.domain_of(e) == "ferry.python";
  });
  // CPU work still going at the last step's end (workers fetching batches no step will use) ends there,
  // as a capture window would cut it.
  for (event& e : r.events)
    if (!e.on_gpu() && e.end_ns > to) e.end_ns = std::max(e.start_ns, to);
  return steps.size() - 1;
}

// Whether a recorded process runs Python: its command's program is python, python3, python3.12, ...
bool runs_python(const process_info& p) {
  const std::string_view command = p.command;
  std::string_view program = command.substr(0, command.find(' '));
  if (const std::size_t slash = program.rfind('/'); slash != std::string_view::npos)
    program = program.substr(slash + 1);
  return program.starts_with("python");
}

// The timeline of one GPU-owning process: its events, and its descendants' CPU events with their threads
// named after their process.
timeline rank_timeline(const timeline& t, std::uint64_t key) {
  timeline r;
  r.source = t.source;
  r.device_name = t.device_name;
  r.strings = t.strings;
  r.link_h2d_gbps = t.link_h2d_gbps;
  r.link_d2h_gbps = t.link_d2h_gbps;
  r.metadata = t.metadata;
  std::set<std::uint64_t> family;
  for (const auto& [k, p] : t.processes)
    if (descends_from(t, k, key)) family.insert(k);
  const std::uint32_t os = t.strings.size() > 0 ? lookup(t, "os") : 0;
  for (const event& e : t.events) {
    const std::uint64_t owner = process_of(t, e);
    if (owner != key && (e.on_gpu() || !family.contains(owner))) continue;
    // Blocking calls of other threads (a thread pool's idle waits, a queue's feeder) say only that the
    // thread had nothing to do: the main thread's are the ones that keep the GPU waiting.
    if (os != 0 && e.domain == os && e.thread != key) continue;
    r.events.push_back(e);
  }
  for (const auto& [tid, owner] : t.thread_processes) {
    if (!family.contains(owner)) continue;
    r.thread_processes[tid] = owner;
    const auto n = t.thread_names.find(tid);
    std::string name = n != t.thread_names.end() ? n->second : fmt::format("thread {}", tid);
    if (owner != key) name = label(t.processes.at(owner)) + " " + name;
    r.thread_names[tid] = name;
  }
  for (const auto& [stream, owner] : t.stream_processes) {
    if (owner != key) continue;
    const auto n = t.stream_names.find(stream);
    if (n != t.stream_names.end()) r.stream_names[stream] = n->second;
  }
  return r;
}

// GPU idle stretches of `r` between its first and last GPU activity.
std::vector<std::pair<std::int64_t, std::int64_t>> gpu_idle(const timeline& r) {
  std::vector<detail::span> spans;
  for (const event& e : r.events)
    if (e.on_gpu()) spans.push_back({e.start_ns, e.end_ns});
  const detail::interval_union busy(std::move(spans));
  std::vector<std::pair<std::int64_t, std::int64_t>> out;
  if (busy.empty()) return out;
  busy.for_each_gap(busy.first(), busy.last(),
                    [&](const detail::span& g) { out.emplace_back(g.start, g.end); });
  return out;
}

// An inference loop has no optimizer steps: each outermost forward of the main thread starts a step
// (ferry trace's Python ranges), up to the next forward, the last up to the rank's last GPU activity.
// Returns false when the rank has step spans already or no forward ranges.
bool add_forward_steps(timeline& r, std::uint64_t main_thread) {
  std::vector<std::int64_t> starts;
  std::int64_t last_gpu = INT64_MIN;
  for (const event& e : r.events) {
    if (e.on_gpu()) last_gpu = std::max(last_gpu, e.end_ns);
    if (e.kind != activity::range && e.kind != activity::stage) continue;
    const std::string_view name = r.name_of(e);
    if (name.starts_with("step") || name.starts_with("ProfilerStep#")) return false;
    if (e.thread == main_thread && name.starts_with("forward (")) starts.push_back(e.start_ns);
  }
  if (starts.size() < 2) return false;
  std::sort(starts.begin(), starts.end());
  const std::uint32_t domain = r.strings.intern("ferry.python");
  for (std::size_t i = 0; i < starts.size(); ++i) {
    event e;
    e.kind = activity::range;
    e.start_ns = starts[i];
    e.end_ns = i + 1 < starts.size() ? starts[i + 1] : std::max(starts[i], last_gpu);
    e.thread = main_thread;
    e.name = r.strings.intern(fmt::format("step {}", i));
    e.domain = domain;
    r.events.push_back(e);
  }
  r.sort();
  return true;
}

bool inside(const std::vector<std::pair<std::int64_t, std::int64_t>>& gaps, std::int64_t t) {
  const auto it = std::upper_bound(gaps.begin(), gaps.end(), std::make_pair(t, INT64_MAX));
  return it != gaps.begin() && t < std::prev(it)->second;
}

// The descendants' CPU use in the samples taken while the rank's GPU idled.
void add_workers(const timeline& t, std::uint64_t key, const timeline& r, process_analysis& pa) {
  const auto gaps = gpu_idle(r);
  std::map<std::uint64_t, std::pair<double, std::size_t>> use;  // key -> (sum of cores, samples)
  std::map<std::uint64_t, std::size_t> busy;
  for (const cpu_sample& s : t.cpu_samples) {
    if (s.process == key || !descends_from(t, s.process, key) || !inside(gaps, s.t_ns)) continue;
    auto& u = use[s.process];
    u.first += static_cast<double>(s.cores);
    ++u.second;
    if (s.cores >= 0.9f) ++busy[s.process];
  }
  for (const auto& [k, u] : use) {
    worker_activity w;
    w.process = label(t.processes.at(k));
    w.cpu_cores = u.first / static_cast<double>(u.second);
    w.busy_fraction = static_cast<double>(busy[k]) / static_cast<double>(u.second);
    pa.workers_cores += w.cpu_cores;
    pa.workers.push_back(std::move(w));
  }
  std::sort(pa.workers.begin(), pa.workers.end(),
            [](const worker_activity& a, const worker_activity& b) { return a.cpu_cores > b.cpu_cores; });
  if (pa.workers.empty()) return;
  // The finding that explains the idle says what the workers did meanwhile.
  const double n = static_cast<double>(pa.workers.size());
  const bool saturated = pa.workers_cores >= 0.8 * n;
  for (finding& f : pa.result.findings) {
    if (f.rule != "gpu_idle" && f.rule != "host_bound") continue;
    f.evidence +=
        fmt::format("; while the GPU idled, its {} worker process{} used {:.2f} core{} together (of {})",
                    pa.workers.size(), pa.workers.size() == 1 ? "" : "es", pa.workers_cores,
                    pa.workers_cores == 1.0 ? "" : "s", pa.workers.size());
    f.numbers["workers"] = n;
    f.numbers["workers_cpu_cores"] = pa.workers_cores;
    if (saturated)
      f.fix += fmt::format(
          "; the {} worker processes were busy nearly all the time: they bound the loop (data-bound): add "
          "workers if cores are free, or make each sample cheaper (move the transform to the GPU)",
          pa.workers.size());
    break;
  }
}

// Step spans ("step N") of the rank's main thread that ended before the capture opened, and during it.
void recording_cost(const timeline& t, session_analysis& s) {
  std::int64_t on = -1, off = INT64_MAX;
  const auto number = [](const std::string& text) {
    std::int64_t v = -1;
    const auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
    return ec == std::errc{} && p == text.data() + text.size() ? v
                                                               : -1;  // a note ferry did not write: ignored
  };
  for (const auto& [k, p] : t.processes) {
    if (const auto it = p.notes.find("capture_on_ns"); it != p.notes.end()) {
      const std::int64_t v = number(it->second);
      if (v >= 0 && (on < 0 || v < on)) on = v;
    }
    if (const auto it = p.notes.find("capture_off_ns"); it != p.notes.end())
      if (const std::int64_t v = number(it->second); v >= 0) off = std::min(off, v);
  }
  if (on < 0) return;
  std::vector<double> before, during;
  for (const event& e : t.events) {
    if (e.kind != activity::range || !t.name_of(e).starts_with("step ") || t.domain_of(e) != "ferry.python")
      continue;
    const double ms = static_cast<double>(e.end_ns - e.start_ns) * 1e-6;
    if (e.end_ns <= on)
      before.push_back(ms);
    else if (e.start_ns >= on && e.end_ns <= off)
      during.push_back(ms);
  }
  auto median = [](std::vector<double>& v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  s.steps_before = before.size();
  s.steps_during = during.size();
  if (before.size() < 3 || during.size() < 3) return;
  // The first steps of a run (warm-up) and the first captured ones (CUPTI instruments kernels at their
  // next launch) are not steady: the medians keep them from deciding.
  s.steps_before_ms = median(before);
  s.steps_during_ms = median(during);
  s.recording_cost = s.steps_during_ms / s.steps_before_ms - 1.0;
}

}  // namespace

session_analysis analyze_session(const timeline& t, const analyze_options& opts) {
  session_analysis s;
  std::map<std::uint64_t, std::size_t> events;
  for (const event& e : t.events) ++events[process_of(t, e)];
  std::map<std::uint64_t, std::pair<double, std::size_t>> cpu;
  for (const cpu_sample& c : t.cpu_samples) {
    auto& u = cpu[c.process];
    u.first += static_cast<double>(c.cores);
    ++u.second;
  }
  for (const auto& [k, p] : t.processes) {
    process_summary ps;
    ps.key = k;
    ps.pid = p.pid;
    ps.parent = p.parent;
    ps.name = p.name;
    ps.command = p.command;
    ps.started = p.started;
    ps.ended = p.ended;
    ps.gpu = p.gpu;
    ps.events = events[k];
    if (const auto it = cpu.find(k); it != cpu.end() && it->second.second > 0)
      ps.cpu_cores = it->second.first / static_cast<double>(it->second.second);
    ps.notes = p.notes;
    for (const auto& [key, value] : p.notes) {
      if (key == "cupti_handover")
        s.notes.push_back(fmt::format("{}: {}", label(p), value.substr(value.find(' ') + 1)));
      if (key == "cupti" && value.starts_with("unavailable"))
        s.notes.push_back(fmt::format("{}: CUPTI {}", label(p), value));
    }
    if (p.ended.starts_with("no exit record"))
      s.notes.push_back(fmt::format("{}: {}; its last flush interval may be missing", label(p), p.ended));
    s.processes.push_back(std::move(ps));
  }
  std::sort(s.processes.begin(), s.processes.end(), [&](const process_summary& a, const process_summary& b) {
    return t.processes.at(a.key).start_ns < t.processes.at(b.key).start_ns;
  });
  if (const auto it = t.metadata.find("launcher_cpu_cores"); it != t.metadata.end()) {
    double v = -1;
    const auto [p, ec] = std::from_chars(it->second.data(), it->second.data() + it->second.size(), v);
    if (ec == std::errc{}) s.launcher_cpu_cores = v;
  }
  for (const auto& [reason, n] : t.skipped) s.notes.push_back("not read: " + reason);

  for (const process_summary& ps : s.processes) {
    if (!ps.gpu) continue;
    timeline r = rank_timeline(t, ps.key);
    process_analysis pa;
    pa.key = ps.key;
    pa.name = label(t.processes.at(ps.key));
    if (opts.step_prefix.empty() && add_forward_steps(r, ps.key))
      s.notes.push_back(
          fmt::format("{}: no training steps; one step per forward of its main thread", pa.name));
    if (opts.step_prefix.empty()) {
      const std::size_t all = keep_steady_steps(r, ps.key);
      if (all >= 3)
        s.notes.push_back(
            fmt::format("{}: steps 1 to {} analyzed; step 0 (the warm-up) and the time before and "
                        "after the steps left out",
                        pa.name, all));
    }
    // The fixes in PyTorch's words for a Python program, also one recorded without its annotation
    // (--python none); a program of another language (ferry's own benches) keeps the C++ words.
    analyze_options rank_opts = opts;
    if (rank_opts.wording == fix_wording::automatic && runs_python(t.processes.at(ps.key)))
      rank_opts.wording = fix_wording::pytorch;
    try {
      pa.result = analyze(r, rank_opts);
    } catch (const input_error& e) {
      s.notes.push_back(fmt::format("{}: not analyzed: {}", pa.name, e.what()));
      continue;
    }
    add_workers(t, ps.key, r, pa);
    s.ranks.push_back(std::move(pa));
  }
  find_straggler(s);
  recording_cost(t, s);
  return s;
}

void find_straggler(session_analysis& s) {
  if (s.ranks.size() >= 2) {
    const auto slowest = std::max_element(s.ranks.begin(), s.ranks.end(), [](const auto& a, const auto& b) {
      return a.result.mean.compute_ms < b.result.mean.compute_ms;
    });
    const auto fastest = std::min_element(s.ranks.begin(), s.ranks.end(), [](const auto& a, const auto& b) {
      return a.result.mean.compute_ms < b.result.mean.compute_ms;
    });
    if (fastest->result.mean.compute_ms > 0) {
      s.straggler = slowest->name;
      s.straggler_excess = slowest->result.mean.compute_ms / fastest->result.mean.compute_ms - 1.0;
    }
  }
}

std::string format_text(const session_analysis& s) {
  std::string out;
  if (!s.processes.empty()) {
    out = fmt::format("Recording of {} process{}", s.processes.size(), s.processes.size() == 1 ? "" : "es");
    if (s.launcher_cpu_cores >= 0)
      out += fmt::format(" (the launcher used {:.1f}% of one core)", s.launcher_cpu_cores * 100);
    out += ":\n";
  }
  std::map<std::uint64_t, int> depth;
  for (const process_summary& p : s.processes) {
    const int d = depth.contains(p.parent) ? depth[p.parent] + 1 : 0;
    depth[p.key] = d;
    out +=
        fmt::format("  {}{} [{}] {}{}, {} event{}{}, {}\n", std::string(static_cast<std::size_t>(d) * 2, ' '),
                    p.name, p.pid, p.started, p.gpu ? ", GPU" : "", p.events, p.events == 1 ? "" : "s",
                    p.cpu_cores >= 0 ? fmt::format(", {:.2f} cores", p.cpu_cores) : "", p.ended);
  }
  for (const std::string& n : s.notes) out += "  note: " + n + "\n";
  if (s.recording_cost > -1)
    out += fmt::format(
        "Recording cost: median step {:.2f} ms before the capture, {:.2f} ms during it ({:+.1f}%; the steps "
        "before ran injected but uncaptured: this is the capture's own cost){}\n",
        s.steps_before_ms, s.steps_during_ms, s.recording_cost * 100,
        s.recording_cost > 0.05 ? ": above 5%; --lite records kernels and copies only" : "");
  if (s.ranks.empty()) out += "No process has GPU activity: nothing to analyze per step.\n";
  if (s.ranks.size() >= 2) {
    out += "\nPer rank (mean step, ms):\n";
    out += fmt::format("  {:<40} {:>9} {:>9} {:>8} {:>8}  {}\n", "rank", "wall", "compute", "comm", "idle",
                       "first finding");
    for (const process_analysis& pa : s.ranks) {
      const step_breakdown& m = pa.result.mean;
      out += fmt::format("  {:<40} {:>9.2f} {:>9.2f} {:>8.2f} {:>8.2f}  {}\n", pa.name.substr(0, 40),
                         m.wall_ms, m.compute_ms, m.comm_ms, m.idle_ms, pa.result.findings.front().rule);
    }
  }
  for (const process_analysis& pa : s.ranks) {
    out += fmt::format("\n=== {}\n", pa.name);
    if (!pa.workers.empty()) {
      out += "Its worker processes while the GPU idled:";
      for (const worker_activity& w : pa.workers)
        out += fmt::format(" {} {:.2f} cores;", w.process, w.cpu_cores);
      out.back() = '\n';
    }
    out += format_text(pa.result);
  }
  if (!s.straggler.empty())
    out += fmt::format(
        "\nStraggler: {} computes {:.1f}% longer per step than the fastest rank; the others wait for "
        "it in their collectives\n",
        s.straggler, s.straggler_excess * 100);
  return out;
}

std::string to_json(const session_analysis& s) {
  nlohmann::json j;
  j["processes"] = nlohmann::json::array();
  for (const process_summary& p : s.processes)
    j["processes"].push_back({{"key", p.key},
                              {"pid", p.pid},
                              {"parent", p.parent},
                              {"name", p.name},
                              {"command", p.command},
                              {"started", p.started},
                              {"ended", p.ended},
                              {"gpu", p.gpu},
                              {"events", p.events},
                              {"cpu_cores", p.cpu_cores},
                              {"notes", p.notes}});
  j["ranks"] = nlohmann::json::array();
  for (const process_analysis& pa : s.ranks) {
    nlohmann::json w = nlohmann::json::array();
    for (const worker_activity& x : pa.workers)
      w.push_back({{"process", x.process}, {"cpu_cores", x.cpu_cores}, {"busy_fraction", x.busy_fraction}});
    j["ranks"].push_back({{"key", pa.key},
                          {"name", pa.name},
                          {"workers", w},
                          {"workers_cpu_cores", pa.workers_cores},
                          {"analysis", nlohmann::json::parse(to_json(pa.result))}});
  }
  j["straggler"] = s.straggler;
  j["straggler_excess"] = s.straggler_excess;
  j["launcher_cpu_cores"] = s.launcher_cpu_cores;
  j["steps_before"] = s.steps_before;
  j["steps_during"] = s.steps_during;
  j["steps_before_ms"] = s.steps_before_ms;
  j["steps_during_ms"] = s.steps_during_ms;
  j["recording_cost"] = s.recording_cost;
  j["notes"] = s.notes;
  return j.dump(2);
}

}  // namespace ferry::trace
