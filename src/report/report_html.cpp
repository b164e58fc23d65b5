#include "ferry/report/report_html.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "ferry/core/units.hpp"

namespace ferry::trace {

namespace {

// Bounds that keep the report small whatever the trace holds: a trace of millions of events still gives
// a file of a few MB that a browser opens at once.
constexpr std::size_t max_timeline_rects = 20000;  // event rects in the timeline
constexpr std::size_t max_idle_rects = 4000;       // idle shading rects in the timeline
constexpr std::size_t max_tracks = 256;
constexpr std::size_t max_cpu_rows = 6;  // nesting depths drawn per CPU thread; deeper ranges share the last
constexpr std::size_t timeline_steps = 3;  // the timeline shows the first steps only
constexpr std::size_t max_bars = 2000;     // steps in the bar chart (the mean comes on top)
constexpr std::size_t max_table_steps = 1000;
constexpr std::size_t max_metadata = 64;
constexpr std::size_t max_title_chars = 64;  // names in tooltips (rects of merged runs: half)
constexpr std::size_t max_label_chars = 34;  // track labels

// Timeline geometry (SVG user units = CSS px at full width).
constexpr double tl_label_w = 230;
constexpr double tl_plot_w = 1100;
constexpr double tl_right_pad = 20;
constexpr double tl_axis_h = 44;
constexpr double tl_row_h = 14;
constexpr double tl_track_gap = 6;
constexpr double min_px = 1.0;  // events narrower than this merge with their neighbours

// ---- text -------------------------------------------------------------------------------------------------

// Escapes for element content and quoted attribute values alike. Control characters (which HTML does not
// allow in text) become U+FFFD.
void escape_into(std::string& out, std::string_view s) {
  for (const char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      case '\t':
      case '\n': out += c; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f)
          out += "\xEF\xBF\xBD";
        else
          out += c;
    }
  }
}

// The first `n` bytes of `s` (not splitting a UTF-8 sequence), with an ellipsis when cut.
std::string clip(std::string_view s, std::size_t n) {
  if (s.size() <= n) return std::string(s);
  while (n > 0 && (static_cast<unsigned char>(s[n]) & 0xC0) == 0x80) --n;
  return std::string(s.substr(0, n)) + "\xE2\x80\xA6";
}

// Non-finite or negative amounts draw as nothing.
double sane(double v) { return std::isfinite(v) && v > 0 ? v : 0; }

std::string fmt_ms(double ms) {
  if (!std::isfinite(ms)) return "n/a";
  return fmt::format("{:.3f}", ms);
}

std::string fmt_pct(double fraction) {
  if (!std::isfinite(fraction)) return "n/a";
  return fmt::format("{:.1f}%", 100 * fraction);
}

// A round tick spacing (1, 2 or 5 times a power of ten) giving about `ticks` ticks over `span`.
double nice_step(double span, int ticks) {
  if (!(span > 0) || !std::isfinite(span)) return 1;
  const double raw = span / ticks;
  const double p = std::pow(10.0, std::floor(std::log10(raw)));
  const double m = raw / p;
  return (m <= 1 ? 1 : m <= 2 ? 2 : m <= 5 ? 5 : 10) * p;
}

std::string fmt_tick(double v, double step) {
  const int decimals = step >= 1 ? 0 : std::min(6, static_cast<int>(std::ceil(-std::log10(step))));
  return fmt::format("{:.{}f}", v, decimals);
}

// ---- categories and kinds ---------------------------------------------------------------------------------

struct category {
  const char* key;
  const char* colour;
  double step_breakdown::*ms;
};

// Stacked bottom to top in the analyzer's order; idle last.
constexpr std::array<category, 6> categories{{
    {"compute", "#4e79a7", &step_breakdown::compute_ms},
    {"comm", "#b07aa1", &step_breakdown::comm_ms},
    {"d2d", "#76b7b2", &step_breakdown::d2d_ms},
    {"h2d", "#f28e2b", &step_breakdown::h2d_ms},
    {"d2h", "#e15759", &step_breakdown::d2h_ms},
    {"idle", "#cfcfcf", &step_breakdown::idle_ms},
}};

enum class kind : std::uint8_t { kernel, comm, h2d, d2h, d2d, p2p, memcpy, memset, api, sync, range, stage };
constexpr std::size_t kind_count = 12;

struct kind_info {
  const char* key;
  const char* label;
  const char* colour;
};

constexpr std::array<kind_info, kind_count> kinds{{
    {"kernel", "kernel", "#4e79a7"},
    {"comm", "communication kernel", "#b07aa1"},
    {"h2d", "memcpy host to device", "#f28e2b"},
    {"d2h", "memcpy device to host", "#e15759"},
    {"d2d", "memcpy device to device", "#76b7b2"},
    {"p2p", "memcpy peer to peer", "#9d7660"},
    {"memcpy", "memcpy (other)", "#edc948"},
    {"memset", "memset", "#499894"},
    {"api", "runtime API call", "#bab0ac"},
    {"sync", "synchronize", "#d37295"},
    {"range", "range (NVTX, annotation)", "#a0cbe8"},
    {"stage", "ferry stage", "#8cd17d"},
}};

const kind_info& info(kind k) { return kinds[static_cast<std::size_t>(k)]; }

bool is_comm_name(std::string_view name) {
  static constexpr std::string_view needle = "nccl";
  const auto it = std::search(name.begin(), name.end(), needle.begin(), needle.end(),
                              [](char a, char b) { return (a >= 'A' && a <= 'Z' ? a - 'A' + 'a' : a) == b; });
  return it != name.end();
}

// ---- timeline model ---------------------------------------------------------------------------------------

