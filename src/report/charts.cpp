// The step breakdown as a chart: a stacked bar per step, categories bottom to top in the analyzer's order,
// the mean bar last (over all steps, however many the chart shows).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <string>

#include "html_text.hpp"
#include "palette.hpp"
#include "sections.hpp"

namespace ferry::trace::html {

namespace {

constexpr std::size_t max_bars = 2000;  // steps in the bar chart (the mean comes on top)

}  // namespace

void write_bar_chart(writer& o, const analysis& a) {
  o.out("<h2>Per-step breakdown</h2>\n<div class=\"legend\">");
  for (const auto& c : categories) o.out("<span><i class=\"c-{0}\"></i>{0}</span>", c.key);
  o.out("</div>\n");
  if (a.steps.empty()) {
    o.out("<p>No steps.</p>\n");
    return;
  }
  const std::size_t shown = std::min(a.steps.size(), max_bars);
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
  double max_ms = total(a.mean);
  for (std::size_t i = 0; i < shown; ++i) max_ms = std::max(max_ms, total(a.steps[i]));
  if (!(max_ms > 0)) max_ms = 1;
  const double tick = nice_step(max_ms, 6);
  const double y_max = std::ceil(max_ms / tick) * tick;
  auto y_of = [&](double ms) { return top + plot_h - ms / y_max * plot_h; };

  if (shown < a.steps.size())
    o.out(
        "<p class=\"note\">The chart shows the first {} of {} steps; the mean bar is over all of them.</p>\n",
        shown, a.steps.size());
  o.out(
      "<div class=\"scroll\"><svg id=\"bars\" width=\"{0:.0f}\" height=\"{1:.0f}\" viewBox=\"0 0 {0:.0f} "
      "{1:.0f}\" "
      "data-bars=\"{2}\" role=\"img\" aria-label=\"GPU time per step\">\n",
      width, height, bars);
  for (double v = 0; v <= y_max + tick / 2; v += tick) {
    const double y = y_of(v);
    o.out("<line class=\"grid\" x1=\"{:.1f}\" x2=\"{:.1f}\" y1=\"{:.1f}\" y2=\"{:.1f}\"/>", left,
          left + plot_w, y, y);
    o.out("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"end\">{}</text>\n", left - 6, y + 4,
          fmt_tick(v, tick));
  }
  o.out("<text transform=\"translate(14 {:.1f}) rotate(-90)\" text-anchor=\"middle\">ms per step</text>\n",
        top + plot_h / 2);

  // Labels at least ~28 px apart.
  const std::size_t label_every = std::max<std::size_t>(1, static_cast<std::size_t>(std::ceil(28.0 / slot)));
  auto bar = [&](const step_breakdown& s, std::size_t slot_index, const std::string& step_key) {
    const double x = left + slot * static_cast<double>(slot_index) + (slot - bar_w) / 2;
    const double wall = sane(s.wall_ms);
    o.out("<g class=\"bar\" data-step=\"{}\">", step_key);
    double acc = 0;
    for (const auto& c : categories) {
      const double ms = sane(s.*c.ms);
      if (ms <= 0) continue;
      const double y0 = y_of(acc);
      const double y1 = y_of(acc + ms);
      acc += ms;
      o.out(
          "<rect class=\"seg\" data-step=\"{}\" data-category=\"{}\" data-ms=\"{:.4f}\" x=\"{:.1f}\" "
          "y=\"{:.1f}\" "
          "width=\"{:.1f}\" height=\"{:.2f}\"><title>{} {}: {} {} ms{}</title></rect>",
          step_key, c.key, ms, x, y1, bar_w, std::max(0.0, y0 - y1), step_key == "mean" ? "mean" : "step",
          step_key == "mean" ? "of all steps" : step_key, c.key, fmt_ms(ms),
          wall > 0 ? fmt::format(" ({} of {} ms)", fmt_pct(ms / wall), fmt_ms(wall)) : std::string());
    }
    o.out("</g>\n");
  };
  for (std::size_t i = 0; i < shown; ++i) {
    const step_breakdown& s = a.steps[i];
    const std::string key = std::to_string(s.index);
    bar(s, i, key);
    if (i % label_every == 0)
      o.out("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\">{}</text>\n",
            left + slot * (static_cast<double>(i) + 0.5), top + plot_h + 14, key);
  }
  bar(a.mean, shown + 1, "mean");
  o.out("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\" font-weight=\"700\">mean</text>\n",
        left + slot * (static_cast<double>(shown + 1) + 0.5), top + plot_h + 14);
  o.out("<line class=\"axis\" x1=\"{0:.1f}\" x2=\"{0:.1f}\" y1=\"{1:.1f}\" y2=\"{2:.1f}\"/>", left, top,
        top + plot_h);
  o.out("<line class=\"axis\" x1=\"{0:.1f}\" x2=\"{1:.1f}\" y1=\"{2:.1f}\" y2=\"{2:.1f}\"/>\n", left,
        left + plot_w, top + plot_h);
  o.out("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\">step</text>\n", left + plot_w / 2,
        top + plot_h + 34);
  o.out("</svg></div>\n");
}

}  // namespace ferry::trace::html
