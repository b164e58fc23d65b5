// The analyzer. Everything is interval arithmetic on one clock: the GPU's activity is merged into
// sorted, disjoint unions (one per cumulative category, with prefix sums, so the covered length of any
// window costs O(log n)); each CPU thread's activity becomes a sorted segmentation labelled with its
// innermost activity. Steps, idle gaps and rules are then queries against those, O(n log n) in all.
#include "ferry/analyze/analyze.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <queue>
#include <set>
#include <string_view>
#include <tuple>
#include <unordered_map>
#include <utility>

#include "ferry/core/error.hpp"
#include "ferry/core/units.hpp"

namespace ferry::trace {

namespace {

using ns_t = std::int64_t;

constexpr double ns_per_ms = 1e6;
constexpr std::uint64_t big_copy_bytes = std::uint64_t{1} << 20;  // the bandwidth rule's smallest copy
// A wait that ends this soon after a copy ended waited for that copy: max(1 ms, 5% of the copy). A GPU
// wakes a waiting thread within tens of microseconds, but a loaded host (and the host backend's threads)
// can take a millisecond; a copy followed by an unrelated wait that soon is rare enough.
constexpr ns_t wait_slack_ns = 1'000'000;
constexpr double wait_slack_fraction = 0.05;
// Without a known link, a pinned copy is assumed to take a quarter of a pageable one's time: staged
// pageable copies typically reach 1/4 to 1/8 of the pinned link (7 vs 55 GB/s on an H200), so 3/4 of
// the copy time is a conservative estimate of what pinning saves.
constexpr double pageable_saving_without_link = 0.75;
// A finding below this fraction of the mean step does not bound the workload; when every finding is
// below it, compute_bound leads.
constexpr double material_fraction = 0.05;
constexpr double serialized_overlap_limit = 0.10;
constexpr double serialized_step_fraction = 0.05;

double ms(ns_t ns) { return static_cast<double>(ns) / ns_per_ms; }
double ms(double ns) { return ns / ns_per_ms; }

struct span {
  ns_t start = 0;
  ns_t end = 0;
};

/// Sorted, disjoint intervals with prefix sums of their lengths.
class interval_union {
 public:
  interval_union() = default;
  explicit interval_union(std::vector<span> spans) {
    std::sort(spans.begin(), spans.end(),
              [](const span& a, const span& b) { return a.start != b.start ? a.start < b.start : a.end < b.end; });
    for (const span& s : spans) {
      if (s.end <= s.start) continue;
      if (!spans_.empty() && s.start <= spans_.back().end) {
        spans_.back().end = std::max(spans_.back().end, s.end);
      } else {
        spans_.push_back(s);
      }
    }
    prefix_.reserve(spans_.size() + 1);
    for (const span& s : spans_) prefix_.push_back(prefix_.back() + (s.end - s.start));
  }

  /// Covered length of [a, b).
  [[nodiscard]] ns_t covered(ns_t a, ns_t b) const { return b <= a ? 0 : before(b) - before(a); }
  /// Uncovered length of [a, b).
  [[nodiscard]] ns_t gaps(ns_t a, ns_t b) const { return b <= a ? 0 : (b - a) - covered(a, b); }

  /// Calls f(gap) for every uncovered part of [a, b), in order.
  template <class F>
  void for_each_gap(ns_t a, ns_t b, F&& f) const {
    auto it = std::partition_point(spans_.begin(), spans_.end(), [a](const span& s) { return s.end <= a; });
    ns_t cur = a;
    for (; it != spans_.end() && it->start < b; ++it) {
      if (it->start > cur) f(span{cur, it->start});
      cur = std::max(cur, it->end);
    }
    if (cur < b) f(span{cur, b});
  }

  [[nodiscard]] bool empty() const noexcept { return spans_.empty(); }
  [[nodiscard]] ns_t first() const { return spans_.front().start; }
  [[nodiscard]] ns_t last() const { return spans_.back().end; }

 private:
  // Covered length of (-inf, t).
  [[nodiscard]] ns_t before(ns_t t) const {
    const auto i = static_cast<std::size_t>(
        std::partition_point(spans_.begin(), spans_.end(), [t](const span& s) { return s.start < t; }) -
        spans_.begin());
    ns_t total = prefix_[i];
    if (i > 0 && spans_[i - 1].end > t) total -= spans_[i - 1].end - t;
    return total;
  }

