// Chrome trace timestamps (microseconds, JSON numbers) as int64 nanoseconds, exactly (private to
// ferry::trace).
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace ferry::trace::detail {

/// Timestamps are microseconds; beyond this they no longer fit int64 nanoseconds (with room for dur).
inline constexpr double max_abs_ts_us = 9.2e15;

/// Parses a JSON number's text (microseconds) into nanoseconds exactly (round half away from zero), so
/// "4510785932383.927" is 4510785932383927 ns even where a double would be off by one. `approx` is the
/// parser's double of the same text, used for the range check. nullopt when out of range or not a number.
[[nodiscard]] std::optional<std::int64_t> us_text_to_ns(std::string_view text, double approx);

}  // namespace ferry::trace::detail