// One drawn rect: an event, or a run of sub-pixel events merged.
struct item {
  double x0 = 0;
  double x1 = 0;
  std::uint32_t longest = 0;  // index of the longest event in it
  std::uint32_t count = 0;
  std::int64_t busy_ns = 0;
  std::uint64_t bytes = 0;
  std::uint16_t kind_mask = 0;
};

struct track {
  bool gpu = false;
  int device = -1;
  std::uint64_t id = 0;  // stream or thread
  std::string label;
  std::vector<std::uint32_t> events;  // in the window
  std::size_t total_events = 0;       // in the whole trace
  std::vector<std::vector<item>> rows;
  std::vector<std::pair<double, double>> idle;  // GPU tracks: gaps in x
  double y = 0;
};

// The timeline's window: the first steps analyzed, or the whole trace when there are none.
struct window {
  std::int64_t w0 = 0;
  std::int64_t w1 = 0;
  std::size_t steps = 0;  // steps drawn
  // In doubles: a window spanning more than 2^63 ns (garbage times) must not overflow.
  [[nodiscard]] double span() const { return static_cast<double>(w1) - static_cast<double>(w0); }
  [[nodiscard]] double x_of(std::int64_t ns) const {
    const std::int64_t c = std::clamp(ns, w0, w1);
    return tl_label_w + (static_cast<double>(c) - static_cast<double>(w0)) / span() * tl_plot_w;
  }
  // [w0, w1) half open, with an instant at w0 inside.
  [[nodiscard]] bool holds(const event& e) const { return e.start_ns < w1 && (e.end_ns > w0 || e.start_ns >= w0); }
};

window window_of(const timeline& t, const analysis& a) {
  window w;
  if (!a.steps.empty()) {
    w.steps = std::min(a.steps.size(), timeline_steps);
    w.w0 = a.steps.front().start_ns;
    w.w1 = a.steps.front().end_ns;
    for (std::size_t i = 0; i < w.steps; ++i) {
      w.w0 = std::min(w.w0, a.steps[i].start_ns);
      w.w1 = std::max(w.w1, a.steps[i].end_ns);
    }
  } else if (!t.events.empty()) {
    w.w0 = t.events.front().start_ns;
    w.w1 = t.events.front().end_ns;
    for (const event& e : t.events) {
      w.w0 = std::min(w.w0, e.start_ns);
      w.w1 = std::max(w.w1, e.end_ns);
    }
  }
  if (w.w1 <= w.w0) {  // an instant: widen to 1 us
    if (w.w0 <= std::numeric_limits<std::int64_t>::max() - 1000)
      w.w1 = w.w0 + 1000;
    else
      w.w0 = w.w1 - 1000;
  }
  return w;
}

// Every GPU stream and CPU thread of the trace (so a quiet one shows, empty), GPU first, each with the
// indices of its events in the window sorted by start (enclosing ranges first).
struct track_set {
  std::vector<track> tracks;
  std::size_t hidden_tracks = 0;
  std::size_t hidden_events = 0;  // in the window, on tracks beyond max_tracks
  std::size_t in_window = 0;
};

track_set tracks_of(const timeline& t, const window& w) {
  track_set ts;
  std::map<std::pair<int, std::uint64_t>, std::size_t> gpu_count;
  std::map<std::uint64_t, std::size_t> cpu_count;
  for (const event& e : t.events) {
    if (e.on_gpu())
      ++gpu_count[{e.device, e.stream}];
    else
      ++cpu_count[e.thread];
  }
  std::map<std::pair<int, std::uint64_t>, std::size_t> gpu_ids;
  std::map<std::uint64_t, std::size_t> cpu_ids;
  for (const auto& [key, n] : gpu_count) {
    track tr;
    tr.gpu = true;
    tr.device = key.first;
    tr.id = key.second;
    tr.total_events = n;
    const auto name = t.stream_names.find(key.second);
    const std::string plain = fmt::format("stream {}", key.second);
    if (name == t.stream_names.end() || name->second.empty() || name->second == plain)
      tr.label = fmt::format("GPU {} {}", key.first, plain);
    else if (name->second.find(plain) != std::string::npos)  // an importer's "stream 7 (compute)"
      tr.label = fmt::format("GPU {} {}", key.first, name->second);
    else
      tr.label = fmt::format("GPU {} {} ({})", key.first, name->second, plain);
    gpu_ids.emplace(key, ts.tracks.size());
    ts.tracks.push_back(std::move(tr));
  }
  for (const auto& [thread, n] : cpu_count) {
    track tr;
    tr.id = thread;
    tr.total_events = n;
    const auto name = t.thread_names.find(thread);
    if (name == t.thread_names.end() || name->second.empty())
      tr.label = fmt::format("thread {}", thread);
    else if (name->second.find(std::to_string(thread)) != std::string::npos)  // "thread 412 (python3)"
      tr.label = name->second;
    else
      tr.label = fmt::format("{} (thread {})", name->second, thread);
    cpu_ids.emplace(thread, ts.tracks.size());
    ts.tracks.push_back(std::move(tr));
  }
  const auto& evs = t.events;
  for (std::size_t i = 0; i < evs.size(); ++i) {
    const event& e = evs[i];
    if (!w.holds(e)) continue;
    ++ts.in_window;
    const std::size_t ti = e.on_gpu() ? gpu_ids.at({e.device, e.stream}) : cpu_ids.at(e.thread);
    if (ti >= max_tracks)
      ++ts.hidden_events;
    else
      ts.tracks[ti].events.push_back(static_cast<std::uint32_t>(i));
  }
  if (ts.tracks.size() > max_tracks) {
    ts.hidden_tracks = ts.tracks.size() - max_tracks;
    ts.tracks.resize(max_tracks);
  }
  for (track& tr : ts.tracks)
    std::sort(tr.events.begin(), tr.events.end(), [&](std::uint32_t x, std::uint32_t y) {
      const event& a = evs[x];
      const event& b = evs[y];
      return a.start_ns != b.start_ns ? a.start_ns < b.start_ns : a.end_ns > b.end_ns;
    });
  return ts;
}