  std::vector<span> spans_;
  std::vector<ns_t> prefix_{0};
};

// Exclusive GPU categories, in priority order.
enum category : std::size_t { cat_compute, cat_comm, cat_d2d, cat_h2d, cat_d2h, cat_count };

bool contains(std::string_view text, std::string_view word) { return text.find(word) != std::string_view::npos; }

bool is_comm_kernel(std::string_view name) {
  return contains(name, "nccl") || contains(name, "Nccl") || contains(name, "NCCL");
}

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

bool is_wait(const event& e) { return (e.kind == activity::sync || e.kind == activity::api) && is_blocking(e.sync); }

bool pageable_side(const event& c) {
  return (c.copy == copy_kind::h2d && c.src == mem_kind::pageable) ||
         (c.copy == copy_kind::d2h && c.dst == mem_kind::pageable);
}

std::string lower(std::string_view text) {
  std::string out(text);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// What a CPU activity's name says it does, for choosing a fix: making input, or handling output.
constexpr std::array<std::string_view, 5> data_words{"make", "load", "batch", "sample", "collate"};
constexpr std::array<std::string_view, 5> output_words{"process", "output", "write", "save", "post"};

template <std::size_t N>
bool mentions_any(std::string_view activity, const std::array<std::string_view, N>& words) {
  const std::string n = lower(activity);
  return std::any_of(words.begin(), words.end(), [&](std::string_view w) { return contains(n, w); });
}

std::string pct(double fraction) { return fmt::format("{:.0f}%", fraction * 100.0); }
std::string ms_text(double v) { return fmt::format("{:.2f} ms", v); }
std::string upper_dir(copy_kind k) { return k == copy_kind::h2d ? "H2D" : k == copy_kind::d2h ? "D2H" : "copy"; }
std::string count_text(double per_step) {
  return std::abs(per_step - std::round(per_step)) < 1e-9 ? fmt::format("{:.0f}", per_step)
                                                           : fmt::format("{:.1f}", per_step);
}

// Step-span matching.
struct step_matcher {
  std::string prefix;
  bool ferry_default = false;  // "step" exactly or "step ..." (not "step_x")
  [[nodiscard]] bool operator()(std::string_view name) const {
    if (ferry_default) return name == "step" || name.starts_with("step ");
    return !prefix.empty() && name.starts_with(prefix);
  }
};

struct step_span {
  ns_t start = 0;
  ns_t end = 0;
  std::uint64_t thread = 0;
};

// Orders findings: costliest first; on a tie, the rule that names the more direct cause.
int rule_rank(std::string_view rule) {
  static constexpr std::array<std::string_view, 8> order{"compute_bound",   "gpu_idle",         "sync_copy",
                                                         "pageable_async_copy", "device_sync", "serialized_copy",
                                                         "low_copy_bandwidth", "drain_tail"};
  for (std::size_t i = 0; i < order.size(); ++i)
    if (order[i] == rule) return static_cast<int>(i);
  return static_cast<int>(order.size());
}

class analyzer {
 public:
  analyzer(const timeline& t, const analyze_options& opts) : t_(t), opts_(opts) {}

  analysis run() {
    check_options();
    classify();
    detect_steps();
    build_unions();
    breakdown();
    attribute_idle();
    rule_gpu_idle();
    rule_pageable_async_copy();
    rule_sync_copy();
    rule_device_sync();
    rule_serialized_copy();
    rule_low_copy_bandwidth(copy_kind::h2d);
    rule_low_copy_bandwidth(copy_kind::d2h);
    rule_drain_tail();
    order_findings();
    return std::move(out_);
  }

 private:
  void check_options() const {
    FERRY_EXPECTS(opts_.idle_threshold >= 0 && opts_.idle_threshold < 1,
                  fmt::format("idle_threshold {} is outside [0, 1)", opts_.idle_threshold));
    FERRY_EXPECTS(opts_.low_bandwidth_fraction > 0 && opts_.low_bandwidth_fraction <= 1,
                  fmt::format("low_bandwidth_fraction {} is outside (0, 1]", opts_.low_bandwidth_fraction));
    FERRY_EXPECTS(opts_.link_h2d_gbps >= 0 && opts_.link_d2h_gbps >= 0,
                  fmt::format("link ceilings must not be negative (h2d {} GB/s, d2h {} GB/s)", opts_.link_h2d_gbps,
                              opts_.link_d2h_gbps));
  }

  std::string_view name(const event& e) const { return t_.name_of(e); }

  void classify() {
    out_.source = t_.source;
    out_.device_name = t_.device_name;
    out_.dropped = t_.dropped;
    for (std::size_t i = 0; i < t_.events.size(); ++i) {
      const event& e = t_.events[i];
      if (e.on_gpu()) {
        gpu_.push_back(i);
      } else if (is_cpu(e)) {
        cpu_.push_back(i);
      }
    }
    const auto by_start = [this](std::size_t a, std::size_t b) {
      const event& x = t_.events[a];
      const event& y = t_.events[b];
      return std::tie(x.start_ns, x.end_ns, a) < std::tie(y.start_ns, y.end_ns, b);
    };
    std::sort(gpu_.begin(), gpu_.end(), by_start);
    std::sort(cpu_.begin(), cpu_.end(), by_start);
    if (gpu_.empty()) {
      std::size_t api = 0, sync = 0, spans = 0;
      for (const event& e : t_.events) {
        api += e.kind == activity::api;
        sync += e.kind == activity::sync;
        spans += e.kind == activity::range || e.kind == activity::stage;
      }
      throw input_error(fmt::format(
          "the timeline{} has no GPU activity (no kernel, copy or memset): it holds {} events ({} API calls, {} "
          "syncs, {} ranges or stage spans); record with the cuda backend's CUPTI recorder or a profiler that "
          "captures CUDA activity",
          t_.source.empty() ? "" : fmt::format(" from {}", t_.source), t_.events.size(), api, sync, spans));
    }
  }

  std::string thread_name(std::uint64_t thread) const {
    if (auto it = t_.thread_names.find(thread); it != t_.thread_names.end() && !it->second.empty()) return it->second;
    return fmt::format("thread {}", thread);
  }

  std::string stream_name(std::uint64_t stream) const {
    if (auto it = t_.stream_names.find(stream); it != t_.stream_names.end() && !it->second.empty())
      return fmt::format("stream {} ('{}')", stream, it->second);
    return fmt::format("stream {}", stream);
  }

  void detect_steps() {
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
    for (std::size_t i : cpu_) {
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
      std::map<std::uint64_t, std::size_t> per_thread;
      for (const step_span& s : steps_) ++per_thread[s.thread];
      main_thread_ = std::max_element(per_thread.begin(), per_thread.end(), [](const auto& a, const auto& b) {
                       return a.second < b.second;
                     })->first;
    } else {
      ns_t first = std::numeric_limits<ns_t>::max(), last = std::numeric_limits<ns_t>::min();
      for (std::size_t i : gpu_) {
        first = std::min(first, t_.events[i].start_ns);
        last = std::max(last, t_.events[i].end_ns);
      }
      steps_.push_back({first, std::max(last, first + 1), 0});
      whole_trace_ = true;
      std::map<std::uint64_t, std::size_t> api_per_thread;
      for (std::size_t i : cpu_)
        if (t_.events[i].kind == activity::api) ++api_per_thread[t_.events[i].thread];
      if (!api_per_thread.empty())
        main_thread_ = std::max_element(api_per_thread.begin(), api_per_thread.end(), [](const auto& a, const auto& b) {
                         return a.second < b.second;
                       })->first;
    }
    if (main_thread_) out_.main_thread = thread_name(*main_thread_);
  }

  // The CPU spans become windows that tile the timeline, so GPU work the CPU queued ahead (it runs after
  // the span that launched it ended) still falls in a step: step k runs from the start of the first GPU
  // work launched inside span k (known through correlation ids; else the span's start) to the start of
  // step k + 1; the last step ends when the GPU work launched in it ended (without correlation ids, the
  // trace's last GPU activity), or with its span if that is later.
  void place_steps_on_gpu() {
    const std::size_t n = steps_.size();
    std::unordered_map<std::uint64_t, ns_t> launch_at;  // correlation id -> API call start
    for (std::size_t i : cpu_) {
      const event& e = t_.events[i];
      if (e.kind == activity::api && e.correlation != 0) launch_at.emplace(e.correlation, e.start_ns);
    }
    constexpr ns_t none = std::numeric_limits<ns_t>::max();
    std::vector<ns_t> first_gpu(n, none);
    ns_t last_end = std::numeric_limits<ns_t>::min();
    bool mapped = false;
    for (std::size_t i : gpu_) {
      const event& g = t_.events[i];
      const auto it = g.correlation != 0 ? launch_at.find(g.correlation) : launch_at.end();
      if (it == launch_at.end()) continue;
      const ns_t at = it->second;
      auto s = std::partition_point(steps_.begin(), steps_.end(), [at](const step_span& x) { return x.end <= at; });
      if (s == steps_.end() || at < s->start) continue;
      const auto k = static_cast<std::size_t>(s - steps_.begin());
      mapped = true;
      first_gpu[k] = std::min(first_gpu[k], g.start_ns);
      if (k + 1 == n) last_end = std::max(last_end, g.end_ns);
    }
    if (!mapped)
      for (std::size_t i : gpu_) last_end = std::max(last_end, t_.events[i].end_ns);
    std::vector<ns_t> starts(n);
    for (std::size_t k = 0; k < n; ++k) {
      starts[k] = first_gpu[k] != none ? std::max(first_gpu[k], steps_[k].start) : steps_[k].start;
      if (k > 0) starts[k] = std::max(starts[k], starts[k - 1]);
    }
    const ns_t end = std::max({steps_.back().end, last_end, starts.back()});
    for (std::size_t k = 0; k < n; ++k) {
      steps_[k].start = starts[k];
      steps_[k].end = k + 1 < n ? starts[k + 1] : end;
    }
  }

  // The step holding time t (by start), or -1.
  int step_of(ns_t t) const {
    auto it = std::partition_point(steps_.begin(), steps_.end(), [t](const step_span& s) { return s.end <= t; });
    if (it == steps_.end() || t < it->start) return -1;
    return static_cast<int>(it - steps_.begin());
  }

  void build_unions() {
    std::array<std::vector<span>, cat_count> by_cat;
    std::vector<span> kernels;
    for (std::size_t i : gpu_) {
      const event& e = t_.events[i];
      by_cat[category_of(e, name(e))].push_back({e.start_ns, e.end_ns});
      if (e.kind == activity::kernel) {
        kernels.push_back({e.start_ns, e.end_ns});
        kernel_starts_.push_back(e.start_ns);
        kernel_ends_.push_back(e.end_ns);
      }
    }
    std::vector<span> cumulative;
    for (std::size_t c = 0; c < cat_count; ++c) {
      cumulative.insert(cumulative.end(), by_cat[c].begin(), by_cat[c].end());
      levels_[c] = interval_union(cumulative);
    }
    kernels_ = interval_union(std::move(kernels));
    std::sort(kernel_starts_.begin(), kernel_starts_.end());
    std::sort(kernel_ends_.begin(), kernel_ends_.end());
  }

  const interval_union& busy() const { return levels_[cat_count - 1]; }

  void breakdown() {
    std::vector<ns_t> copy_ns(steps_.size(), 0), overlap_ns(steps_.size(), 0);
    bool any_activity = false;
    for (std::size_t k = 0; k < steps_.size(); ++k) {
      const step_span& s = steps_[k];
      step_breakdown b;
      b.index = static_cast<int>(k);
      b.start_ns = s.start;
      b.end_ns = s.end;
      b.wall_ms = ms(s.end - s.start);
      std::array<ns_t, cat_count> cov{};
      for (std::size_t c = 0; c < cat_count; ++c) cov[c] = levels_[c].covered(s.start, s.end);
      b.compute_ms = ms(cov[cat_compute]);
      b.comm_ms = ms(cov[cat_comm] - cov[cat_compute]);
      b.d2d_ms = ms(cov[cat_d2d] - cov[cat_comm]);
      b.h2d_ms = ms(cov[cat_h2d] - cov[cat_d2d]);
      b.d2h_ms = ms(cov[cat_d2h] - cov[cat_h2d]);
      b.idle_ms = ms((s.end - s.start) - cov[cat_d2h]);
      b.utilization = b.wall_ms > 0 ? 1.0 - b.idle_ms / b.wall_ms : 0;
      any_activity = any_activity || cov[cat_d2h] > 0;
      out_.steps.push_back(b);
    }
    if (!any_activity)
      throw input_error(fmt::format(
          "the timeline has GPU activity ({} events) but none inside its {} '{}' step spans ({:.3f} ms to {:.3f} ms "
          "of the GPU's {:.3f} ms to {:.3f} ms); pick the steps with analyze_options::step_prefix",
          gpu_.size(), steps_.size(), out_.step_prefix, ms(steps_.front().start), ms(steps_.back().end),
          ms(busy().first()), ms(busy().last())));
    // Copies: overlap per step (clipped to each step they touch), bytes to the step they start in.
    for (std::size_t i : gpu_) {
      const event& c = t_.events[i];
      if (c.kind != activity::memcpy) continue;
      auto it = std::partition_point(steps_.begin(), steps_.end(),
                                     [&](const step_span& s) { return s.end <= c.start_ns; });
      bool first = true;
      for (; it != steps_.end() && it->start < c.end_ns; ++it) {
        const auto k = static_cast<std::size_t>(it - steps_.begin());
        const ns_t a = std::max(c.start_ns, it->start), b = std::min(c.end_ns, it->end);
        copy_ns[k] += b - a;
        overlap_ns[k] += kernels_.covered(a, b);
        if (first) {
          if (c.copy == copy_kind::h2d) out_.steps[k].h2d_bytes += c.bytes;
          if (c.copy == copy_kind::d2h) out_.steps[k].d2h_bytes += c.bytes;
        }
        first = false;
      }
    }
    ns_t all_copy = 0, all_overlap = 0;
    for (std::size_t k = 0; k < steps_.size(); ++k) {
      out_.steps[k].copy_overlap =
          copy_ns[k] > 0 ? static_cast<double>(overlap_ns[k]) / static_cast<double>(copy_ns[k]) : 0;
      all_copy += copy_ns[k];
      all_overlap += overlap_ns[k];
    }
    // The mean: each time and byte count averaged; utilization from the mean times; overlap over all copies.
    step_breakdown& m = out_.mean;
    m.index = -1;
    m.start_ns = steps_.front().start;
    m.end_ns = steps_.back().end;
    std::uint64_t h2d_bytes = 0, d2h_bytes = 0;
    for (const step_breakdown& b : out_.steps) {
      m.wall_ms += b.wall_ms;
      m.compute_ms += b.compute_ms;
      m.comm_ms += b.comm_ms;
      m.d2d_ms += b.d2d_ms;
      m.h2d_ms += b.h2d_ms;
      m.d2h_ms += b.d2h_ms;
      m.idle_ms += b.idle_ms;
      h2d_bytes += b.h2d_bytes;
      d2h_bytes += b.d2h_bytes;
    }
    const double n = static_cast<double>(out_.steps.size());
    for (double* v : {&m.wall_ms, &m.compute_ms, &m.comm_ms, &m.d2d_ms, &m.h2d_ms, &m.d2h_ms, &m.idle_ms}) *v /= n;
    m.h2d_bytes = h2d_bytes / out_.steps.size();
    m.d2h_bytes = d2h_bytes / out_.steps.size();
    m.utilization = m.wall_ms > 0 ? 1.0 - m.idle_ms / m.wall_ms : 0;
    m.copy_overlap = all_copy > 0 ? static_cast<double>(all_overlap) / static_cast<double>(all_copy) : 0;
    mean_wall_ns_ = m.wall_ms * ns_per_ms;
  }

  // Labels of CPU activity: the name id, or for an unnamed sync event its kind; the top bit marks a
  // blocking call.
  static constexpr std::uint64_t blocking_bit = std::uint64_t{1} << 63;
  static constexpr std::uint64_t synthetic_bit = std::uint64_t{1} << 62;

  std::uint64_t label_of(const event& e) const {
    std::uint64_t label = e.name != 0 ? e.name : synthetic_bit | static_cast<std::uint64_t>(e.sync);
    if (is_wait(e)) label |= blocking_bit;
    return label;
  }

  std::string label_text(std::uint64_t label) const {
    const std::uint64_t id = label & ~blocking_bit;
    if ((id & synthetic_bit) != 0) {
      const auto k = static_cast<sync_kind>(id & ~synthetic_bit);
      return k == sync_kind::none ? std::string("unnamed activity") : fmt::format("{} synchronize", to_string(k));
    }
    return std::string(t_.strings[static_cast<std::uint32_t>(id)]);
  }

  // Step spans and ferry's "bench level" span cover everything; a profiler's operator ranges (PyTorch's
  // cpu_op, domain "pytorch.op") sit under the annotations that say what the code was doing.
  bool excluded_activity(const event& e) const {
    if (e.kind != activity::range && e.kind != activity::stage) return false;
    if (e.domain != 0 && t_.domain_of(e) == "pytorch.op") return true;
    const std::string_view n = name(e);
    return n == "bench level" || matcher_(n);
  }

  struct segment {
    ns_t start;
    ns_t end;
    std::uint64_t label;
  };

  // Splits one thread's activity into segments labelled with the innermost activity: the one that started
  // last (on equal starts, the one that ends first).
  std::vector<segment> segment_thread(const std::vector<std::size_t>& evs) const {
    std::vector<segment> segs;
    const auto inner_less = [this](std::size_t a, std::size_t b) {  // true when a is outside b
      const event& x = t_.events[a];
      const event& y = t_.events[b];
      if (x.start_ns != y.start_ns) return x.start_ns < y.start_ns;
      if (x.end_ns != y.end_ns) return x.end_ns > y.end_ns;
      return a < b;
    };
    std::priority_queue<std::size_t, std::vector<std::size_t>, decltype(inner_less)> active(inner_less);
    std::size_t i = 0;
    ns_t t = evs.empty() ? 0 : t_.events[evs[0]].start_ns;
    while (true) {
      while (i < evs.size() && t_.events[evs[i]].start_ns <= t) active.push(evs[i++]);
      while (!active.empty() && t_.events[active.top()].end_ns <= t) active.pop();
      if (active.empty()) {
        if (i == evs.size()) break;
        t = t_.events[evs[i]].start_ns;
        continue;
      }
      const event& top = t_.events[active.top()];
      ns_t next = top.end_ns;
      if (i < evs.size()) next = std::min(next, t_.events[evs[i]].start_ns);
      const std::uint64_t label = label_of(top);
      if (!segs.empty() && segs.back().end == t && segs.back().label == label) {
        segs.back().end = next;
      } else {
        segs.push_back({t, next, label});
      }
      t = next;
    }
    return segs;
  }

  void attribute_idle() {
    for (const step_span& s : steps_) busy().for_each_gap(s.start, s.end, [&](span g) { idle_spans_.push_back(g); });
    ns_t total_idle = 0;
    for (const span& g : idle_spans_) total_idle += g.end - g.start;
    std::map<std::uint64_t, std::vector<std::size_t>> per_thread;  // cpu_ is sorted by start already
    for (std::size_t i : cpu_) {
      const event& e = t_.events[i];
      if (e.end_ns > e.start_ns && !excluded_activity(e)) per_thread[e.thread].push_back(i);
    }
    std::map<std::pair<std::uint64_t, std::uint64_t>, ns_t> covered;
    for (const auto& [thread, evs] : per_thread) {
      const std::vector<segment> segs = segment_thread(evs);
      for (const span& g : idle_spans_) {
        auto it = std::partition_point(segs.begin(), segs.end(), [&](const segment& s) { return s.end <= g.start; });
        for (; it != segs.end() && it->start < g.end; ++it)
          covered[{thread, it->label}] += std::min(g.end, it->end) - std::max(g.start, it->start);
      }
    }
    for (const auto& [key, idle] : covered) {
      idle_attribution a;
      a.thread_id = key.first;
      a.thread = thread_name(key.first);
      a.activity = label_text(key.second);
      a.blocking = (key.second & blocking_bit) != 0;
      a.main_thread = main_thread_ && *main_thread_ == key.first;
      a.idle_ms = ms(idle);
      a.fraction_of_idle = total_idle > 0 ? static_cast<double>(idle) / static_cast<double>(total_idle) : 0;
      out_.idle.push_back(std::move(a));
    }
    std::sort(out_.idle.begin(), out_.idle.end(), [](const idle_attribution& a, const idle_attribution& b) {
      return std::tie(b.idle_ms, b.main_thread, a.thread_id, a.activity, a.blocking) <
             std::tie(a.idle_ms, a.main_thread, b.thread_id, b.activity, b.blocking);
    });
  }

  double per_step(double total) const { return total / static_cast<double>(steps_.size()); }
  double steps() const { return static_cast<double>(steps_.size()); }

  // Main-thread blocking waits sorted by end (all threads when there is no main thread).
  const std::vector<std::size_t>& main_waits() {
    if (!waits_built_) {
      for (std::size_t i : cpu_) {
        const event& e = t_.events[i];
        if (is_wait(e) && (!main_thread_ || e.thread == *main_thread_)) waits_.push_back(i);
      }
      std::sort(waits_.begin(), waits_.end(), [this](std::size_t a, std::size_t b) {
        return std::tie(t_.events[a].end_ns, a) < std::tie(t_.events[b].end_ns, b);
      });
      waits_built_ = true;
    }
    return waits_;
  }

  void rule_gpu_idle() {
    const step_breakdown& m = out_.mean;
    const double fraction = m.wall_ms > 0 ? m.idle_ms / m.wall_ms : 0;
    if (!(fraction > opts_.idle_threshold)) return;
    finding f;
    f.rule = "gpu_idle";
    f.cost_ms_per_step = m.idle_ms;
    f.numbers = {{"idle_ms_per_step", m.idle_ms},
                 {"wall_ms_per_step", m.wall_ms},
                 {"idle_fraction", fraction},
                 {"steps", steps()}};
    const idle_attribution* top = nullptr;
    for (const idle_attribution& a : out_.idle)
      if (a.main_thread) {
        top = &a;
        break;
      }
    const std::string step_word = whole_trace_ ? "of the trace" : "of each step";
    f.evidence = fmt::format("the GPU idled {} of {} {} ({}) over {} step{}", ms_text(m.idle_ms), ms_text(m.wall_ms),
                             whole_trace_ ? "(the whole trace)" : "per step", pct(fraction), out_.steps.size(),
                             out_.steps.size() == 1 ? "" : "s");
    if (top != nullptr) {
      f.title = fmt::format("GPU idle {} {} while the main thread is in '{}'", pct(fraction), step_word,
                            top->activity);
      f.evidence += fmt::format("; the main thread ({}) was in '{}' for {} per step of it ({} of the idle time)",
                                top->thread, top->activity, ms_text(per_step(top->idle_ms)),
                                pct(top->fraction_of_idle));
      f.numbers["attributed_ms_per_step"] = per_step(top->idle_ms);
      f.numbers["attributed_fraction"] = top->fraction_of_idle;
      f.fix = idle_fix(*top);
    } else {
      f.title = fmt::format("GPU idle {} {}", pct(fraction), step_word);
      if (!out_.idle.empty()) {
        const idle_attribution& a = out_.idle.front();
        f.evidence += fmt::format("; no range of the main thread covered it, {} was in '{}' for {} per step",
                                  a.thread, a.activity, ms_text(per_step(a.idle_ms)));
      } else {
        f.evidence += "; no CPU range or blocking call covered it";
      }
      f.fix =
          "annotate the host loop (FERRY_RANGE, NVTX or torch.profiler.record_function) to see what the CPU does "
          "while the GPU waits; then move that work to worker threads (ferry::ingest::loader, "
          "ferry::egress::pipeline's sinks)";
    }
    out_.findings.push_back(std::move(f));
  }

  std::string idle_fix(const idle_attribution& a) const {
    if (a.blocking) {
      if (contains(lower(a.activity), "device"))
        return fmt::format("the main thread waits in '{}' while the GPU drains; see the device_sync finding: wait on "
                           "events, not the device (the ferry pipelines record one event per slot)",
                           a.activity);
      return fmt::format("the main thread waits in '{}' instead of queueing the next work; see the sync_copy finding: "
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
    return fmt::format("move '{}' off the thread that launches GPU work, or overlap it with the GPU: run it on "
                       "worker threads (ferry::ingest::loader, ferry::egress::pipeline's sinks) and keep the "
                       "launching thread queueing work ahead",
                       a.activity);
  }

  // Copies of the given kinds that start inside a step.
  template <class Pred>
  std::vector<std::size_t> copies_in_steps(Pred&& pred) const {
    std::vector<std::size_t> out;
    for (std::size_t i : gpu_) {
      const event& c = t_.events[i];
      if (c.kind == activity::memcpy && step_of(c.start_ns) >= 0 && pred(c)) out.push_back(i);
    }
    return out;
  }

  double link_gbps(copy_kind k) const {
    if (k == copy_kind::h2d) return opts_.link_h2d_gbps > 0 ? opts_.link_h2d_gbps : t_.link_h2d_gbps;
    if (k == copy_kind::d2h) return opts_.link_d2h_gbps > 0 ? opts_.link_d2h_gbps : t_.link_d2h_gbps;
    return 0;
  }

  void rule_pageable_async_copy() {
    const auto copies = copies_in_steps([](const event& c) { return c.async && pageable_side(c); });
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
      const event& c = t_.events[i];
      dir_totals& d = dirs[c.copy];
      const double link = link_gbps(c.copy);
      // At the pinned link the copy would take bytes / link (GB/s = bytes per ns); without one, see
      // pageable_saving_without_link.
      const double saved = link > 0 ? std::max(0.0, static_cast<double>(c.duration_ns()) -
                                                         static_cast<double>(c.bytes) / link)
                                     : pageable_saving_without_link * static_cast<double>(c.duration_ns());
      ++d.count;
      d.bytes += c.bytes;
      d.ns += c.duration_ns();
      d.cost_ns += saved;
      cost_ns += saved;
    }
    finding f;
    f.rule = "pageable_async_copy";
    f.cost_ms_per_step = ms(per_step(cost_ns));
    std::vector<std::string> parts;
    std::size_t count = 0;
    for (const auto& [k, d] : dirs) {
      const std::string dir = upper_dir(k);
      const double gbps = gb_per_s(d.bytes, static_cast<double>(d.ns) / 1e9);
      const double link = link_gbps(k);
      parts.push_back(fmt::format("{} {} per step {} ({} per step) took {} per step at {:.1f} GB/s{}",
                                  count_text(per_step(static_cast<double>(d.count))), dir,
                                  k == copy_kind::h2d ? "from pageable memory" : "to pageable memory",
                                  format_bytes(static_cast<std::uint64_t>(per_step(static_cast<double>(d.bytes)))),
                                  ms_text(ms(per_step(static_cast<double>(d.ns)))), gbps,
                                  link > 0 ? fmt::format(" (pinned link {:.1f} GB/s)", link) : std::string()));
      const std::string key = k == copy_kind::h2d ? "h2d" : "d2h";
      f.numbers[key + "_count_per_step"] = per_step(static_cast<double>(d.count));
      f.numbers[key + "_bytes_per_step"] = per_step(static_cast<double>(d.bytes));
      f.numbers[key + "_ms_per_step"] = ms(per_step(static_cast<double>(d.ns)));
      f.numbers[key + "_gbps"] = gbps;
      if (link > 0) f.numbers[key + "_link_gbps"] = link;
      count += d.count;
    }
    f.numbers["count_per_step"] = per_step(static_cast<double>(count));
    f.title = fmt::format("{} asynchronous cop{} per step from or to pageable memory: the driver stages {} and the "
                          "call blocks",
                          count_text(per_step(static_cast<double>(count))), count == steps() ? "y" : "ies",
                          count == steps() ? "it" : "them");
    f.evidence = fmt::format("{}", fmt::join(parts, "; "));
    f.fix = "pin the host buffers: ferry::ingest::prefetcher / ferry::egress::pipeline own pinned slots (ingest "
            "L2, egress L3/L4-pinned)";
    out_.findings.push_back(std::move(f));
  }

  void rule_sync_copy() {
    const auto copies = copies_in_steps(
        [](const event& c) { return c.copy == copy_kind::h2d || c.copy == copy_kind::d2h; });
    const std::vector<std::size_t>& waits = main_waits();
    std::unordered_map<std::uint64_t, std::size_t> api_by_correlation;
    for (std::size_t i : cpu_) {
      const event& e = t_.events[i];
      if (e.kind == activity::api && e.correlation != 0) api_by_correlation.emplace(e.correlation, i);
    }
    std::size_t count = 0;
    std::map<copy_kind, std::pair<std::size_t, std::uint64_t>> dirs;  // count, bytes
    double blocked_ns = 0, cost_ns = 0, copy_ns = 0;
    for (std::size_t i : copies) {
      const event& c = t_.events[i];
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
                                         [&](std::size_t x) { return t_.events[x].end_ns < c.end_ns; });
           w != waits.end() && t_.events[*w].end_ns <= c.end_ns + slack; ++w)
        if (own_call(t_.events[*w])) done = std::max(done, t_.events[*w].end_ns);
      // With a correlation id the issuing call is known exactly, however late a loaded host returned from it.
      if (c.correlation != 0)
        if (auto a = api_by_correlation.find(c.correlation); a != api_by_correlation.end())
          done = std::max(done, t_.events[a->second].end_ns);
      auto it = std::partition_point(waits.begin(), waits.end(),
                                     [&](std::size_t w) { return t_.events[w].end_ns < c.end_ns; });
      std::optional<std::size_t> wait;
      for (; it != waits.end() && t_.events[*it].end_ns <= done + slack; ++it) {
        if (c.async && own_call(t_.events[*it])) continue;
        wait = *it;
        break;
      }
      auto next_kernel = std::lower_bound(kernel_starts_.begin(), kernel_starts_.end(), c.end_ns);
      if (c.async) {
        if (!wait) continue;
        const event& w = t_.events[*wait];
        // The launch was not held when a kernel started before the wait ended. With no kernel after it in
        // the trace (the window's last step) the wait counts: nothing shows it was harmless.
        if (next_kernel != kernel_starts_.end() && *next_kernel < w.end_ns) continue;
        // A wait that a kernel's end fell into waited for that kernel too (a device synchronize at the end
        // of a run, say): not a wait for the copy.
        if (std::upper_bound(kernel_ends_.begin(), kernel_ends_.end(), c.end_ns) !=
            std::upper_bound(kernel_ends_.begin(), kernel_ends_.end(), w.end_ns))
          continue;
      } else if (!wait && c.correlation != 0) {
        if (auto a = api_by_correlation.find(c.correlation); a != api_by_correlation.end()) wait = a->second;
      }
      const ns_t wait_end = wait ? std::max(c.end_ns, t_.events[*wait].end_ns) : c.end_ns;
      const ns_t held_until =
          next_kernel == kernel_starts_.end() ? wait_end : std::min(wait_end, std::max(c.end_ns, *next_kernel));
      // Cost: the copy time no kernel overlapped, plus the GPU idle while the CPU still waited after the copy.
      const ns_t lone = c.duration_ns() - kernels_.covered(c.start_ns, c.end_ns);
      const ns_t held = busy().gaps(c.end_ns, held_until);
      ++count;
      auto& d = dirs[c.copy];
      ++d.first;
      d.second += c.bytes;
      copy_ns += static_cast<double>(c.duration_ns());
      blocked_ns += static_cast<double>(wait ? t_.events[*wait].duration_ns() : c.duration_ns());
      cost_ns += static_cast<double>(lone + held);
    }
    if (count == 0) return;
    finding f;
    f.rule = "sync_copy";
    f.cost_ms_per_step = ms(per_step(cost_ns));
    std::vector<std::string> parts;
    for (const auto& [k, d] : dirs) {
      parts.push_back(fmt::format("{} {} per step ({} per step)", count_text(per_step(static_cast<double>(d.first))),
                                  upper_dir(k), format_bytes(static_cast<std::uint64_t>(per_step(static_cast<double>(d.second))))));
      const std::string key = k == copy_kind::h2d ? "h2d" : "d2h";
      f.numbers[key + "_count_per_step"] = per_step(static_cast<double>(d.first));
      f.numbers[key + "_bytes_per_step"] = per_step(static_cast<double>(d.second));
    }
    f.numbers["count_per_step"] = per_step(static_cast<double>(count));
    f.numbers["blocked_ms_per_step"] = ms(per_step(blocked_ns));
    f.numbers["copy_ms_per_step"] = ms(per_step(copy_ns));
    f.title = fmt::format("{} blocking cop{} per step hold{} back the next launch",
                          count_text(per_step(static_cast<double>(count))), count == steps() ? "y" : "ies",
                          count == steps() ? "s" : "");
    f.evidence = fmt::format("{}; the main thread was blocked {} per step waiting for them; the copies took {} per "
                             "step that no kernel overlapped with",
                             fmt::join(parts, ", "), ms_text(ms(per_step(blocked_ns))), ms_text(ms(per_step(copy_ns))));
    f.fix = "non-blocking copy from pinned memory on a copy stream: ferry::ingest::prefetcher (ingest L2..L4) / "
            "ferry::egress::pipeline (egress L3..L4)";
    out_.findings.push_back(std::move(f));
  }

  void rule_device_sync() {
    std::set<int> steps_with;
    std::size_t count = 0;
    double idle_ns = 0;
    std::uint32_t name_id = 0;
    for (std::size_t i : cpu_) {
      const event& e = t_.events[i];
      if (!is_wait(e) || e.sync != sync_kind::device) continue;
      const int k = step_of(e.start_ns);
      if (k < 0) continue;
      steps_with.insert(k);
      ++count;
      if (name_id == 0) name_id = e.name;
      // Cost: the GPU idle while the CPU waited (the queue drained and nothing new could be launched).
      idle_ns += static_cast<double>(busy().gaps(e.start_ns, e.end_ns));
    }
    // One step (a trace without step spans is one): a single device sync there is usually the end of the
    // run, so it takes two; with steps, at least half of them.
    const bool fires = steps_.size() >= 2 ? 2 * steps_with.size() >= steps_.size()
                                          : count >= (whole_trace_ ? 2u : 1u);
    if (!fires) return;
    const std::string call = name_id != 0 ? std::string(t_.strings[name_id]) : "device synchronize";
    finding f;
    f.rule = "device_sync";
    f.cost_ms_per_step = ms(per_step(idle_ns));
    f.numbers = {{"count_per_step", per_step(static_cast<double>(count))},
                 {"steps_with_sync", static_cast<double>(steps_with.size())},
                 {"steps", steps()},
                 {"idle_ms_per_step", ms(per_step(idle_ns))}};
    f.title = fmt::format("a device-wide synchronize ('{}') in {} of {} steps drains the GPU", call, steps_with.size(),
                          steps_.size());
    f.evidence = fmt::format("{} device synchronize{} per step; the GPU idled {} per step while the CPU waited in them",
                             count_text(per_step(static_cast<double>(count))), count == steps() ? "" : "s",
                             ms_text(ms(per_step(idle_ns))));
    f.fix = "wait on events, not the device: the ferry pipelines record one event per slot (ferry::ingest::prefetcher, "
            "ferry::egress::pipeline), so the CPU waits only for the work it needs";
    out_.findings.push_back(std::move(f));
  }

  void rule_serialized_copy() {
    struct stream_key {
      std::int32_t device;
      std::uint64_t stream;
      auto operator<=>(const stream_key&) const = default;
    };
    std::set<stream_key> kernel_streams;
    for (std::size_t i : gpu_) {
      const event& e = t_.events[i];
      if (e.kind == activity::kernel && step_of(e.start_ns) >= 0) kernel_streams.insert({e.device, e.stream});
    }
    struct totals {
      ns_t copy = 0;
      ns_t overlap = 0;
      std::size_t count = 0;
    };
    std::map<stream_key, totals> per_stream;
    for (std::size_t i : copies_in_steps([](const event& c) { return c.copy == copy_kind::h2d || c.copy == copy_kind::d2h; })) {
      const event& c = t_.events[i];
      // A pageable copy cannot overlap whatever its stream; pageable_async_copy or sync_copy names it.
      if (!kernel_streams.contains({c.device, c.stream}) || c.src == mem_kind::pageable || c.dst == mem_kind::pageable)
        continue;
      totals& s = per_stream[{c.device, c.stream}];
      s.copy += c.duration_ns();
      s.overlap += kernels_.covered(c.start_ns, c.end_ns);
      ++s.count;
    }
    const std::pair<const stream_key, totals>* worst = nullptr;
    for (const auto& entry : per_stream) {
      const totals& s = entry.second;
      if (s.copy <= 0) continue;
      const double overlap = static_cast<double>(s.overlap) / static_cast<double>(s.copy);
      const double copy_per_step = per_step(static_cast<double>(s.copy));
      if (overlap >= serialized_overlap_limit || copy_per_step <= serialized_step_fraction * mean_wall_ns_) continue;
      if (worst == nullptr || s.copy - s.overlap > worst->second.copy - worst->second.overlap) worst = &entry;
    }
    if (worst == nullptr) return;
    const totals& s = worst->second;
    const double overlap = static_cast<double>(s.overlap) / static_cast<double>(s.copy);
    const double copy_ms = ms(per_step(static_cast<double>(s.copy)));
    finding f;
    f.rule = "serialized_copy";
    f.cost_ms_per_step = ms(per_step(static_cast<double>(s.copy - s.overlap)));
    f.numbers = {{"stream", static_cast<double>(worst->first.stream)},
                 {"copy_ms_per_step", copy_ms},
                 {"copy_overlap", overlap},
                 {"copy_fraction_of_step", copy_ms / out_.mean.wall_ms},
                 {"count_per_step", per_step(static_cast<double>(s.count))}};
    f.title = fmt::format("copies and kernels share {}: {} of copies per step run while no kernel does",
                          stream_name(worst->first.stream), ms_text(f.cost_ms_per_step));
    f.evidence = fmt::format("{} host-device cop{} per step on {} take {} per step ({} of the step), {} of it "
                             "overlapped with kernels",
                             count_text(per_step(static_cast<double>(s.count))), s.count == steps() ? "y" : "ies",
                             stream_name(worst->first.stream), ms_text(copy_ms), pct(copy_ms / out_.mean.wall_ms),
                             pct(overlap));
    f.fix = "copy on its own stream and make compute wait on an event: ingest L3 / ferry::ingest::prefetcher; egress "
            "L4 / ferry::egress::pipeline";
    out_.findings.push_back(std::move(f));
  }

  void rule_low_copy_bandwidth(copy_kind dir) {
    const double link = link_gbps(dir);
    if (link <= 0) return;
    // Pageable copies are slow by nature: pageable_async_copy and sync_copy speak for them.
    const auto copies = copies_in_steps(
        [dir](const event& c) { return c.copy == dir && c.bytes >= big_copy_bytes && !pageable_side(c); });
    if (copies.empty()) return;
    std::uint64_t bytes = 0;
    ns_t total = 0;
    ns_t hidden = 0;  // copy time that ran under a kernel: a slow copy there costs the step nothing
    std::map<std::pair<mem_kind, mem_kind>, std::size_t> kinds;
    for (std::size_t i : copies) {
      const event& c = t_.events[i];
      bytes += c.bytes;
      total += c.duration_ns();
      hidden += kernels_.covered(c.start_ns, c.end_ns);
      ++kinds[{c.src, c.dst}];
    }
    if (total <= 0) return;
    const double achieved = static_cast<double>(bytes) / static_cast<double>(total);  // bytes/ns = GB/s
    if (achieved >= opts_.low_bandwidth_fraction * link) return;
    std::vector<std::string> kind_text;
    for (const auto& [k, n] : kinds) kind_text.push_back(fmt::format("{} -> {} x{}", to_string(k.first), to_string(k.second), n));
    // The time the copies took beyond the link's, in the share of their time no kernel hid.
    const double exposed = 1.0 - static_cast<double>(hidden) / static_cast<double>(total);
    const double cost_ns =
        std::max(0.0, static_cast<double>(total) - static_cast<double>(bytes) / link) * std::max(0.0, exposed);
    const std::string d = upper_dir(dir);
    finding f;
    f.rule = "low_copy_bandwidth";
    f.cost_ms_per_step = ms(per_step(cost_ns));
    f.numbers = {{"achieved_gbps", achieved},
                 {"link_gbps", link},
                 {"fraction_of_link", achieved / link},
                 {"bytes_per_step", per_step(static_cast<double>(bytes))},
                 {"copy_ms_per_step", ms(per_step(static_cast<double>(total)))},
                 {"count_per_step", per_step(static_cast<double>(copies.size()))},
                 {"hidden_fraction", 1.0 - exposed}};
    f.title = fmt::format("{} copies run at {:.1f} GB/s, {} of the {:.1f} GB/s link", d, achieved, pct(achieved / link),
                          link);
    f.evidence = fmt::format("{} {} cop{} of at least 1 MiB per step move {} per step in {}: {:.1f} GB/s against a "
                             "{:.1f} GB/s link, {} of that time hidden behind kernels; memory: {}",
                             count_text(per_step(static_cast<double>(copies.size()))), d,
                             copies.size() == out_.steps.size() ? "y" : "ies",
                             format_bytes(static_cast<std::uint64_t>(per_step(static_cast<double>(bytes)))),
                             ms_text(ms(per_step(static_cast<double>(total)))), achieved, link, pct(1.0 - exposed),
                             fmt::join(kind_text, ", "));
    f.fix = "copy from pinned memory in large pieces (ferry::ingest::prefetcher / ferry::egress::pipeline slots); "
            "ferry probe measures the link";
    out_.findings.push_back(std::move(f));
  }

  // Work the host still does after the last step's GPU work ended: a whole output processed only once all
  // of it arrived, say. It is latency at the end of a run, not time lost every step, so it costs nothing
  // per step and is listed after the findings that do; it explains a wall-clock ratio that the steps'
  // breakdown does not. Only named work counts (ranges and stage spans, not API calls or waits).
  void rule_drain_tail() {
    if (steps_.empty()) return;
    const ns_t tail_start = steps_.back().end;
    std::map<std::uint64_t, std::vector<std::size_t>> per_thread;
    ns_t tail_end = tail_start;
    for (std::size_t i : cpu_) {
      const event& e = t_.events[i];
      if (e.end_ns <= e.start_ns || excluded_activity(e)) continue;
      per_thread[e.thread].push_back(i);
      if ((e.kind == activity::range || e.kind == activity::stage) && e.end_ns > tail_start)
        tail_end = std::max(tail_end, e.end_ns);
    }
    const ns_t tail = tail_end - tail_start;
    const ns_t window = tail_end - steps_.front().start;
    if (tail <= 0 || window <= 0 || static_cast<double>(tail) < material_fraction * static_cast<double>(window))
      return;
    // The named activity that covered most of the tail, over every thread.
    std::map<std::pair<std::uint64_t, std::uint64_t>, ns_t> covered;
    for (const auto& [thread, evs] : per_thread) {
      for (const segment& g : segment_thread(evs)) {
        if ((g.label & (blocking_bit | synthetic_bit)) != 0 || g.end <= tail_start) continue;
        covered[{thread, g.label}] += std::min(g.end, tail_end) - std::max(g.start, tail_start);
      }
    }
    std::pair<std::uint64_t, std::uint64_t> top{};
    ns_t top_ns = 0;
    for (const auto& [key, n] : covered)
      if (n > top_ns) top = key, top_ns = n;
    if (top_ns <= 0) return;
    const std::string activity_name = label_text(top.second);
    const std::string thread = thread_name(top.first);
    const double tail_ms = ms(tail);
    finding f;
    f.rule = "drain_tail";
    f.cost_ms_per_step = 0;
    f.title = fmt::format("after the last step the host works {} more ({} of the traced time), mostly {} in '{}'",
                          ms_text(tail_ms), pct(static_cast<double>(tail) / static_cast<double>(window)), thread,
                          activity_name);
    f.evidence = fmt::format("the last step's GPU work ended {} before the last host work; '{}' on {} covered {} "
                             "of that; over {} steps this adds {} per step to a run's wall time",
                             ms_text(tail_ms), activity_name, thread, ms_text(ms(top_ns)), out_.steps.size(),
                             ms_text(tail_ms / steps()));
    f.fix = mentions_any(activity_name, output_words)
                ? "process outputs in slot-sized chunks as they arrive (ferry::egress::pipeline), so the last "
                  "output's processing overlaps its own copy instead of trailing the run"
                : fmt::format("overlap '{}' with the GPU work before it, or split it into smaller pieces that "
                              "start as their inputs arrive",
                              activity_name);
    f.numbers = {{"tail_ms", tail_ms},
                 {"tail_fraction", static_cast<double>(tail) / static_cast<double>(window)},
                 {"activity_ms", ms(top_ns)},
                 {"tail_ms_per_step", tail_ms / steps()}};
    out_.findings.push_back(std::move(f));
  }

  void order_findings() {
    auto& fs = out_.findings;
    std::stable_sort(fs.begin(), fs.end(), [](const finding& a, const finding& b) {
      if (a.cost_ms_per_step != b.cost_ms_per_step) return a.cost_ms_per_step > b.cost_ms_per_step;
      if (rule_rank(a.rule) != rule_rank(b.rule)) return rule_rank(a.rule) < rule_rank(b.rule);
      return a.title < b.title;
    });
    const double material_ms = material_fraction * out_.mean.wall_ms;
    const bool bound = std::any_of(fs.begin(), fs.end(), [&](const finding& f) { return f.cost_ms_per_step >= material_ms; });
    if (bound) return;
    const step_breakdown& m = out_.mean;
    const double copy_ms = m.h2d_ms + m.d2h_ms + m.d2d_ms;
    finding f;
    f.rule = "compute_bound";
    const double compute_fraction = m.wall_ms > 0 ? (m.compute_ms + m.comm_ms) / m.wall_ms : 0;
    const bool hidden = m.copy_overlap >= 0.9 || copy_ms < material_fraction * m.wall_ms;
    f.title = fmt::format("the GPU computes {} of each step; transfers are {}", pct(compute_fraction),
                          hidden ? "hidden" : fmt::format("{} hidden", pct(m.copy_overlap)));
    f.evidence = fmt::format("busy {} of a {} step: kernels {}, exclusive copies and memsets {}, idle {}; copies "
                             "overlapped with kernels {}; no finding costs {} of the step",
                             pct(m.utilization), ms_text(m.wall_ms), ms_text(m.compute_ms + m.comm_ms),
                             ms_text(copy_ms), ms_text(m.idle_ms), pct(m.copy_overlap), pct(material_fraction));
    f.fix = "none needed for data movement; speed up the model itself";
    f.numbers = {{"utilization", m.utilization},
                 {"compute_fraction", compute_fraction},
                 {"copy_overlap", m.copy_overlap},
                 {"idle_fraction", m.wall_ms > 0 ? m.idle_ms / m.wall_ms : 0}};
    fs.insert(fs.begin(), std::move(f));
  }

  const timeline& t_;
  const analyze_options& opts_;
  analysis out_;
  std::vector<std::size_t> gpu_;  // indices of GPU events, by start
  std::vector<std::size_t> cpu_;  // indices of CPU events, by start
  step_matcher matcher_;
  std::vector<step_span> steps_;
  bool whole_trace_ = false;
  std::optional<std::uint64_t> main_thread_;
  std::array<interval_union, cat_count> levels_;  // levels_[c]: union of categories 0..c
  interval_union kernels_;
  std::vector<ns_t> kernel_starts_;
  std::vector<ns_t> kernel_ends_;
  std::vector<span> idle_spans_;
  double mean_wall_ns_ = 0;
  std::vector<std::size_t> waits_;
  bool waits_built_ = false;
};

nlohmann::json step_json(const step_breakdown& b) {
  return {{"index", b.index},           {"start_ns", b.start_ns},     {"end_ns", b.end_ns},
          {"wall_ms", b.wall_ms},       {"compute_ms", b.compute_ms}, {"comm_ms", b.comm_ms},
          {"d2d_ms", b.d2d_ms},         {"h2d_ms", b.h2d_ms},         {"d2h_ms", b.d2h_ms},
          {"idle_ms", b.idle_ms},       {"utilization", b.utilization}, {"copy_overlap", b.copy_overlap},
          {"h2d_bytes", b.h2d_bytes},   {"d2h_bytes", b.d2h_bytes}};
}

std::string step_row(std::string_view label, const step_breakdown& b) {
  return fmt::format("  {:<6} {:>9.2f} {:>9.2f} {:>7.2f} {:>7.2f} {:>7.2f} {:>7.2f} {:>9.2f} {:>6} {:>8} {:>10} {:>10}\n",
                     label, b.wall_ms, b.compute_ms, b.comm_ms, b.d2d_ms, b.h2d_ms, b.d2h_ms, b.idle_ms,
                     pct(b.utilization), pct(b.copy_overlap), format_bytes(b.h2d_bytes), format_bytes(b.d2h_bytes));
}

}  // namespace

analysis analyze(const timeline& t, const analyze_options& opts) { return analyzer(t, opts).run(); }

std::string format_text(const analysis& a) {
  std::string out = fmt::format("ferry trace analysis: {} on {}\n", a.source.empty() ? "(unnamed source)" : a.source,
                                a.device_name.empty() ? "(unnamed device)" : a.device_name);
  if (a.step_prefix.empty()) {
    out += "steps: none found; the whole trace (first to last GPU activity) is analyzed as one step\n";
  } else {
    out += fmt::format("steps: {} ('{}' spans{})\n", a.steps.size(), a.step_prefix,
                       a.main_thread.empty() ? "" : fmt::format(" on {}", a.main_thread));
  }
  if (a.dropped > 0)
    out += fmt::format("warning: the recorder dropped {} events; the analysis may miss activity\n", a.dropped);
  out += "\nGPU time per step (ms; categories exclusive in this order)\n";
  out += fmt::format("  {:<6} {:>9} {:>9} {:>7} {:>7} {:>7} {:>7} {:>9} {:>6} {:>8} {:>10} {:>10}\n", "step", "wall",
                     "compute", "comm", "d2d", "h2d", "d2h", "idle", "busy", "overlap", "h2d bytes", "d2h bytes");
  out += step_row("mean", a.mean);
  constexpr std::size_t max_rows = 10;
  for (std::size_t i = 0; i < a.steps.size() && i < max_rows; ++i) out += step_row(std::to_string(a.steps[i].index), a.steps[i]);
  if (a.steps.size() > max_rows) out += fmt::format("  ... {} more steps\n", a.steps.size() - max_rows);
  out += "\nGPU idle covered by CPU activity (top 5)\n";
  if (a.idle.empty()) out += "  (none: no CPU range or blocking call covered the idle time)\n";
  for (std::size_t i = 0; i < a.idle.size() && i < 5; ++i) {
    const idle_attribution& x = a.idle[i];
    out += fmt::format("  {:>9.2f} ms {:>5}  {}{}: '{}'{}\n", x.idle_ms, pct(x.fraction_of_idle), x.thread,
                       x.main_thread ? " (main)" : "", x.activity, x.blocking ? " (blocking)" : "");
  }
  out += "\nFindings (costliest first)\n";
  for (std::size_t i = 0; i < a.findings.size(); ++i) {
    const finding& f = a.findings[i];
    out += fmt::format("  {}. [{}] {}\n", i + 1, f.rule, f.title);
    if (f.cost_ms_per_step > 0) out += fmt::format("     cost: about {} of GPU time per step\n", ms_text(f.cost_ms_per_step));
    out += fmt::format("     evidence: {}\n     fix: {}\n", f.evidence, f.fix);
  }
  return out;
}

std::string to_json(const analysis& a) {
  nlohmann::json j;
  j["source"] = a.source;
  j["device_name"] = a.device_name;
  j["dropped"] = a.dropped;
  j["step_prefix"] = a.step_prefix;
  j["main_thread"] = a.main_thread;
  j["bottleneck"] = a.findings.empty() ? std::string() : a.bottleneck();
  j["mean"] = step_json(a.mean);
  j["steps"] = nlohmann::json::array();
  for (const step_breakdown& b : a.steps) j["steps"].push_back(step_json(b));
  j["idle"] = nlohmann::json::array();
  for (const idle_attribution& x : a.idle)
    j["idle"].push_back({{"thread", x.thread},
                         {"thread_id", x.thread_id},
                         {"activity", x.activity},
                         {"idle_ms", x.idle_ms},
                         {"fraction_of_idle", x.fraction_of_idle},
                         {"blocking", x.blocking},
                         {"main_thread", x.main_thread}});
  j["findings"] = nlohmann::json::array();
  for (const finding& f : a.findings)
    j["findings"].push_back({{"rule", f.rule},
                             {"title", f.title},
                             {"evidence", f.evidence},
                             {"fix", f.fix},
                             {"cost_ms_per_step", f.cost_ms_per_step},
                             {"numbers", f.numbers}});
  return j.dump(2);
}

}  // namespace ferry::trace
