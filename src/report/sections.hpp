// The report's sections that draw (private to ferry::report); document.cpp writes the rest and puts
// them in order.
#pragma once

#include "ferry/analyze/analyze.hpp"
#include "ferry/trace/timeline.hpp"
#include "html_text.hpp"

namespace ferry::trace::html {

/// "Per-step breakdown": a stacked bar per step (the first max_bars) and one for the mean (charts.cpp).
void write_bar_chart(writer& o, const analysis& a);

/// "Timeline": the first steps' window, a track per GPU stream and CPU thread (timeline_svg.cpp).
void write_timeline(writer& o, const timeline& t, const analysis& a);

}  // namespace ferry::trace::html
