// The timeline's layout model (private to ferry::report): which window of the trace is drawn, a track per
// GPU stream and CPU thread, and each track's rows of rects in SVG units, within caps that keep the
// report small whatever the trace holds. timeline_svg.cpp draws it.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "ferry/analyze/analyze.hpp"
#include "ferry/trace/timeline.hpp"
#include "palette.hpp"

namespace ferry::trace::html {

// Bounds that keep the report small whatever the trace holds: a trace of millions of events still gives
// a file of a few MB that a browser opens at once.
inline constexpr std::size_t max_timeline_rects = 20000;  // event rects in the timeline
inline constexpr std::size_t max_idle_rects = 4000;       // idle shading rects in the timeline
inline constexpr std::size_t max_tracks = 256;
inline constexpr std::size_t max_cpu_rows =
    6;  // nesting depths drawn per CPU thread; deeper ranges share the last
inline constexpr std::size_t timeline_steps = 3;  // the timeline shows the first steps only

// Timeline geometry (SVG user units = CSS px at full width).
inline constexpr double tl_label_w = 230;
inline constexpr double tl_plot_w = 1100;
inline constexpr double tl_right_pad = 20;
inline constexpr double tl_axis_h = 44;
inline constexpr double tl_row_h = 14;
inline constexpr double tl_track_gap = 6;
inline constexpr double min_px = 1.0;  // events narrower than this merge with their neighbours

/// The kind an event is drawn as. Remembers per name whether it is a communication kernel's.
class kind_classifier {
 public:
  explicit kind_classifier(const timeline& t) : t_(t) {}
  [[nodiscard]] kind operator()(const event& e);

 private:
  const timeline& t_;
  std::vector<std::int8_t> comm_;  // per string id: -1 unknown, 0 no, 1 a communication kernel's name
};

/// One drawn rect: an event, or a run of sub-pixel events merged.
struct item {
  double x0 = 0;
  double x1 = 0;
  std::uint32_t longest = 0;  // index of the longest event in it
  std::uint32_t count = 0;
  std::int64_t busy_ns = 0;
  std::uint64_t bytes = 0;
  std::uint16_t kind_mask = 0;
};

/// A GPU stream or a CPU thread.
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

/// The timeline's window: the first steps analyzed, or the whole trace when there are none.
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
  [[nodiscard]] bool holds(const event& e) const {
    return e.start_ns < w1 && (e.end_ns > w0 || e.start_ns >= w0);
  }
};

/// The whole layout, ready to draw.
struct timeline_layout {
  window w;
  std::vector<track> tracks;                        // GPU first; at most max_tracks
  std::size_t hidden_tracks = 0;                    // beyond max_tracks
  std::size_t hidden_events = 0;                    // in the window, on tracks beyond max_tracks
  std::size_t in_window = 0;                        // events in the window
  std::array<std::size_t, kind_count> kind_seen{};  // events in the window per kind (drawn tracks)
  std::size_t drawn = 0;                            // rects
  std::size_t merged_events = 0;                    // events drawn as part of a run
  double merge_px = min_px;                         // the widest merge distance any track needed
  std::size_t omitted_rects = 0;                    // dropped by the cap
  std::size_t omitted_events = 0;
  double width = 0;
  double height = 0;
};

/// Lays out `t`'s timeline over the window `a` picks. `t` must hold events.
[[nodiscard]] timeline_layout lay_out_timeline(const timeline& t, const analysis& a,
                                               kind_classifier& kind_of);

}  // namespace ferry::trace::html