// Idle gaps of a GPU track at least 2 px wide, the widest `budget` of them.
void find_idle(track& tr, const timeline& t, const window& w, std::size_t budget) {
  double busy_x = tl_label_w;
  for (const std::uint32_t i : tr.events) {
    const event& e = t.events[i];
    const double a = w.x_of(e.start_ns);
    if (a - busy_x >= 2) tr.idle.emplace_back(busy_x, a);
    busy_x = std::max(busy_x, w.x_of(e.end_ns));
  }
  if (tl_label_w + tl_plot_w - busy_x >= 2) tr.idle.emplace_back(busy_x, tl_label_w + tl_plot_w);
  if (tr.idle.size() > budget) {
    auto wider = [](const auto& x, const auto& y) { return x.second - x.first > y.second - y.first; };
    std::nth_element(tr.idle.begin(), tr.idle.begin() + static_cast<std::ptrdiff_t>(budget), tr.idle.end(), wider);
    tr.idle.resize(budget);
  }
}

// The track's rects: events narrower than `merge_px` join a run with neighbours less than `merge_px`
// away; CPU events take the lowest row free at their start, so nested ranges stack downwards.
// Returns the number of rects.
std::size_t build_rows(track& tr, const timeline& t, const window& w, double merge_px,
                       const std::vector<kind>& kind_of_event) {
  std::vector<std::int64_t> row_end;  // CPU: when each row frees up
  std::vector<bool> open;             // whether the row's last rect is a run still open to merging
  tr.rows.assign(1, {});
  open.assign(1, false);
  std::size_t rects = 0;
  for (std::size_t n = 0; n < tr.events.size(); ++n) {
    const std::uint32_t i = tr.events[n];
    const event& e = t.events[i];
    const kind k = kind_of_event[n];
    std::size_t row = 0;
    if (!tr.gpu) {
      while (row < row_end.size() && row_end[row] > e.start_ns) ++row;
      if (row == row_end.size()) {
        if (row_end.size() < max_cpu_rows)
          row_end.push_back(e.end_ns);
        else
          row = max_cpu_rows - 1;
      }
      row_end[row] = std::max(row_end[row], e.end_ns);
      if (tr.rows.size() < row_end.size()) {
        tr.rows.resize(row_end.size());
        open.resize(row_end.size(), false);
      }
    }
    const double a = w.x_of(e.start_ns);
    const double b = w.x_of(e.end_ns);
    const std::int64_t dur = std::max<std::int64_t>(0, e.duration_ns());
    const auto bit = static_cast<std::uint16_t>(1u << static_cast<unsigned>(k));
    auto& items = tr.rows[row];
    const bool small = b - a < merge_px;
    if (small && open[row] && a - items.back().x1 < merge_px) {
      item& it = items.back();
      it.x1 = std::max(it.x1, b);
      if (dur > t.events[it.longest].duration_ns()) it.longest = i;
      ++it.count;
      it.busy_ns += dur;
      it.bytes += e.bytes;
      it.kind_mask |= bit;
    } else {
      items.push_back({a, b, i, 1, dur, e.bytes, bit});
      open[row] = small;
      ++rects;
    }
  }
  return rects;
}

class html_writer {
 public:
  html_writer(const timeline& t, const analysis& a) : t_(t), a_(a) {}
  std::string render();

 private:
  template <class... Args>
  void out(fmt::format_string<Args...> f, Args&&... args) {
    fmt::format_to(std::back_inserter(s_), f, std::forward<Args>(args)...);
  }
  void text(std::string_view v) { escape_into(s_, v); }

  void head();
  void header();
  void findings();
  void bar_chart();
  void timeline_svg();
  void breakdown_table();
  void idle_table();
  void metadata_table();
  void script();

  kind kind_of(const event& e);
  std::string event_title(const event& e, kind k, std::size_t name_chars);

  const timeline& t_;
  const analysis& a_;
  std::string s_;
  std::vector<std::int8_t> comm_cache_;  // per string id: -1 unknown, 0 no, 1 an NCCL name
};

kind html_writer::kind_of(const event& e) {
  switch (e.kind) {
    case activity::kernel: {
      if (comm_cache_.size() < t_.strings.size()) comm_cache_.resize(t_.strings.size(), -1);
      if (e.name >= comm_cache_.size()) return kind::kernel;
      auto& c = comm_cache_[e.name];
      if (c < 0) c = is_comm_name(t_.strings[e.name]) ? 1 : 0;
      return c != 0 ? kind::comm : kind::kernel;
    }
    case activity::memcpy:
      switch (e.copy) {
        case copy_kind::h2d: return kind::h2d;
        case copy_kind::d2h: return kind::d2h;
        case copy_kind::d2d: return kind::d2d;
        case copy_kind::p2p: return kind::p2p;
        default: return kind::memcpy;
      }
    case activity::memset: return kind::memset;
    case activity::api: return kind::api;
    case activity::sync: return kind::sync;
    case activity::range: return kind::range;
    case activity::stage: return kind::stage;
  }
  return kind::kernel;
}

std::string_view safe_name(const timeline& t, std::uint32_t id) {
  return id < t.strings.size() ? t.strings[id] : std::string_view("?");
}

