// `ferry bench ... --trace`: each ladder level's timed steps recorded on the device's timeline (CUPTI on
// cuda, the emulated streams on the host backend, ferry's stage spans on both) and analyzed, so every
// row names what bounds it.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ferry/analyze/analyze.hpp"
#include "ferry/device/device.hpp"
#include "ferry/trace/timeline.hpp"

namespace ferry::bench {

/// A ladder level: what it does, what bounds it, and the analyzer's rule for that bottleneck (the first
/// finding of its trace).
struct level_info {
  std::string name;
  std::string what;
  std::string bottleneck;
  std::string expected_finding;
};

/// The expected finding of `level` among `levels`; empty for an unknown level.
[[nodiscard]] std::string expected_finding_of(const std::vector<level_info>& levels,
                                              const std::string& level);

struct trace_options {
  bool enabled = false;
  std::size_t capacity = trace::recorder::default_capacity;  // events per level
  trace::analyze_options analyze;
};

/// One level's recording and its analysis.
struct level_trace {
  std::string level;
  trace::timeline timeline;
  std::optional<trace::analysis> analysis;  // empty when the analyzer refused the timeline
  std::string analysis_error;               // why, then
};

/// Records one level's timed window. begin() at the window's start (after the warm-up, the device
/// synchronized), end() at its end (the device synchronized again). Does nothing when tracing is off.
class level_tracer {
 public:
  level_tracer(device& dev, const trace_options& opts, std::string bench, std::string level);
  level_tracer(const level_tracer&) = delete;
  level_tracer& operator=(const level_tracer&) = delete;
  ~level_tracer();

  void begin();
  void end();
  /// The recorded timeline (after end()), with the link ceilings it is compared with, analyzed.
  [[nodiscard]] std::optional<level_trace> finish(double link_h2d_gbps, double link_d2h_gbps);

 private:
  device& dev_;
  const trace_options& opts_;
  std::string bench_;
  std::string level_;
  std::optional<trace::recorder> recorder_;
  std::optional<trace::recording_scope> scope_;
  std::optional<trace::timeline> timeline_;
};

/// Moves a level's trace (if it was traced) into `traces`; returns its first finding's rule and title, or
/// an empty rule and the analyzer's refusal.
[[nodiscard]] std::pair<std::string, std::string> keep_trace(std::optional<level_trace> traced,
                                                             std::vector<level_trace>& traces);

/// The text section under a ladder's table: each traced level's first finding, and the rule the ladder
/// expects there where the two differ.
[[nodiscard]] std::string format_findings(const std::vector<level_trace>& traces,
                                          const std::vector<level_info>& levels);

}  // namespace ferry::bench
