// The report as a document: the head with its style (report.css, embedded at build time), the summary
// and the findings, the drawn sections (charts.cpp, timeline_svg.cpp) and the tables, in reading order.
#include "ferry/report/report_html.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <fstream>
#include <string>
#include <system_error>
#include <utility>

#include "ferry/core/atomic_file.hpp"
#include "ferry/core/units.hpp"
#include "ferry_embedded/report_css.hpp"
#include "html_text.hpp"
#include "palette.hpp"
#include "sections.hpp"

namespace ferry::trace {

namespace html {
namespace {

constexpr std::size_t max_table_steps = 1000;
constexpr std::size_t max_metadata = 64;

// report.css holds the fixed rules (among them the white stroke that keeps adjacent CPU spans of one
// colour apart); the colour of each category and kind follows from palette.hpp.
void write_head(writer& o, const timeline& t, const analysis& a) {
  o.out("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n");
  o.out("<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n");
  o.out("<title>ferry trace report: ");
  o.text(a.source.empty() ? t.source : a.source);
  o.out("</title>\n<style>\n");
  o.raw(embedded::report_css);
  for (const auto& c : categories)
    o.out("rect[data-category={0}],i.c-{0}{{fill:{1};background:{1}}}\n", c.key, c.colour);
  for (const auto& k : kinds)
    o.out("rect[data-kind={0}],i.k-{0}{{fill:{1};background:{1}}}\n", k.key, k.colour);
  o.out("i.k-idle{{background:#d0d0d0}}\n</style>\n</head>\n");
}

void write_header(writer& o, const timeline& t, const analysis& a) {
  const std::string& source = a.source.empty() ? t.source : a.source;
  const std::string& device = a.device_name.empty() ? t.device_name : a.device_name;
  o.out("<h1>ferry trace report</h1>\n<div class=\"meta\"><b>Source:</b> ");
  o.text(source.empty() ? "unknown" : source);
  o.out(" &nbsp; <b>Device:</b> ");
  o.text(device.empty() ? "unknown" : device);
  o.out(" &nbsp; <b>Steps:</b> {}", a.steps.size());
  if (!a.step_prefix.empty()) {
    o.out(" (spans named &ldquo;");
    o.text(a.step_prefix);
    o.out("&hellip;&rdquo;)");
  } else if (a.steps.size() == 1) {
    o.out(" (the whole trace as one step)");
  }
  if (!a.main_thread.empty()) {
    o.out(" &nbsp; <b>Main thread:</b> ");
    o.text(a.main_thread);
    o.out(" <small id=\"main-thread-rule\">(");
    o.text(a.main_thread_rule);
    o.out(")</small>");
  }
  o.out(" &nbsp; <b>Events:</b> {}</div>\n", t.events.size());

  const std::uint64_t dropped = a.dropped > 0 ? a.dropped : t.dropped;
  if (dropped > 0)
    o.out(
        "<div class=\"warn\" id=\"dropped\"><b>{} events were dropped</b> by the recorder (its buffer "
        "was full): the analysis may miss activity. Record fewer steps or raise the recorder's "
        "capacity.</div>\n",
        dropped);

  if (a.findings.empty()) {
    o.out("<div class=\"bottleneck\" id=\"bottleneck\">No finding");
    o.out("<small>the analysis named no bottleneck</small></div>\n");
    return;
  }
  const finding& f = a.findings.front();
  o.out("<div class=\"bottleneck\" id=\"bottleneck\" data-rule=\"");
  o.text(f.rule);
  o.out("\">Bottleneck: ");
  o.text(f.title);
  o.out("<small>rule <code>");
  o.text(f.rule);
  o.out("</code>");
  if (sane(f.cost_ms_per_step) > 0) o.out(" &middot; costs about {} ms per step", fmt_ms(f.cost_ms_per_step));
  if (sane(a.mean.wall_ms) > 0)
    o.out(" &middot; mean step {} ms, GPU utilization {}", fmt_ms(a.mean.wall_ms),
          fmt_pct(a.mean.utilization));
  o.out("</small></div>\n");
}

void write_findings(writer& o, const analysis& a) {
  o.out("<h2>Findings</h2>\n");
  if (a.findings.empty()) o.out("<p>No findings.</p>\n");
  std::size_t i = 0;
  for (const finding& f : a.findings) {
    o.out("<section class=\"finding\" data-rule=\"");
    o.text(f.rule);
    o.out("\"><h3>{}. ", ++i);
    o.text(f.title);
    o.out("</h3><div class=\"rule\">");
    o.text(f.rule);
    if (sane(f.cost_ms_per_step) > 0) o.out(" &middot; {} ms per step", fmt_ms(f.cost_ms_per_step));
    o.out("</div>\n");
    if (!f.evidence.empty()) {
      o.out("<p><b>Evidence:</b> ");
      o.text(f.evidence);
      o.out("</p>\n");
    }
    if (!f.fix.empty()) {
      o.out("<p><b>Fix:</b> ");
      o.text(f.fix);
      o.out("</p>\n");
    }
    if (!f.numbers.empty()) {
      o.out("<details><summary>numbers</summary><table>");
      for (const auto& [k, v] : f.numbers) {
        o.out("<tr><td>");
        o.text(k);
        o.out("</td><td class=\"n\">{}</td></tr>", std::isfinite(v) ? fmt::format("{:.6g}", v) : "n/a");
      }
      o.out("</table></details>\n");
    }
    o.out("</section>\n");
  }
}

void write_breakdown_table(writer& o, const analysis& a) {
  o.out("<h2>Breakdown table</h2>\n");
  if (a.steps.empty()) {
    o.out("<p>No steps.</p>\n");
    return;
  }
  o.out("<div class=\"scroll\"><table id=\"breakdown\"><tr><th>step</th><th>wall ms</th>");
  for (const auto& c : categories) o.out("<th>{} ms</th>", c.key);
  o.out("<th>utilization</th><th>copy overlap</th><th>h2d bytes</th><th>d2h bytes</th></tr>\n");
  auto row = [&](const step_breakdown& s, bool mean) {
    if (mean)
      o.out("<tr class=\"mean\"><td>mean</td>");
    else
      o.out("<tr><td>{}</td>", s.index);
    o.out("<td class=\"n\">{}</td>", fmt_ms(s.wall_ms));
    for (const auto& c : categories) o.out("<td class=\"n\">{}</td>", fmt_ms(s.*c.ms));
    o.out(
        "<td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td></tr>\n",
        fmt_pct(s.utilization), fmt_pct(s.copy_overlap), format_bytes(s.h2d_bytes),
        format_bytes(s.d2h_bytes));
  };
  row(a.mean, true);
  const std::size_t shown = std::min(a.steps.size(), max_table_steps);
  for (std::size_t i = 0; i < shown; ++i) row(a.steps[i], false);
  o.out("</table></div>\n");
  if (shown < a.steps.size())
    o.out("<p class=\"note\">{} more steps not listed.</p>\n", a.steps.size() - shown);
}

void write_idle_table(writer& o, const analysis& a) {
  o.out("<h2>Where the GPU's idle time went</h2>\n");
  if (a.idle.empty()) {
    o.out("<p>No CPU range or blocking call covered the GPU's idle time.</p>\n");
    return;
  }
  o.out("<table id=\"idle\"><tr><th>thread</th><th>CPU activity</th>");
  o.out("<th>idle ms</th><th>share of idle</th></tr>\n");
  for (const idle_attribution& i : a.idle) {
    o.out("<tr><td>");
    o.text(i.thread);
    if (i.main_thread) o.out(" <small>(main)</small>");
    o.out("</td><td>");
    o.text(i.activity);
    // A call that waited for the GPU covers idle the GPU caused itself; a range covers CPU work.
    if (i.blocking) o.out(" <small>(waits for the GPU)</small>");
    o.out("</td><td class=\"n\">{}</td><td class=\"n\">{}</td></tr>\n", fmt_ms(i.idle_ms),
          fmt_pct(i.fraction_of_idle));
  }
  // Idle while the main thread ran nothing the trace recorded (plain Python between operators, say).
  if (a.uncovered.idle_ms > 0) {
    o.out("<tr id=\"uncovered\"><td>");
    o.text(a.main_thread);
    o.out(" <small>(main)</small></td><td><i>no recorded activity</i>");
    if (!a.uncovered.before.empty()) {
      o.out(" <small>(just before: ");
      o.text(a.uncovered.before.front().activity);
      o.out(")</small>");
    }
    o.out("</td><td class=\"n\">{}</td><td class=\"n\">{}</td></tr>\n", fmt_ms(a.uncovered.idle_ms),
          fmt_pct(a.uncovered.fraction_of_idle));
  }
  o.out("</table>\n");
}

void write_metadata_table(writer& o, const timeline& t) {
  if (t.metadata.empty()) return;
  o.out("<h2>Trace metadata</h2>\n<table id=\"metadata\">\n");
  std::size_t n = 0;
  for (const auto& [k, v] : t.metadata) {
    if (++n > max_metadata) break;
    o.out("<tr><th>");
    o.text(clip(k, 200));
    o.out("</th><td>");
    o.text(clip(v, 2000));
    o.out("</td></tr>\n");
  }
  o.out("</table>\n");
}

}  // namespace
}  // namespace html

std::string to_html(const timeline& t, const analysis& a, const html_options& options) {
  html::writer o;
  o.reserve(64 * 1024);
  html::write_head(o, t, a);
  o.out("<body>\n");
  html::write_header(o, t, a);
  html::write_findings(o, a);
  html::write_bar_chart(o, a);
  html::write_timeline(o, t, a);
  html::write_breakdown_table(o, a);
  html::write_idle_table(o, a);
  html::write_metadata_table(o, t);
  o.raw(options.body_end);
  o.out("</body>\n</html>\n");
  return std::move(o).take();
}

void write_html_report(const timeline& t, const analysis& a, const std::filesystem::path& path,
                       const html_options& options) {
  // Under a temporary name until complete: a full disk leaves no partial report.
  write_file_atomically(path, to_html(t, a, options));
}

}  // namespace ferry::trace
