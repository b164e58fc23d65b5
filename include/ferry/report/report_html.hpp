// A standalone HTML report of an analysis: the findings, an SVG timeline (a track per GPU stream and per
// CPU thread, steps marked) and an SVG stacked bar chart of each step's breakdown. One file, no script
// or style fetched from anywhere, and no script at all unless the caller adds one (html_options).
//
// Host only.
#pragma once

#include <filesystem>
#include <string>
#include <string_view>

#include "ferry/analyze/analyze.hpp"
#include "ferry/trace/timeline.hpp"

namespace ferry::trace {

/// What to_html adds to the report beyond the analysis.
struct html_options {
  /// Markup placed as is (not escaped) at the end of <body>; it must come from the program, never from
  /// a trace. ferry's headless-browser test puts a layout probe here (a script that records what the
  /// browser drew); reports for readers leave it empty.
  std::string_view body_end;
};

/// The report as one HTML document.
[[nodiscard]] std::string to_html(const timeline& t, const analysis& a, const html_options& options = {});
/// Writes to_html(t, a, options) to `path` whole (a temporary in the same directory, renamed once
/// flushed). Throws std::system_error naming the path, and leaves no partial file.
void write_html_report(const timeline& t, const analysis& a, const std::filesystem::path& path,
                       const html_options& options = {});

}  // namespace ferry::trace
