// The timeline section: the note on what is drawn, the legend of the kinds seen, and the SVG of the
// layout (timeline_layout.cpp): a time axis, a labelled band per track with its idle gaps shaded, a rect
// per event or merged run with a tooltip, and the step boundaries.
#include <fmt/format.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "ferry/core/units.hpp"
#include "html_text.hpp"
#include "palette.hpp"
#include "sections.hpp"
#include "timeline_layout.hpp"

namespace ferry::trace::html {

namespace {

constexpr std::size_t max_title_chars = 64;  // names in tooltips (rects of merged runs: half)
constexpr std::size_t max_label_chars = 34;  // track labels

std::string_view safe_name(const timeline& t, std::uint32_t id) {
  return id < t.strings.size() ? t.strings[id] : std::string_view("?");
}

std::string event_title(const timeline& t, const event& e, kind k, std::size_t name_chars) {
  std::string title = clip(safe_name(t, e.name), name_chars);
  if (title.empty()) title = info(k).key;
  const auto dur = std::max<std::int64_t>(0, e.duration_ns());
  title += fmt::format(" \xC2\xB7 {} \xC2\xB7 {}", info(k).label,
                       format_duration_ns(static_cast<std::uint64_t>(dur)));
  if (e.bytes > 0) {
    title += fmt::format(" \xC2\xB7 {}", format_bytes(e.bytes));
    if (dur > 0)
      title += fmt::format(" \xC2\xB7 {:.2f} GB/s", static_cast<double>(e.bytes) / static_cast<double>(dur));
  }
  if (e.kind == activity::memcpy && (e.src != mem_kind::unknown || e.dst != mem_kind::unknown))
    title +=
        fmt::format(" \xC2\xB7 {} to {}{}", to_string(e.src), to_string(e.dst), e.async ? ", async" : "");
  if (e.sync != sync_kind::none) title += fmt::format(" \xC2\xB7 waits on {}", to_string(e.sync));
  return title;
}

}  // namespace

void write_timeline(writer& o, const timeline& t, const analysis& a) {
  o.out("<h2>Timeline</h2>\n");
  if (t.events.empty()) {
    o.out("<p>The trace holds no events.</p>\n");
    return;
  }
  kind_classifier kind_of(t);
  const timeline_layout l = lay_out_timeline(t, a, kind_of);
  const double span_ms = l.w.span() / 1e6;

  o.out("<p class=\"note\">");
  if (l.w.steps > 0)
    o.out("Steps {} to {} of {} ({} ms). ", a.steps.front().index, a.steps[l.w.steps - 1].index,
          a.steps.size(), fmt_ms(span_ms));
  else
    o.out("The whole trace ({} ms). ", fmt_ms(span_ms));
  o.out("{} of {} events lie in this window, drawn as {} rects", l.in_window, t.events.size(), l.drawn);
  if (l.merged_events > 0)
    o.out("; {} events narrower than {} merged into runs, drawn lighter the less of the run they keep busy",
          l.merged_events,
          l.merge_px > min_px ? fmt::format("{:.0f} px (on the busiest tracks) are", l.merge_px)
                              : std::string("a pixel are"));
  if (l.omitted_rects > 0)
    o.out(
        "; <b id=\"omitted\">{} rects ({} events) omitted</b> over the cap of {} rects "
        "(the narrowest go first)",
        l.omitted_rects, l.omitted_events, max_timeline_rects);
  if (l.hidden_tracks > 0)
    o.out("; {} more tracks ({} events) not drawn: at most {} tracks", l.hidden_tracks, l.hidden_events,
          max_tracks);
  o.out(
      ". Shaded: GPU stream idle. Dashed lines: step boundaries. Hover a rect for its name, duration and "
      "bytes.</p>\n<div class=\"legend\">");
  for (std::size_t k = 0; k < kind_count; ++k)
    if (l.kind_seen[k] > 0) o.out("<span><i class=\"k-{}\"></i>{}</span>", kinds[k].key, kinds[k].label);
  o.out("<span><i class=\"k-idle\"></i>GPU stream idle</span></div>\n");

  o.out(
      "<svg id=\"timeline\" width=\"{0:.0f}\" height=\"{1:.0f}\" viewBox=\"0 0 {0:.0f} {1:.0f}\" "
      "data-rects=\"{2}\" data-tracks=\"{3}\" role=\"img\" aria-label=\"timeline\">\n",
      l.width, l.height, l.drawn, l.tracks.size());

  // Time axis in ms from the window's start.
  const double tick = nice_step(span_ms, 10);
  for (double v = 0; v <= span_ms * (1 + 1e-9); v += tick) {
    const double x = tl_label_w + v / span_ms * tl_plot_w;
    o.out("<line class=\"grid\" x1=\"{0:.1f}\" x2=\"{0:.1f}\" y1=\"{1:.0f}\" y2=\"{2:.0f}\"/>", x,
          tl_axis_h - 6, l.height - 4);
    o.out("<text x=\"{:.1f}\" y=\"{:.0f}\" text-anchor=\"middle\">{}</text>\n", x, tl_axis_h - 10,
          fmt_tick(v, tick));
  }
  o.out("<text x=\"{:.0f}\" y=\"{:.0f}\" text-anchor=\"end\">ms</text>\n", tl_label_w - 12, tl_axis_h - 10);
  o.out("<line class=\"axis\" x1=\"{0:.0f}\" x2=\"{1:.0f}\" y1=\"{2:.0f}\" y2=\"{2:.0f}\"/>\n", tl_label_w,
        tl_label_w + tl_plot_w, tl_axis_h - 4);

  for (const track& tr : l.tracks) {
    const double rows_h = static_cast<double>(std::max<std::size_t>(1, tr.rows.size())) * tl_row_h;
    o.out("<g class=\"track\" data-track=\"{}:{}{}\">", tr.gpu ? "gpu" : "cpu",
          tr.gpu ? std::to_string(tr.device) + ":" : std::string(), tr.id);
    o.out("<line class=\"sep\" x1=\"0\" x2=\"{:.0f}\" y1=\"{:.1f}\" y2=\"{:.1f}\"/>", l.width,
          tr.y - tl_track_gap / 2, tr.y - tl_track_gap / 2);
    o.out("<text x=\"4\" y=\"{:.1f}\">", tr.y + 11);
    o.text(clip(tr.label, max_label_chars));
    o.out("<title>");
    o.text(tr.label);
    o.out(": {} events in the trace</title></text>\n", tr.total_events);
    for (const auto& [x0, x1] : tr.idle)
      o.out(
          "<rect class=\"idle\" x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.0f}\">"
          "<title>idle {} ms</title></rect>\n",
          x0, tr.y, x1 - x0, rows_h, fmt_ms((x1 - x0) / tl_plot_w * span_ms));
    for (std::size_t r = 0; r < tr.rows.size(); ++r) {
      const double ry = tr.y + static_cast<double>(r) * tl_row_h + 1;
      for (const item& it : tr.rows[r]) {
        const event& e = t.events[it.longest];
        const kind k = kind_of(e);
        const double rect_w = std::max(it.x1 - it.x0, min_px);
        o.out("<rect data-kind=\"{}\" x=\"{:.1f}\" y=\"{:.0f}\" width=\"{:.1f}\" height=\"{:.0f}\"",
              info(k).key, it.x0, ry, rect_w, tl_row_h - 2);
        if (it.count > 1) {
          // A run shows how busy it is: the fraction of its span its events cover.
          const double busy = static_cast<double>(it.busy_ns) / (rect_w / tl_plot_w * l.w.span());
          if (busy < 0.9) o.out(" fill-opacity=\"{:.2f}\"", std::clamp(busy, 0.25, 1.0));
        }
        o.out("><title>");
        if (it.count == 1) {
          o.text(event_title(t, e, k, max_title_chars));
        } else {
          o.out("{} events merged (", it.count);
          bool first = true;
          for (std::size_t kk = 0; kk < kind_count; ++kk)
            if ((it.kind_mask & (1u << kk)) != 0) {
              o.out("{}{}", first ? "" : ", ", kinds[kk].key);
              first = false;
            }
          o.out(") \xC2\xB7 busy {}", format_duration_ns(static_cast<std::uint64_t>(it.busy_ns)));
          if (it.bytes > 0) o.out(" \xC2\xB7 {}", format_bytes(it.bytes));
          o.out(" \xC2\xB7 longest {}: ",
                format_duration_ns(static_cast<std::uint64_t>(std::max<std::int64_t>(0, e.duration_ns()))));
          o.text(clip(safe_name(t, e.name), max_title_chars / 2));
        }
        o.out("</title></rect>\n");
      }
    }
    o.out("</g>\n");
  }

  // Step boundaries over the tracks, labelled above the axis.
  std::size_t lines = 0;
  for (const step_breakdown& s : a.steps) {
    if (lines >= 200) break;
    if (s.start_ns >= l.w.w1 || s.end_ns < l.w.w0) continue;
    ++lines;
    const double xs = l.w.x_of(s.start_ns);
    o.out("<line class=\"step\" data-step=\"{0}\" x1=\"{1:.1f}\" x2=\"{1:.1f}\" y1=\"12\" y2=\"{2:.0f}\"/>",
          s.index, xs, l.height - 4);
    o.out("<line class=\"step\" x1=\"{0:.1f}\" x2=\"{0:.1f}\" y1=\"12\" y2=\"{1:.0f}\"/>", l.w.x_of(s.end_ns),
          l.height - 4);
    o.out("<text x=\"{:.1f}\" y=\"11\">step {}</text>\n", xs + 3, s.index);
  }
  o.out("</svg>\n");
}

}  // namespace ferry::trace::html
