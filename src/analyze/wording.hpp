// How findings and the text report phrase their numbers.
#pragma once

#include <fmt/format.h>

#include <cmath>
#include <string>
#include <string_view>

#include "ferry/trace/names.hpp"
#include "ferry/trace/timeline.hpp"

namespace ferry::trace::detail {

/// "42%".
inline std::string pct(double fraction) { return fmt::format("{:.0f}%", fraction * 100.0); }
/// "1.25 ms".
inline std::string ms_text(double v) { return fmt::format("{:.2f} ms", v); }
/// "H2D", "D2H", or "copy" for any other kind.
inline std::string upper_dir(copy_kind k) {
  return k == copy_kind::h2d ? "H2D" : k == copy_kind::d2h ? "D2H" : "copy";
}
/// A per-step count: whole when it is whole ("2"), else one decimal ("1.5").
inline std::string count_text(double per_step) {
  return std::abs(per_step - std::round(per_step)) < 1e-9 ? fmt::format("{:.0f}", per_step)
                                                          : fmt::format("{:.1f}", per_step);
}

}  // namespace ferry::trace::detail