std::string html_writer::event_title(const event& e, kind k, std::size_t name_chars) {
  std::string title = clip(safe_name(t_, e.name), name_chars);
  if (title.empty()) title = info(k).key;
  const auto dur = std::max<std::int64_t>(0, e.duration_ns());
  title += fmt::format(" \xC2\xB7 {} \xC2\xB7 {}", info(k).label, format_duration_ns(static_cast<std::uint64_t>(dur)));
  if (e.bytes > 0) {
    title += fmt::format(" \xC2\xB7 {}", format_bytes(e.bytes));
    if (dur > 0) title += fmt::format(" \xC2\xB7 {:.2f} GB/s", static_cast<double>(e.bytes) / static_cast<double>(dur));
  }
  if (e.kind == activity::memcpy && (e.src != mem_kind::unknown || e.dst != mem_kind::unknown))
    title += fmt::format(" \xC2\xB7 {} to {}{}", to_string(e.src), to_string(e.dst), e.async ? ", async" : "");
  if (e.sync != sync_kind::none) title += fmt::format(" \xC2\xB7 waits on {}", to_string(e.sync));
  return title;
}

// ---- document ---------------------------------------------------------------------------------------------

void html_writer::head() {
  out("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n");
  out("<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n<title>ferry trace report: ");
  text(a_.source.empty() ? t_.source : a_.source);
  out("</title>\n<style>\n");
  out("{}",
      "body{font-family:system-ui,-apple-system,'Segoe UI',Roboto,'DejaVu Sans',sans-serif;margin:24px;"
      "color:#222;background:#fff;line-height:1.4}\n"
      "h1{font-size:22px;margin:0 0 4px}h2{font-size:18px;margin:28px 0 8px;border-bottom:1px solid #ddd}\n"
      ".meta{color:#555;font-size:14px}.meta b{color:#222}\n"
      ".warn{background:#fff3cd;border:1px solid #e0b000;padding:8px 12px;margin:12px 0;border-radius:4px}\n"
      ".bottleneck{font-size:30px;font-weight:700;margin:16px 0 4px;color:#b3261e}\n"
      ".bottleneck small{display:block;font-size:14px;font-weight:400;color:#555}\n"
      ".finding{border-left:4px solid #4e79a7;padding:4px 12px;margin:12px 0;background:#f7f9fc}\n"
      ".finding h3{margin:4px 0;font-size:16px}.finding .rule{font-family:monospace;color:#666;font-size:12px}\n"
      ".finding p{margin:4px 0}\n"
      "table{border-collapse:collapse;font-size:13px}th,td{padding:3px 8px;border-bottom:1px solid #eee}\n"
      "th{text-align:left;background:#f4f4f4}td.n{text-align:right;font-variant-numeric:tabular-nums}\n"
      "tr.mean td{font-weight:700;background:#f7f9fc}\n"
      ".scroll{overflow-x:auto;max-width:100%}\n"
      "svg{display:block;font-size:11px}svg text{fill:#333}#timeline{max-width:100%;height:auto}\n"
      "svg .axis{stroke:#888;stroke-width:1}svg .grid{stroke:#eee;stroke-width:1}\n"
      "svg .step{stroke:#222;stroke-width:1;stroke-dasharray:4 3}svg .sep{stroke:#e4e4e4}\n"
      "svg rect.idle{fill:#d0d0d0;fill-opacity:.45}\n"
      // Adjacent CPU spans of one colour stay apart.
      "svg rect[data-kind=range],svg rect[data-kind=stage],svg rect[data-kind=api]{stroke:#fff;stroke-width:.6}\n"
      ".legend{display:flex;flex-wrap:wrap;gap:4px 14px;font-size:12px;margin:6px 0}\n"
      ".legend span i{display:inline-block;width:12px;height:12px;margin-right:4px;vertical-align:-2px}\n"
      ".note{color:#666;font-size:12px}\n"
      "#render-check{color:#999;font-size:11px}\n");
  for (const auto& c : categories) out("rect[data-category={0}],i.c-{0}{{fill:{1};background:{1}}}\n", c.key, c.colour);
  for (const auto& k : kinds) out("rect[data-kind={0}],i.k-{0}{{fill:{1};background:{1}}}\n", k.key, k.colour);
  out("i.k-idle{{background:#d0d0d0}}\n</style>\n</head>\n");
}

void html_writer::header() {
  const std::string& source = a_.source.empty() ? t_.source : a_.source;
  const std::string& device = a_.device_name.empty() ? t_.device_name : a_.device_name;
  out("<h1>ferry trace report</h1>\n<div class=\"meta\"><b>Source:</b> ");
  text(source.empty() ? "unknown" : source);
  out(" &nbsp; <b>Device:</b> ");
  text(device.empty() ? "unknown" : device);
  out(" &nbsp; <b>Steps:</b> {}", a_.steps.size());
  if (!a_.step_prefix.empty()) {
    out(" (spans named &ldquo;");
    text(a_.step_prefix);
    out("&hellip;&rdquo;)");
  } else if (a_.steps.size() == 1) {
    out(" (the whole trace as one step)");
  }
  out(" &nbsp; <b>Events:</b> {}</div>\n", t_.events.size());

  const std::uint64_t dropped = a_.dropped > 0 ? a_.dropped : t_.dropped;
  if (dropped > 0)
    out("<div class=\"warn\" id=\"dropped\"><b>{} events were dropped</b> by the recorder (its buffer was full): "
        "the analysis may miss activity. Record fewer steps or raise the recorder's capacity.</div>\n",
        dropped);

  if (a_.findings.empty()) {
    out("<div class=\"bottleneck\" id=\"bottleneck\">No finding<small>the analysis named no bottleneck</small>"
        "</div>\n");
    return;
  }
  const finding& f = a_.findings.front();
  out("<div class=\"bottleneck\" id=\"bottleneck\" data-rule=\"");
  text(f.rule);
  out("\">Bottleneck: ");
  text(f.title);
  out("<small>rule <code>");
  text(f.rule);
  out("</code>");
  if (sane(f.cost_ms_per_step) > 0) out(" &middot; costs about {} ms per step", fmt_ms(f.cost_ms_per_step));
  if (sane(a_.mean.wall_ms) > 0)
    out(" &middot; mean step {} ms, GPU utilization {}", fmt_ms(a_.mean.wall_ms), fmt_pct(a_.mean.utilization));
  out("</small></div>\n");
}

