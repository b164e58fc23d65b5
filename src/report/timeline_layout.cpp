// The timeline's layout: the window, the tracks and their events in it, the idle gaps of GPU tracks, the
// rows of rects (nested CPU ranges stack downwards, sub-pixel events merge into runs), and the rect cap.
#include "timeline_layout.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstddef>
#include <limits>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "ferry/trace/names.hpp"

namespace ferry::trace::html {

kind kind_classifier::operator()(const event& e) {
  switch (e.kind) {
    case activity::kernel: {
      if (comm_.size() < t_.strings.size()) comm_.resize(t_.strings.size(), -1);
      if (e.name >= comm_.size()) return kind::kernel;
      auto& c = comm_[e.name];
      if (c < 0) c = is_comm_kernel(t_.strings[e.name]) ? 1 : 0;
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

namespace {

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
    std::nth_element(tr.idle.begin(), tr.idle.begin() + static_cast<std::ptrdiff_t>(budget), tr.idle.end(),
                     wider);
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

// Builds every track's rows within max_timeline_rects. Sets the rect and merge counts of `l`.
void fit_to_cap(timeline_layout& l, const timeline& t, const std::vector<std::vector<kind>>& kinds_of) {
  const window& w = l.w;
  // The rect cap. Every track gets a fair share, tracks needing less giving theirs to the others (water
  // filling, smallest first). A track over its share merges coarser (runs up to 2, 4, 8, 16 px) and, when
  // still over, each of its rows keeps its widest rects.
  auto& tracks = l.tracks;
  std::vector<std::size_t> counts(tracks.size());
  std::vector<double> merge_of(tracks.size(), min_px);
  std::size_t total = 0;
  for (std::size_t ti = 0; ti < tracks.size(); ++ti) {
    counts[ti] = build_rows(tracks[ti], t, w, min_px, kinds_of[ti]);
    total += counts[ti];
  }
  if (total > max_timeline_rects) {
    std::vector<std::size_t> order(tracks.size());
    for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::sort(order.begin(), order.end(),
              [&](std::size_t x, std::size_t y) { return counts[x] < counts[y]; });
    std::size_t budget = max_timeline_rects;
    for (std::size_t n = 0; n < order.size(); ++n) {
      const std::size_t ti = order[n];
      track& tr = tracks[ti];
      const std::size_t share = budget / (order.size() - n);
      for (double px = 2 * min_px; counts[ti] > share && px <= 16; px *= 2) {
        counts[ti] = build_rows(tr, t, w, px, kinds_of[ti]);
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
              l.omitted_events += it->count;
            l.omitted_rects += r.size() - row_share;
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
  for (std::size_t ti = 0; ti < tracks.size(); ++ti) {
    l.drawn += counts[ti];
    l.merge_px = std::max(l.merge_px, merge_of[ti]);
    for (const auto& r : tracks[ti].rows)
      for (const item& it : r) l.merged_events += it.count > 1 ? it.count : 0;
  }
}

}  // namespace

timeline_layout lay_out_timeline(const timeline& t, const analysis& a, kind_classifier& kind_of) {
  timeline_layout l;
  l.w = window_of(t, a);
  track_set ts = tracks_of(t, l.w);
  l.tracks = std::move(ts.tracks);
  l.hidden_tracks = ts.hidden_tracks;
  l.hidden_events = ts.hidden_events;
  l.in_window = ts.in_window;
  auto& tracks = l.tracks;

  std::size_t gpu_tracks = 0;
  for (const track& tr : tracks) gpu_tracks += tr.gpu ? 1 : 0;
  if (gpu_tracks > 0) {
    for (track& tr : tracks)
      if (tr.gpu) find_idle(tr, t, l.w, std::max<std::size_t>(8, max_idle_rects / gpu_tracks));
  }

  std::vector<std::vector<kind>> kinds_of(tracks.size());
  for (std::size_t ti = 0; ti < tracks.size(); ++ti) {
    kinds_of[ti].reserve(tracks[ti].events.size());
    for (const std::uint32_t i : tracks[ti].events) {
      kinds_of[ti].push_back(kind_of(t.events[i]));
      ++l.kind_seen[static_cast<std::size_t>(kinds_of[ti].back())];
    }
  }
  fit_to_cap(l, t, kinds_of);

  double y = tl_axis_h;
  for (track& tr : tracks) {
    tr.y = y;
    y += static_cast<double>(std::max<std::size_t>(1, tr.rows.size())) * tl_row_h + tl_track_gap;
  }
  l.width = tl_label_w + tl_plot_w + tl_right_pad;
  l.height = y + 8;
  return l;
}

}  // namespace ferry::trace::html
