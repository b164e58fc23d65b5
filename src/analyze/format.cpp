// The analysis as text (the CLI's report) and as JSON (the same content, for scripts and the report page).
#include <fmt/format.h>

#include <cstddef>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/analyze/analyze.hpp"
#include "ferry/core/units.hpp"
#include "wording.hpp"

namespace ferry::trace {

namespace {

using detail::ms_text;
using detail::pct;

nlohmann::json step_json(const step_breakdown& b) {
  return {{"index", b.index},         {"start_ns", b.start_ns},       {"end_ns", b.end_ns},
          {"wall_ms", b.wall_ms},     {"compute_ms", b.compute_ms},   {"comm_ms", b.comm_ms},
          {"d2d_ms", b.d2d_ms},       {"h2d_ms", b.h2d_ms},           {"d2h_ms", b.d2h_ms},
          {"idle_ms", b.idle_ms},     {"utilization", b.utilization}, {"copy_overlap", b.copy_overlap},
          {"h2d_bytes", b.h2d_bytes}, {"d2h_bytes", b.d2h_bytes}};
}

std::string step_row(std::string_view label, const step_breakdown& b) {
  return fmt::format(
      "  {:<6} {:>9.2f} {:>9.2f} {:>7.2f} {:>7.2f} {:>7.2f} {:>7.2f} {:>9.2f} {:>6} {:>8} {:>10} {:>10}\n",
      label, b.wall_ms, b.compute_ms, b.comm_ms, b.d2d_ms, b.h2d_ms, b.d2h_ms, b.idle_ms, pct(b.utilization),
      pct(b.copy_overlap), format_bytes(b.h2d_bytes), format_bytes(b.d2h_bytes));
}

// Why the main thread is the main thread, for the text report.
std::string main_thread_reason(std::string_view rule, std::string_view step_prefix) {
  if (rule == "step_spans") return fmt::format("it holds the '{}' step spans", step_prefix);
  if (rule == "tid_is_pid") return "its thread id is its process id";
  if (rule == "most_annotations") return "it issues the most annotations";
  if (rule == "most_api_calls") return "it issues the most CUDA API calls";
  if (rule == "autograd_only") return "the autograd engine's thread: no other thread qualifies";
  return std::string(rule);
}

nlohmann::json neighbours_json(const std::vector<idle_neighbour>& ns) {
  nlohmann::json j = nlohmann::json::array();
  for (const idle_neighbour& n : ns)
    j.push_back({{"activity", n.activity}, {"gaps", n.gaps}, {"idle_ms", n.idle_ms}});
  return j;
}

std::string neighbours_text(const std::vector<idle_neighbour>& ns) {
  std::string out;
  for (const idle_neighbour& n : ns)
    out += fmt::format("{}'{}' {:.2f} ms", out.empty() ? "" : ", ", n.activity, n.idle_ms);
  return out;
}

}  // namespace

std::string format_text(const analysis& a) {
  std::string out =
      fmt::format("ferry trace analysis: {} on {}\n", a.source.empty() ? "(unnamed source)" : a.source,
                  a.device_name.empty() ? "(unnamed device)" : a.device_name);
  if (a.step_prefix.empty()) {
    out += "steps: none found; the whole trace (first to last GPU activity) is analyzed as one step\n";
  } else {
    out += fmt::format("steps: {} ('{}' spans{})\n", a.steps.size(), a.step_prefix,
                       a.main_thread.empty() ? "" : fmt::format(" on {}", a.main_thread));
  }
  if (!a.main_thread.empty())
    out += fmt::format("main thread: {} ({})\n", a.main_thread,
                       main_thread_reason(a.main_thread_rule, a.step_prefix));
  if (a.dropped > 0)
    out +=
        fmt::format("warning: the recorder dropped {} events; the analysis may miss activity\n", a.dropped);
  for (const auto& [reason, count] : a.skipped)
    out += fmt::format("note: skipped {} record{} of the input: {}\n", count, count == 1 ? "" : "s", reason);
  out += "\nGPU time per step (ms; categories exclusive in this order)\n";
  out += fmt::format("  {:<6} {:>9} {:>9} {:>7} {:>7} {:>7} {:>7} {:>9} {:>6} {:>8} {:>10} {:>10}\n", "step",
                     "wall", "compute", "comm", "d2d", "h2d", "d2h", "idle", "busy", "overlap", "h2d bytes",
                     "d2h bytes");
  out += step_row("mean", a.mean);
  constexpr std::size_t max_rows = 10;
  for (std::size_t i = 0; i < a.steps.size() && i < max_rows; ++i)
    out += step_row(std::to_string(a.steps[i].index), a.steps[i]);
  if (a.steps.size() > max_rows) out += fmt::format("  ... {} more steps\n", a.steps.size() - max_rows);
  out += "\nGPU idle covered by CPU activity (top 5)\n";
  if (a.idle.empty()) out += "  (none: no CPU range or blocking call covered the idle time)\n";
  for (std::size_t i = 0; i < a.idle.size() && i < 5; ++i) {
    const idle_attribution& x = a.idle[i];
    out += fmt::format("  {:>9.2f} ms {:>5}  {}{}: '{}'{}\n", x.idle_ms, pct(x.fraction_of_idle), x.thread,
                       x.main_thread ? " (main)" : "", x.activity, x.blocking ? " (blocking)" : "");
  }
  if (a.uncovered.idle_ms > 0) {
    out += fmt::format("  {:>9.2f} ms {:>5}  {} (main): no recorded activity, in {} stretch{}\n",
                       a.uncovered.idle_ms, pct(a.uncovered.fraction_of_idle), a.main_thread,
                       a.uncovered.gaps, a.uncovered.gaps == 1 ? "" : "es");
    if (!a.uncovered.before.empty())
      out += fmt::format("               just before: {}\n", neighbours_text(a.uncovered.before));
    if (!a.uncovered.after.empty())
      out += fmt::format("               just after: {}\n", neighbours_text(a.uncovered.after));
  }
  out += "\nFindings (costliest first)\n";
  for (std::size_t i = 0; i < a.findings.size(); ++i) {
    const finding& f = a.findings[i];
    out += fmt::format("  {}. [{}] {}\n", i + 1, f.rule, f.title);
    if (f.cost_ms_per_step > 0)
      out += fmt::format("     cost: about {} of GPU time per step\n", ms_text(f.cost_ms_per_step));
    out += fmt::format("     evidence: {}\n     fix: {}\n", f.evidence, f.fix);
  }
  return out;
}

std::string to_json(const analysis& a) {
  nlohmann::json j;
  j["source"] = a.source;
  j["device_name"] = a.device_name;
  j["dropped"] = a.dropped;
  j["skipped"] = a.skipped;
  j["step_prefix"] = a.step_prefix;
  j["main_thread"] = a.main_thread;
  j["main_thread_rule"] = a.main_thread_rule;
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
                         {"main_thread", x.main_thread},
                         {"work", x.work}});
  j["uncovered"] = {{"idle_ms", a.uncovered.idle_ms},
                    {"fraction_of_idle", a.uncovered.fraction_of_idle},
                    {"gaps", a.uncovered.gaps},
                    {"before", neighbours_json(a.uncovered.before)},
                    {"after", neighbours_json(a.uncovered.after)}};
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
