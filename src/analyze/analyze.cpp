// analyze(): the model of the timeline, then every rule on it.
#include "ferry/analyze/analyze.hpp"

#include <string_view>

#include "model.hpp"
#include "rules.hpp"

namespace ferry::trace {

fix_wording wording_for(std::string_view source) noexcept {
  // The names the Chrome trace importer gives what it read (a ferry trace keeps the source it recorded).
  const bool imported = source.starts_with("pytorch profiler") || source == "chrome trace";
  return imported ? fix_wording::pytorch : fix_wording::cpp;
}

analysis analyze(const timeline& t, const analyze_options& opts) {
  detail::model m(t, opts);
  std::vector<finding> findings = detail::find_all(m);
  analysis a = std::move(m).take_summary();
  a.findings = std::move(findings);
  a.skipped = t.skipped;
  return a;
}

}  // namespace ferry::trace
