// How findings and the text report phrase their numbers, and what an activity's name says it does.
#pragma once

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
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

/// Words in a CPU activity's name that say it makes input, for choosing a fix.
inline constexpr std::array<std::string_view, 5> data_words{"make", "load", "batch", "sample", "collate"};
/// Words that say it handles output.
inline constexpr std::array<std::string_view, 5> output_words{"process", "output", "write", "save", "post"};

/// True when `activity` contains one of `words`, in any case.
template <std::size_t N>
bool mentions_any(std::string_view activity, const std::array<std::string_view, N>& words) {
  return std::any_of(words.begin(), words.end(),
                     [&](std::string_view w) { return contains_ignoring_case(activity, w); });
}

}  // namespace ferry::trace::detail