void html_writer::findings() {
  out("<h2>Findings</h2>\n");
  if (a_.findings.empty()) out("<p>No findings.</p>\n");
  std::size_t i = 0;
  for (const finding& f : a_.findings) {
    out("<section class=\"finding\" data-rule=\"");
    text(f.rule);
    out("\"><h3>{}. ", ++i);
    text(f.title);
    out("</h3><div class=\"rule\">");
    text(f.rule);
    if (sane(f.cost_ms_per_step) > 0) out(" &middot; {} ms per step", fmt_ms(f.cost_ms_per_step));
    out("</div>\n");
    if (!f.evidence.empty()) {
      out("<p><b>Evidence:</b> ");
      text(f.evidence);
      out("</p>\n");
    }
    if (!f.fix.empty()) {
      out("<p><b>Fix:</b> ");
      text(f.fix);
      out("</p>\n");
    }
    if (!f.numbers.empty()) {
      out("<details><summary>numbers</summary><table>");
      for (const auto& [k, v] : f.numbers) {
        out("<tr><td>");
        text(k);
        out("</td><td class=\"n\">{}</td></tr>", std::isfinite(v) ? fmt::format("{:.6g}", v) : "n/a");
      }
      out("</table></details>\n");
    }
    out("</section>\n");
  }
}

void html_writer::bar_chart() {
  out("<h2>Per-step breakdown</h2>\n<div class=\"legend\">");
  for (const auto& c : categories) out("<span><i class=\"c-{0}\"></i>{0}</span>", c.key);
  out("</div>\n");
  if (a_.steps.empty()) {
    out("<p>No steps.</p>\n");
    return;
  }
  const std::size_t shown = std::min(a_.steps.size(), max_bars);
  const std::size_t bars = shown + 1;  // the mean last
  const double slot = std::clamp(1100.0 / static_cast<double>(bars + 1), 3.0, 48.0);
  const double bar_w = std::max(2.0, slot * 0.75);
  const double left = 64;
  const double top = 16;
  const double plot_h = 300;
  const double plot_w = slot * static_cast<double>(bars + 1);  // a free slot between the steps and the mean
  const double width = left + plot_w + 20;
  const double height = top + plot_h + 44;

  auto total = [](const step_breakdown& s) {
    double sum = 0;
    for (const auto& c : categories) sum += sane(s.*c.ms);
    return std::max(sum, sane(s.wall_ms));
  };
  double max_ms = total(a_.mean);
  for (std::size_t i = 0; i < shown; ++i) max_ms = std::max(max_ms, total(a_.steps[i]));
  if (!(max_ms > 0)) max_ms = 1;
  const double tick = nice_step(max_ms, 6);
  const double y_max = std::ceil(max_ms / tick) * tick;
  auto y_of = [&](double ms) { return top + plot_h - ms / y_max * plot_h; };

  if (shown < a_.steps.size())
    out("<p class=\"note\">The chart shows the first {} of {} steps; the mean bar is over all of them.</p>\n",
        shown, a_.steps.size());
  out("<div class=\"scroll\"><svg id=\"bars\" width=\"{0:.0f}\" height=\"{1:.0f}\" viewBox=\"0 0 {0:.0f} {1:.0f}\" "
      "data-bars=\"{2}\" role=\"img\" aria-label=\"GPU time per step\">\n",
      width, height, bars);
  for (double v = 0; v <= y_max + tick / 2; v += tick) {
    const double y = y_of(v);
    out("<line class=\"grid\" x1=\"{:.1f}\" x2=\"{:.1f}\" y1=\"{:.1f}\" y2=\"{:.1f}\"/>", left, left + plot_w, y, y);
    out("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"end\">{}</text>\n", left - 6, y + 4, fmt_tick(v, tick));
  }
  out("<text transform=\"translate(14 {:.1f}) rotate(-90)\" text-anchor=\"middle\">ms per step</text>\n",
      top + plot_h / 2);

  // Labels at least ~28 px apart.
  const std::size_t label_every = std::max<std::size_t>(1, static_cast<std::size_t>(std::ceil(28.0 / slot)));
  auto bar = [&](const step_breakdown& s, std::size_t slot_index, const std::string& step_key) {
    const double x = left + slot * static_cast<double>(slot_index) + (slot - bar_w) / 2;
    const double wall = sane(s.wall_ms);
    out("<g class=\"bar\" data-step=\"{}\">", step_key);
    double acc = 0;
    for (const auto& c : categories) {
      const double ms = sane(s.*c.ms);
      if (ms <= 0) continue;
      const double y0 = y_of(acc);
      const double y1 = y_of(acc + ms);
      acc += ms;
      out("<rect class=\"seg\" data-step=\"{}\" data-category=\"{}\" data-ms=\"{:.4f}\" x=\"{:.1f}\" y=\"{:.1f}\" "
          "width=\"{:.1f}\" height=\"{:.2f}\"><title>{} {}: {} {} ms{}</title></rect>",
          step_key, c.key, ms, x, y1, bar_w, std::max(0.0, y0 - y1), step_key == "mean" ? "mean" : "step",
          step_key == "mean" ? "of all steps" : step_key, c.key, fmt_ms(ms),
          wall > 0 ? fmt::format(" ({} of {} ms)", fmt_pct(ms / wall), fmt_ms(wall)) : std::string());
    }
    out("</g>\n");
  };
  for (std::size_t i = 0; i < shown; ++i) {
    const step_breakdown& s = a_.steps[i];
    const std::string key = std::to_string(s.index);
    bar(s, i, key);
    if (i % label_every == 0)
      out("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\">{}</text>\n",
          left + slot * (static_cast<double>(i) + 0.5), top + plot_h + 14, key);
  }
  bar(a_.mean, shown + 1, "mean");
  out("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\" font-weight=\"700\">mean</text>\n",
      left + slot * (static_cast<double>(shown + 1) + 0.5), top + plot_h + 14);
  out("<line class=\"axis\" x1=\"{0:.1f}\" x2=\"{0:.1f}\" y1=\"{1:.1f}\" y2=\"{2:.1f}\"/>", left, top,
      top + plot_h);
  out("<line class=\"axis\" x1=\"{0:.1f}\" x2=\"{1:.1f}\" y1=\"{2:.1f}\" y2=\"{2:.1f}\"/>\n", left, left + plot_w,
      top + plot_h);
  out("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\">step</text>\n", left + plot_w / 2,
      top + plot_h + 34);
  out("</svg></div>\n");
}

