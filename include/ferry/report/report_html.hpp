// A standalone HTML report of an analysis: the findings, an SVG timeline (a track per GPU stream and per
// CPU thread, steps marked) and an SVG stacked bar chart of each step's breakdown. One file, no script
// or style fetched from anywhere.
//
// Host only.
#pragma once

#include <filesystem>
#include <string>

#include "ferry/analyze/analyze.hpp"
#include "ferry/trace/timeline.hpp"

namespace ferry::trace {

/// The report as one HTML document.
[[nodiscard]] std::string to_html(const timeline& t, const analysis& a);
/// Writes to_html(t, a) to `path`. Throws std::system_error naming the path.
void write_html_report(const timeline& t, const analysis& a, const std::filesystem::path& path);

}  // namespace ferry::trace
