// analyze(): the model of the timeline, then every rule on it.
#include "ferry/analyze/analyze.hpp"

#include "model.hpp"
#include "rules.hpp"

namespace ferry::trace {

analysis analyze(const timeline& t, const analyze_options& opts) {
  detail::model m(t, opts);
  std::vector<finding> findings = detail::find_all(m);
  analysis a = std::move(m).take_summary();
  a.findings = std::move(findings);
  a.skipped = t.skipped;
  return a;
}

}  // namespace ferry::trace