void html_writer::timeline_svg() {
  out("<h2>Timeline</h2>\n");
  const auto& evs = t_.events;
  if (evs.empty()) {
    out("<p>The trace holds no events.</p>\n");
    return;
  }
  const window w = window_of(t_, a_);
  track_set ts = tracks_of(t_, w);
  auto& tracks = ts.tracks;

  std::size_t gpu_tracks = 0;
  for (const track& tr : tracks) gpu_tracks += tr.gpu ? 1 : 0;
  for (track& tr : tracks)
    if (tr.gpu) find_idle(tr, t_, w, std::max<std::size_t>(8, max_idle_rects / gpu_tracks));

  std::vector<std::vector<kind>> kinds_of(tracks.size());
  std::array<std::size_t, kind_count> kind_seen{};
  for (std::size_t ti = 0; ti < tracks.size(); ++ti) {
    kinds_of[ti].reserve(tracks[ti].events.size());
    for (const std::uint32_t i : tracks[ti].events) {
      kinds_of[ti].push_back(kind_of(evs[i]));
      ++kind_seen[static_cast<std::size_t>(kinds_of[ti].back())];
    }
  }

  // The rect cap. Every track gets a fair share, tracks needing less giving theirs to the others (water
  // filling, smallest first). A track over its share merges coarser (runs up to 2, 4, 8, 16 px) and, when
  // still over, each of its rows keeps its widest rects.
  std::vector<std::size_t> counts(tracks.size());
  std::vector<double> merge_of(tracks.size(), min_px);
  std::size_t total = 0;
  for (std::size_t ti = 0; ti < tracks.size(); ++ti) {
    counts[ti] = build_rows(tracks[ti], t_, w, min_px, kinds_of[ti]);
    total += counts[ti];
  }
  std::size_t omitted_rects = 0;
  std::size_t omitted_events = 0;
  if (total > max_timeline_rects) {
    std::vector<std::size_t> order(tracks.size());
    for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::sort(order.begin(), order.end(), [&](std::size_t x, std::size_t y) { return counts[x] < counts[y]; });
    std::size_t budget = max_timeline_rects;
    for (std::size_t n = 0; n < order.size(); ++n) {
      const std::size_t ti = order[n];
      track& tr = tracks[ti];
      const std::size_t share = budget / (order.size() - n);
      for (double px = 2 * min_px; counts[ti] > share && px <= 16; px *= 2) {
        counts[ti] = build_rows(tr, t_, w, px, kinds_of[ti]);
        merge_of[ti] = px;
      }
      if (counts[ti] > share) {
        std::vector<std::vector<item>*> rows;
        for (auto& r : tr.rows) rows.push_back(&r);
        std::sort(rows.begin(), rows.end(), [](auto* x, auto* y) { return x->size() < y->size(); });
        std::size_t row_budget = share;
        counts[ti] = 0;
        for (std::size_t i = 0; i < rows.size(); ++i) {
          auto& r = *rows[i];
          const std::size_t row_share = row_budget / (rows.size() - i);
          if (r.size() > row_share) {
            std::nth_element(r.begin(), r.begin() + static_cast<std::ptrdiff_t>(row_share), r.end(),
                             [](const item& x, const item& y) { return x.x1 - x.x0 > y.x1 - y.x0; });
            for (auto it = r.begin() + static_cast<std::ptrdiff_t>(row_share); it != r.end(); ++it)
              omitted_events += it->count;
            omitted_rects += r.size() - row_share;
            r.resize(row_share);
            std::sort(r.begin(), r.end(), [](const item& x, const item& y) { return x.x0 < y.x0; });
          }
          row_budget -= r.size();
          counts[ti] += r.size();
        }
      }
      budget -= counts[ti];
    }
  }
  std::size_t drawn = 0;
  std::size_t merged_events = 0;
  double merge_px = min_px;
  for (std::size_t ti = 0; ti < tracks.size(); ++ti) {
    drawn += counts[ti];
    merge_px = std::max(merge_px, merge_of[ti]);
    for (const auto& r : tracks[ti].rows)
      for (const item& it : r) merged_events += it.count > 1 ? it.count : 0;
  }

  // Layout.
  double y = tl_axis_h;
  for (track& tr : tracks) {
    tr.y = y;
    y += static_cast<double>(std::max<std::size_t>(1, tr.rows.size())) * tl_row_h + tl_track_gap;
  }
  const double width = tl_label_w + tl_plot_w + tl_right_pad;
  const double height = y + 8;
  const double span_ms = w.span() / 1e6;

  out("<p class=\"note\">");
  if (w.steps > 0)
    out("Steps {} to {} of {} ({} ms). ", a_.steps.front().index, a_.steps[w.steps - 1].index, a_.steps.size(),
        fmt_ms(span_ms));
  else
    out("The whole trace ({} ms). ", fmt_ms(span_ms));
  out("{} of {} events lie in this window, drawn as {} rects", ts.in_window, evs.size(), drawn);
  if (merged_events > 0)
    out("; {} events narrower than {} merged into runs, drawn lighter the less of the run they keep busy",
        merged_events, merge_px > min_px ? fmt::format("{:.0f} px (on the busiest tracks) are", merge_px)
                                         : std::string("a pixel are"));
  if (omitted_rects > 0)
    out("; <b id=\"omitted\">{} rects ({} events) omitted</b> over the cap of {} rects (the narrowest go first)",
        omitted_rects, omitted_events, max_timeline_rects);
  if (ts.hidden_tracks > 0)
    out("; {} more tracks ({} events) not drawn: at most {} tracks", ts.hidden_tracks, ts.hidden_events,
        max_tracks);
  out(". Shaded: GPU stream idle. Dashed lines: step boundaries. Hover a rect for its name, duration and "
      "bytes.</p>\n<div class=\"legend\">");
  for (std::size_t k = 0; k < kind_count; ++k)
    if (kind_seen[k] > 0) out("<span><i class=\"k-{}\"></i>{}</span>", kinds[k].key, kinds[k].label);
  out("<span><i class=\"k-idle\"></i>GPU stream idle</span></div>\n");

  out("<svg id=\"timeline\" width=\"{0:.0f}\" height=\"{1:.0f}\" viewBox=\"0 0 {0:.0f} {1:.0f}\" "
      "data-rects=\"{2}\" data-tracks=\"{3}\" role=\"img\" aria-label=\"timeline\">\n",
      width, height, drawn, tracks.size());

  // Time axis in ms from the window's start.
  const double tick = nice_step(span_ms, 10);
  for (double v = 0; v <= span_ms * (1 + 1e-9); v += tick) {
    const double x = tl_label_w + v / span_ms * tl_plot_w;
    out("<line class=\"grid\" x1=\"{0:.1f}\" x2=\"{0:.1f}\" y1=\"{1:.0f}\" y2=\"{2:.0f}\"/>", x, tl_axis_h - 6,
        height - 4);
    out("<text x=\"{:.1f}\" y=\"{:.0f}\" text-anchor=\"middle\">{}</text>\n", x, tl_axis_h - 10, fmt_tick(v, tick));
  }
  out("<text x=\"{:.0f}\" y=\"{:.0f}\" text-anchor=\"end\">ms</text>\n", tl_label_w - 12, tl_axis_h - 10);
  out("<line class=\"axis\" x1=\"{0:.0f}\" x2=\"{1:.0f}\" y1=\"{2:.0f}\" y2=\"{2:.0f}\"/>\n", tl_label_w,
      tl_label_w + tl_plot_w, tl_axis_h - 4);

  for (const track& tr : tracks) {
    const double rows_h = static_cast<double>(std::max<std::size_t>(1, tr.rows.size())) * tl_row_h;
    out("<g class=\"track\" data-track=\"{}:{}{}\">", tr.gpu ? "gpu" : "cpu",
        tr.gpu ? std::to_string(tr.device) + ":" : std::string(), tr.id);
    out("<line class=\"sep\" x1=\"0\" x2=\"{:.0f}\" y1=\"{:.1f}\" y2=\"{:.1f}\"/>", width, tr.y - tl_track_gap / 2,
        tr.y - tl_track_gap / 2);
    out("<text x=\"4\" y=\"{:.1f}\">", tr.y + 11);
    text(clip(tr.label, max_label_chars));
    out("<title>");
    text(tr.label);
    out(": {} events in the trace</title></text>\n", tr.total_events);
    for (const auto& [x0, x1] : tr.idle)
      out("<rect class=\"idle\" x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.0f}\"><title>idle {} ms"
          "</title></rect>\n",
          x0, tr.y, x1 - x0, rows_h, fmt_ms((x1 - x0) / tl_plot_w * span_ms));
    for (std::size_t r = 0; r < tr.rows.size(); ++r) {
      const double ry = tr.y + static_cast<double>(r) * tl_row_h + 1;
      for (const item& it : tr.rows[r]) {
        const event& e = evs[it.longest];
        const kind k = kind_of(e);
        const double rect_w = std::max(it.x1 - it.x0, min_px);
        out("<rect data-kind=\"{}\" x=\"{:.1f}\" y=\"{:.0f}\" width=\"{:.1f}\" height=\"{:.0f}\"", info(k).key,
            it.x0, ry, rect_w, tl_row_h - 2);
        if (it.count > 1) {
          // A run shows how busy it is: the fraction of its span its events cover.
          const double busy = static_cast<double>(it.busy_ns) / (rect_w / tl_plot_w * w.span());
          if (busy < 0.9) out(" fill-opacity=\"{:.2f}\"", std::clamp(busy, 0.25, 1.0));
        }
        out("><title>");
        if (it.count == 1) {
          text(event_title(e, k, max_title_chars));
        } else {
          out("{} events merged (", it.count);
          bool first = true;
          for (std::size_t kk = 0; kk < kind_count; ++kk)
            if ((it.kind_mask & (1u << kk)) != 0) {
              out("{}{}", first ? "" : ", ", kinds[kk].key);
              first = false;
            }
          out(") \xC2\xB7 busy {}", format_duration_ns(static_cast<std::uint64_t>(it.busy_ns)));
          if (it.bytes > 0) out(" \xC2\xB7 {}", format_bytes(it.bytes));
          out(" \xC2\xB7 longest {}: ", format_duration_ns(static_cast<std::uint64_t>(std::max<std::int64_t>(0, e.duration_ns()))));
          text(clip(safe_name(t_, e.name), max_title_chars / 2));
        }
        out("</title></rect>\n");
      }
    }
    out("</g>\n");
  }

  // Step boundaries over the tracks, labelled above the axis.
  std::size_t lines = 0;
  for (const step_breakdown& s : a_.steps) {
    if (lines >= 200) break;
    if (s.start_ns >= w.w1 || s.end_ns < w.w0) continue;
    ++lines;
    const double xs = w.x_of(s.start_ns);
    out("<line class=\"step\" data-step=\"{0}\" x1=\"{1:.1f}\" x2=\"{1:.1f}\" y1=\"12\" y2=\"{2:.0f}\"/>", s.index,
        xs, height - 4);
    out("<line class=\"step\" x1=\"{0:.1f}\" x2=\"{0:.1f}\" y1=\"12\" y2=\"{1:.0f}\"/>", w.x_of(s.end_ns),
        height - 4);
    out("<text x=\"{:.1f}\" y=\"11\">step {}</text>\n", xs + 3, s.index);
  }
  out("</svg>\n");
}

