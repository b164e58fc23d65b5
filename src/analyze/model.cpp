// The model's index of a timeline: which events are GPU and CPU activity, where the steps are, the GPU's
// unions per category, and the segmentation of each CPU thread. The breakdown and idle attribution built on
// them are in breakdown.cpp.
#include "model.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <map>
#include <tuple>

#include "ferry/core/error.hpp"
#include "ferry/trace/names.hpp"

namespace ferry::trace::detail {

namespace {

category category_of(const event& e, std::string_view name) {
  if (e.kind == activity::kernel) return is_comm_kernel(name) ? cat_comm : cat_compute;
  if (e.kind == activity::memset) return cat_d2d;
  switch (e.copy) {
    case copy_kind::p2p: return cat_comm;
    case copy_kind::h2d: return cat_h2d;
    case copy_kind::d2h: return cat_d2h;
    default: return cat_d2d;  // d2d, and the rare h2h or unknown copy the GPU timeline shows
  }
}

// CPU activity. A range on a GPU track (a profiler's GPU-side annotation: a device but no thread) is not.
bool is_cpu(const event& e) {
  switch (e.kind) {
    case activity::api:
    case activity::sync:
    case activity::stage: return true;
    case activity::range: return !(e.device >= 0 && e.thread == 0);
    default: return false;
  }
}

bool is_span(const event& e) { return (e.kind == activity::range || e.kind == activity::stage) && is_cpu(e); }

bool is_blocking(sync_kind k) {
  return k == sync_kind::event || k == sync_kind::stream || k == sync_kind::device || k == sync_kind::copy;
}

// The wording of the fixes: the one asked for, else from the trace's origin; a `ferry trace` recording
// of a Python program (its automatic annotation's domain, "ferry.python", is in it) is PyTorch's.
fix_wording wording_of(const timeline& t, fix_wording asked) {
  if (asked != fix_wording::automatic) return asked;
  for (std::uint32_t id = 1; id < t.strings.size(); ++id)
    if (t.strings[id] == "ferry.python") return fix_wording::pytorch;
  return wording_for(t.source);
}

}  // namespace

bool is_wait(const event& e) {
  return (e.kind == activity::sync || e.kind == activity::api) && is_blocking(e.sync);
}

model::model(const timeline& t, const analyze_options& opts)
    : t_(t), opts_(opts), pytorch_(wording_of(t, opts.wording) == fix_wording::pytorch) {
  check_options();
  classify();
  detect_steps();
  build_unions();
  breakdown();
  attribute_idle();
  find_uncovered_idle();
}

void model::check_options() const {
  FERRY_EXPECTS(opts_.idle_threshold >= 0 && opts_.idle_threshold < 1,
                fmt::format("idle_threshold {} is outside [0, 1)", opts_.idle_threshold));
  FERRY_EXPECTS(opts_.low_bandwidth_fraction > 0 && opts_.low_bandwidth_fraction <= 1,
                fmt::format("low_bandwidth_fraction {} is outside (0, 1]", opts_.low_bandwidth_fraction));
  FERRY_EXPECTS(opts_.link_h2d_gbps >= 0 && opts_.link_d2h_gbps >= 0,
                fmt::format("link ceilings must not be negative (h2d {} GB/s, d2h {} GB/s)",
                            opts_.link_h2d_gbps, opts_.link_d2h_gbps));
}

void model::classify() {
  out_.source = t_.source;
  out_.device_name = t_.device_name;
  out_.dropped = t_.dropped;
  constexpr std::size_t max_events = std::numeric_limits<index_t>::max();
  if (t_.events.size() > max_events)
    throw input_error(fmt::format("the timeline holds {} events, more than the analyzer's limit of {}",
                                  t_.events.size(), max_events));
  std::size_t gpu_count = 0, cpu_count = 0;
  for (const event& e : t_.events) {
    gpu_count += e.on_gpu();
    cpu_count += !e.on_gpu() && is_cpu(e);
  }
  gpu_.reserve(gpu_count);
  cpu_.reserve(cpu_count);
  for (std::size_t i = 0; i < t_.events.size(); ++i) {
    const event& e = t_.events[i];
    if (e.on_gpu()) {
      gpu_.push_back(static_cast<index_t>(i));
    } else if (is_cpu(e)) {
      cpu_.push_back(static_cast<index_t>(i));
    }
  }
  // A sorted timeline (timeline::sort) is in this order already but for equal starts.
  const auto by_start = [this](index_t a, index_t b) {
    const event& x = t_.events[a];
    const event& y = t_.events[b];
    return std::tie(x.start_ns, x.end_ns, a) < std::tie(y.start_ns, y.end_ns, b);
  };
  if (!std::is_sorted(gpu_.begin(), gpu_.end(), by_start)) std::sort(gpu_.begin(), gpu_.end(), by_start);
  if (!std::is_sorted(cpu_.begin(), cpu_.end(), by_start)) std::sort(cpu_.begin(), cpu_.end(), by_start);
  if (gpu_.empty()) {
    std::size_t api = 0, sync = 0, spans = 0;
    for (const event& e : t_.events) {
      api += e.kind == activity::api;
      sync += e.kind == activity::sync;
      spans += e.kind == activity::range || e.kind == activity::stage;
    }
    throw input_error(fmt::format(
        "the timeline{} has no GPU activity (no kernel, copy or memset): it holds {} events ({} API calls, "
        "{} syncs, {} ranges or stage spans); record with the cuda backend's CUPTI recorder or a profiler "
        "that captures CUDA activity",
        t_.source.empty() ? "" : fmt::format(" from {}", t_.source), t_.events.size(), api, sync, spans));
  }
}

std::string model::thread_name(std::uint64_t thread) const {
  if (auto it = t_.thread_names.find(thread); it != t_.thread_names.end() && !it->second.empty())
    return it->second;
  return fmt::format("thread {}", thread);
}

std::string model::stream_name(std::uint64_t stream) const {
  if (auto it = t_.stream_names.find(stream); it != t_.stream_names.end() && !it->second.empty())
    return fmt::format("stream {} ('{}')", stream, it->second);
  return fmt::format("stream {}", stream);
}

void model::detect_steps() {
  step_matcher m;
  if (!opts_.step_prefix.empty()) {
    m.prefix = opts_.step_prefix;
  } else {
    m.prefix = "ProfilerStep#";
    const bool profiler = std::any_of(cpu_.begin(), cpu_.end(), [&](std::size_t i) {
      return is_span(t_.events[i]) && name(t_.events[i]).starts_with(m.prefix);
    });
    if (!profiler) {
      m.prefix = "step";
      m.ferry_default = true;
    }
  }
  matcher_ = m;
  std::vector<step_span> found;
  for (const index_t i : cpu_) {
    const event& e = t_.events[i];
    if (is_span(e) && e.end_ns > e.start_ns && m(name(e))) found.push_back({e.start_ns, e.end_ns, e.thread});
  }
  // Sorted by start; a span that starts inside the previous step (a nested or duplicate span) is not a step.
  for (const step_span& s : found) {
    if (!steps_.empty() && s.start < steps_.back().end) continue;
    steps_.push_back(s);
  }
  if (!steps_.empty()) {
    place_steps_on_gpu();
    out_.step_prefix = m.prefix;
  } else {
    ns_t first = std::numeric_limits<ns_t>::max(), last = std::numeric_limits<ns_t>::min();
    for (const index_t i : gpu_) {
      first = std::min(first, t_.events[i].start_ns);
      last = std::max(last, t_.events[i].end_ns);
    }
    steps_.push_back({first, std::max(last, first + 1), 0});
    whole_trace_ = true;
  }
  pick_main_thread();
}

// The CPU spans become windows that tile the timeline, so GPU work the CPU queued ahead (it runs after
// the span that launched it ended) still falls in a step. A step's GPU work is what its span launched
// (known through correlation ids); step k starts on the GPU with the first of its work that does not start
// before step k - 1 started there, and ends where step k + 1 starts. Work that starts earlier ran ahead of
// the steps before it: a copy of the next batch on its own stream while the CPU is several steps ahead,
// which runs at once while the step's kernels wait behind those of the steps launched before. Before the
// first step, the work launched before it stands for the steps before: the GPU work whose call came
// before the first span, and work whose call is not in the trace (launched before recording began) that
// ran on a stream before the first step's work on it. The first step starts with its first work that does
// not start before the first of those; when the trace holds none of them, it starts with its first work,
// ahead or not (nothing recorded says the GPU was busy before). A step with no such work starts with its
// span. The last step ends
// when the GPU work launched in it ended (without correlation ids, the trace's last GPU activity), or
// with its span if that is later.
void model::place_steps_on_gpu() {
  const std::size_t n = steps_.size();
  // Correlation id -> the start of the API call that launched it (the earliest, should one repeat).
  std::vector<std::pair<std::uint64_t, ns_t>> launches;
  for (const index_t i : cpu_) {
    const event& e = t_.events[i];
    if (e.kind == activity::api && e.correlation != 0) launches.emplace_back(e.correlation, e.start_ns);
  }
  std::sort(launches.begin(), launches.end());
  constexpr ns_t no_launch = std::numeric_limits<ns_t>::min();
  const auto launch_of = [&](const event& g) {
    if (g.correlation == 0) return no_launch;
    const auto it = std::lower_bound(launches.begin(), launches.end(),
                                     std::pair<std::uint64_t, ns_t>(g.correlation, no_launch));
    return it != launches.end() && it->first == g.correlation ? it->second : no_launch;
  };
  // The step whose span holds a launch, or -1.
  const auto span_of = [&](ns_t at) {
    auto s =
        std::partition_point(steps_.begin(), steps_.end(), [at](const step_span& x) { return x.end <= at; });
    return s == steps_.end() || at < s->start ? -1 : static_cast<int>(s - steps_.begin());
  };
  constexpr ns_t none = std::numeric_limits<ns_t>::min();
  std::vector<std::pair<index_t, ns_t>> work;  // (step, start) of the GPU work launched in a span
  std::map<std::pair<std::int32_t, std::uint64_t>, ns_t> first_on_stream;  // of the first step's work
  constexpr ns_t later = std::numeric_limits<ns_t>::max();
  ns_t before_first = later;  // the first start of the work launched before the first step
  ns_t last_end = std::numeric_limits<ns_t>::min();
  for (const index_t i : gpu_) {
    const event& g = t_.events[i];
    const ns_t at = launch_of(g);
    if (at == no_launch) continue;
    if (at < steps_.front().start) {
      before_first = std::min(before_first, g.start_ns);
      continue;
    }
    const int k = span_of(at);
    if (k < 0) continue;
    work.emplace_back(static_cast<index_t>(k), g.start_ns);
    if (g.kind == activity::memcpy) copy_steps_.emplace_back(i, static_cast<index_t>(k));
    if (k == 0) first_on_stream.try_emplace({g.device, g.stream}, g.start_ns);  // gpu_ is by start
    if (static_cast<std::size_t>(k) + 1 == n) last_end = std::max(last_end, g.end_ns);
  }
  const bool mapped = !work.empty();
  if (mapped) {
    for (const index_t i : gpu_) {
      const event& g = t_.events[i];
      if (launch_of(g) != no_launch) continue;
      const auto f = first_on_stream.find({g.device, g.stream});
      if (f != first_on_stream.end() && g.start_ns < f->second)
        before_first = std::min(before_first, g.start_ns);
    }
  } else {
    for (const index_t i : gpu_) last_end = std::max(last_end, t_.events[i].end_ns);
  }
  std::sort(work.begin(), work.end());
  std::sort(copy_steps_.begin(), copy_steps_.end());
  std::vector<ns_t> starts(n);
  for (std::size_t k = 0; k < n; ++k) {
    const ns_t after = k > 0 ? starts[k - 1] : before_first != later ? before_first : none;
    // The first start of step k's work that is not before `after`.
    const auto w =
        std::lower_bound(work.begin(), work.end(), std::pair<index_t, ns_t>(static_cast<index_t>(k), after));
    starts[k] = w != work.end() && w->first == k ? std::max(w->second, steps_[k].start) : steps_[k].start;
    if (k > 0) starts[k] = std::max(starts[k], starts[k - 1]);
  }
  const ns_t end = std::max({steps_.back().end, last_end, starts.back()});
  for (std::size_t k = 0; k < n; ++k) {
    steps_[k].start = starts[k];
    steps_[k].end = k + 1 < n ? starts[k + 1] : end;
  }
}

int model::launch_step(index_t i) const {
  const auto it = std::lower_bound(copy_steps_.begin(), copy_steps_.end(), std::pair<index_t, index_t>(i, 0));
  return it != copy_steps_.end() && it->first == i ? static_cast<int>(it->second) : -1;
}

int model::step_of(ns_t t) const {
  auto it =
      std::partition_point(steps_.begin(), steps_.end(), [t](const step_span& s) { return s.end <= t; });
  if (it == steps_.end() || t < it->start) return -1;
  return static_cast<int>(it - steps_.begin());
}

ns_t model::idle_during(std::vector<span> windows) const {
  const interval_union u(std::move(windows));
  ns_t idle = 0;
  for (const span& w : u.spans()) {
    auto s = std::partition_point(steps_.begin(), steps_.end(),
                                  [&](const step_span& x) { return x.end <= w.start; });
    for (; s != steps_.end() && s->start < w.end; ++s)
      idle += busy().gaps(std::max(w.start, s->start), std::min(w.end, s->end));
  }
  return idle;
}

// gpu_ is sorted by start, so the unions are built as the events go by, with no copy of their spans.
void model::build_unions() {
  std::size_t kernel_count = 0;
  for (const index_t i : gpu_) {
    const event& e = t_.events[i];
    kernel_count += e.kind == activity::kernel;
    if (category_of(e, name(e)) == cat_comm) comm_events_.push_back(i);
  }
  kernels_are_busy_ = kernel_count == gpu_.size();
  const bool has_comm = !comm_events_.empty();
  interval_union::sorted_builder busy(gpu_.size());
  interval_union::sorted_builder kernels(kernels_are_busy_ ? 0 : kernel_count);
  interval_union::sorted_builder compute(has_comm ? kernel_count : 0);
  interval_union::sorted_builder comm(comm_events_.size());
  auto next_comm = comm_events_.begin();
  for (const index_t i : gpu_) {
    const event& e = t_.events[i];
    busy.add(e.start_ns, e.end_ns);
    if (!kernels_are_busy_ && e.kind == activity::kernel) kernels.add(e.start_ns, e.end_ns);
    if (!has_comm) continue;
    if (next_comm != comm_events_.end() && *next_comm == i) {
      ++next_comm;
      comm.add(e.start_ns, e.end_ns);
    } else if (e.kind == activity::kernel) {
      compute.add(e.start_ns, e.end_ns);
    }
  }
  busy_ = std::move(busy).finish();
  if (!kernels_are_busy_) kernels_ = std::move(kernels).finish();
  if (has_comm) {
    compute_ = std::move(compute).finish();
    comm_ = std::move(comm).finish();
  }
}

// The time of each step covered by the GPU categories 0..c, for every c (cat_count cumulative levels). One
// pass over the GPU events in start order keeps each level's current run of overlapping events; a run
// that ends is added to the steps it overlaps. Steps are sorted and disjoint, and so are each level's
// runs, so a cursor per level finds the steps.
std::vector<std::array<ns_t, cat_count>> model::level_coverage() const {
  std::vector<std::array<ns_t, cat_count>> cov(steps_.size(), std::array<ns_t, cat_count>{});
  struct run {
    ns_t start = 0;
    ns_t end = 0;
    bool open = false;
    std::size_t step = 0;  // the first step that may overlap this run or a later one
  };
  std::array<run, cat_count> runs{};
  const auto close = [&](std::size_t c) {
    run& r = runs[c];
    while (r.step < steps_.size() && steps_[r.step].end <= r.start) ++r.step;
    for (std::size_t k = r.step; k < steps_.size() && steps_[k].start < r.end; ++k)
      cov[k][c] += std::min(r.end, steps_[k].end) - std::max(r.start, steps_[k].start);
  };
  for (const index_t i : gpu_) {
    const event& e = t_.events[i];
    if (e.end_ns <= e.start_ns) continue;
    for (std::size_t c = category_of(e, name(e)); c < cat_count; ++c) {
      run& r = runs[c];
      if (r.open && e.start_ns <= r.end) {
        r.end = std::max(r.end, e.end_ns);
        continue;
      }
      if (r.open) close(c);
      r.start = e.start_ns;
      r.end = e.end_ns;
      r.open = true;
    }
  }
  for (std::size_t c = 0; c < cat_count; ++c)
    if (runs[c].open) close(c);
  return cov;
}

double model::link_gbps(copy_kind k) const {
  if (k == copy_kind::h2d) return opts_.link_h2d_gbps > 0 ? opts_.link_h2d_gbps : t_.link_h2d_gbps;
  if (k == copy_kind::d2h) return opts_.link_d2h_gbps > 0 ? opts_.link_d2h_gbps : t_.link_d2h_gbps;
  return 0;
}

std::uint64_t model::label_of(const event& e) const {
  std::uint64_t label = e.name != 0 ? e.name : synthetic_bit | static_cast<std::uint64_t>(e.sync);
  if (is_wait(e)) label |= blocking_bit;
  return label;
}

std::string model::label_text(std::uint64_t label) const {
  const std::uint64_t id = label & ~blocking_bit;
  if ((id & synthetic_bit) != 0) {
    const auto k = static_cast<sync_kind>(id & ~synthetic_bit);
    return k == sync_kind::none ? std::string("unnamed activity")
                                : fmt::format("{} synchronize", to_string(k));
  }
  return std::string(t_.strings[static_cast<std::uint32_t>(id)]);
}

// Step spans and ferry's "bench level" span cover everything; a profiler's operator ranges (PyTorch's
// cpu_op, domain "pytorch.op") sit under the annotations that say what the code was doing.
bool model::excluded_activity(const event& e) const {
  if (e.kind != activity::range && e.kind != activity::stage) return false;
  if (e.domain != 0 && t_.domain_of(e) == "pytorch.op") return true;
  const std::string_view n = name(e);
  return n == "bench level" || matcher_(n);
}

segment_walker::segment_walker(const model& m, std::span<const index_t> evs)
    : m_(m), events_(m.trace().events), evs_(evs) {
  if (!evs_.empty()) t_ = events_[evs_[0]].start_ns;
}

// The innermost activity is the one that started last (on equal starts, the one that ends first).
bool segment_walker::next_piece(segment& out) {
  const auto outer = [this](index_t a, index_t b) {  // true when a is outside b: the heap's order
    const event& x = events_[a];
    const event& y = events_[b];
    if (x.start_ns != y.start_ns) return x.start_ns < y.start_ns;
    if (x.end_ns != y.end_ns) return x.end_ns > y.end_ns;
    return a < b;
  };
  while (true) {
    while (i_ < evs_.size() && events_[evs_[i_]].start_ns <= t_) {
      active_.push_back(evs_[i_++]);
      std::push_heap(active_.begin(), active_.end(), outer);
    }
    while (!active_.empty() && events_[active_.front()].end_ns <= t_) {
      std::pop_heap(active_.begin(), active_.end(), outer);
      active_.pop_back();
    }
    if (active_.empty()) {
      if (i_ == evs_.size()) return false;
      t_ = events_[evs_[i_]].start_ns;
      continue;
    }
    const event& top = events_[active_.front()];
    ns_t next = top.end_ns;
    if (i_ < evs_.size()) next = std::min(next, events_[evs_[i_]].start_ns);
    out = {t_, next, m_.label_of(top)};
    t_ = next;
    return true;
  }
}

bool segment_walker::next(segment& out) {
  segment piece{};
  while (next_piece(piece)) {
    if (!has_pending_) {
      pending_ = piece;
      has_pending_ = true;
    } else if (pending_.end == piece.start && pending_.label == piece.label) {
      pending_.end = piece.end;
    } else {
      out = pending_;
      pending_ = piece;
      return true;
    }
  }
  if (!has_pending_) return false;
  out = pending_;
  has_pending_ = false;
  return true;
}

}  // namespace ferry::trace::detail
