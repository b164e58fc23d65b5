#include "ferry/bench/bench_trace.hpp"

#include <fmt/format.h>

#include <utility>

#include "ferry/core/error.hpp"

namespace ferry::bench {

level_tracer::level_tracer(device& dev, const trace_options& opts, std::string bench, std::string level)
    : dev_(dev), opts_(opts), bench_(std::move(bench)), level_(std::move(level)) {
  if (opts_.enabled) recorder_.emplace(opts_.capacity);
}

level_tracer::~level_tracer() {
  if (!recorder_ || !dev_.tracing()) return;
  // A level that threw inside its window: detach before the recorder goes.
  recorder_->stop();
  try {
    dev_.trace_end();
  } catch (const std::exception& e) {
    detail::report_destructor_error(e.what(), std::source_location::current());
  }
}

void level_tracer::begin() {
  if (!recorder_) return;
  recorder_->name_thread(trace::this_thread_id(), "main");
  recorder_->set_metadata("bench", bench_);
  recorder_->set_metadata("level", level_);
  scope_.emplace(*recorder_);
  dev_.trace_begin(*recorder_);
  recorder_->start();
}

void level_tracer::end() {
  if (!recorder_ || !recorder_->capturing()) return;
  recorder_->stop();
  dev_.trace_end();  // flushes activity of the window still buffered (CUPTI)
  scope_.reset();
  const device_info info = dev_.info();
  timeline_ =
      recorder_->take(info.kind == backend::cuda ? "ferry cuda (CUPTI)" : "ferry host backend", info.name);
}

std::optional<level_trace> level_tracer::finish(double link_h2d_gbps, double link_d2h_gbps) {
  if (!timeline_) return std::nullopt;
  level_trace out;
  out.level = level_;
  out.timeline = std::move(*timeline_);
  timeline_.reset();
  out.timeline.link_h2d_gbps = link_h2d_gbps;
  out.timeline.link_d2h_gbps = link_d2h_gbps;
  try {
    out.analysis = trace::analyze(out.timeline, opts_.analyze);
  } catch (const input_error& e) {
    out.analysis_error = e.what();
  }
  return out;
}

std::string expected_finding_of(const std::vector<level_info>& levels, const std::string& level) {
  for (const auto& l : levels)
    if (l.name == level) return l.expected_finding;
  return {};
}

std::pair<std::string, std::string> keep_trace(std::optional<level_trace> traced,
                                               std::vector<level_trace>& traces) {
  if (!traced) return {};
  std::pair<std::string, std::string> first;
  if (traced->analysis) {
    first = {traced->analysis->bottleneck(), traced->analysis->findings.front().title};
  } else {
    first.second = traced->analysis_error;
  }
  traces.push_back(std::move(*traced));
  return first;
}

std::string format_findings(const std::vector<level_trace>& traces, const std::vector<level_info>& levels) {
  if (traces.empty()) return {};
  std::string out = "\ntrace analysis: what bounds each level (the next level removes it)\n";
  for (const auto& t : traces) {
    if (!t.analysis) {
      out += fmt::format("{:<10} (not analyzed: {})\n", t.level, t.analysis_error);
      continue;
    }
    const trace::finding& f = t.analysis->findings.front();
    const std::string want = expected_finding_of(levels, t.level);
    out += fmt::format("{:<10} {:<20} {}{}\n", t.level, f.rule, f.title,
                       want.empty() || want == f.rule ? "" : fmt::format("  [ladder expects {}]", want));
    out += fmt::format("{:<10} {:<20} fix: {}\n", "", "", f.fix);
  }
  return out;
}

}  // namespace ferry::bench