void html_writer::breakdown_table() {
  out("<h2>Breakdown table</h2>\n");
  if (a_.steps.empty()) {
    out("<p>No steps.</p>\n");
    return;
  }
  out("<div class=\"scroll\"><table id=\"breakdown\"><tr><th>step</th><th>wall ms</th>");
  for (const auto& c : categories) out("<th>{} ms</th>", c.key);
  out("<th>utilization</th><th>copy overlap</th><th>h2d bytes</th><th>d2h bytes</th></tr>\n");
  auto row = [&](const step_breakdown& s, bool mean) {
    if (mean)
      out("<tr class=\"mean\"><td>mean</td>");
    else
      out("<tr><td>{}</td>", s.index);
    out("<td class=\"n\">{}</td>", fmt_ms(s.wall_ms));
    for (const auto& c : categories) out("<td class=\"n\">{}</td>", fmt_ms(s.*c.ms));
    out("<td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td></tr>\n",
        fmt_pct(s.utilization), fmt_pct(s.copy_overlap), format_bytes(s.h2d_bytes), format_bytes(s.d2h_bytes));
  };
  row(a_.mean, true);
  const std::size_t shown = std::min(a_.steps.size(), max_table_steps);
  for (std::size_t i = 0; i < shown; ++i) row(a_.steps[i], false);
  out("</table></div>\n");
  if (shown < a_.steps.size()) out("<p class=\"note\">{} more steps not listed.</p>\n", a_.steps.size() - shown);
}

void html_writer::idle_table() {
  out("<h2>Where the GPU's idle time went</h2>\n");
  if (a_.idle.empty()) {
    out("<p>No CPU range or blocking call covered the GPU's idle time.</p>\n");
    return;
  }
  out("<table id=\"idle\"><tr><th>thread</th><th>CPU activity</th><th>idle ms</th><th>share of idle</th></tr>\n");
  for (const idle_attribution& i : a_.idle) {
    out("<tr><td>");
    text(i.thread);
    if (i.main_thread) out(" <small>(main)</small>");
    out("</td><td>");
    text(i.activity);
    // A call that waited for the GPU covers idle the GPU caused itself; a range covers CPU work.
    if (i.blocking) out(" <small>(waits for the GPU)</small>");
    out("</td><td class=\"n\">{}</td><td class=\"n\">{}</td></tr>\n", fmt_ms(i.idle_ms), fmt_pct(i.fraction_of_idle));
  }
  out("</table>\n");
}

void html_writer::metadata_table() {
  if (t_.metadata.empty()) return;
  out("<h2>Trace metadata</h2>\n<table id=\"metadata\">\n");
  std::size_t n = 0;
  for (const auto& [k, v] : t_.metadata) {
    if (++n > max_metadata) break;
    out("<tr><th>");
    text(clip(k, 200));
    out("</th><td>");
    text(clip(v, 2000));
    out("</td></tr>\n");
  }
  out("</table>\n");
}

// Measures what the browser drew, for the headless-browser test and for a reader who doubts the page.
void html_writer::script() {
  out("{}",
      "<pre id=\"render-check\"></pre>\n<script>\n"
      "window.addEventListener('load', function () {\n"
      "  function drawn(id, sel) {\n"
      "    var svg = document.getElementById(id), n = 0;\n"
      "    if (!svg) return 0;\n"
      "    svg.querySelectorAll(sel).forEach(function (r) { if (r.getBBox().width > 0) ++n; });\n"
      "    return n;\n"
      "  }\n"
      "  var widths = [];\n"
      "  document.querySelectorAll('svg').forEach(function (s) {\n"
      "    widths.push(Math.round(s.getBoundingClientRect().width));\n"
      "  });\n"
      "  document.getElementById('render-check').textContent = JSON.stringify({\n"
      "    timeline_rects: drawn('timeline', 'rect[data-kind]'),\n"
      "    bar_rects: drawn('bars', 'rect[data-category]'),\n"
      "    svg_widths: widths\n"
      "  });\n"
      "  document.body.dataset.rendered = 'ok';\n"
      "});\n"
      "</script>\n");
}

std::string html_writer::render() {
  s_.reserve(64 * 1024);
  head();
  out("<body>\n");
  header();
  findings();
  bar_chart();
  timeline_svg();
  breakdown_table();
  idle_table();
  metadata_table();
  script();
  out("</body>\n</html>\n");
  return std::move(s_);
}

}  // namespace

std::string to_html(const timeline& t, const analysis& a) { return html_writer(t, a).render(); }

void write_html_report(const timeline& t, const analysis& a, const std::filesystem::path& path) {
  const std::string html = to_html(t, a);
  errno = 0;
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  auto fail = [&](const char* what) {
    const int err = errno != 0 ? errno : EIO;
    throw std::system_error(err, std::generic_category(),
                            fmt::format("cannot {} the HTML report {}", what, path.string()));
  };
  if (!f) fail("create");
  f.write(html.data(), static_cast<std::streamsize>(html.size()));
  f.close();
  if (!f) fail("write");
}

}  // namespace ferry::trace
