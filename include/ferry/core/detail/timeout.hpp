// Timeouts for the blocking primitives' *_for forms.
#pragma once

#include <chrono>

namespace ferry::detail {

/// `timeout` as nanoseconds, clamped to [0, a century]: libstdc++ adds a timeout to now(), which
/// overflows for durations like hours::max(), and a century is "forever" for every caller.
template <class Rep, class Period>
[[nodiscard]] std::chrono::nanoseconds clamp_timeout(std::chrono::duration<Rep, Period> timeout) {
  constexpr double forever_s = 100.0 * 365 * 24 * 3600;
  const double seconds = std::chrono::duration<double>(timeout).count();
  if (!(seconds > 0.0)) return std::chrono::nanoseconds::zero();
  if (seconds >= forever_s) {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::duration<double>(forever_s));
  }
  return std::chrono::ceil<std::chrono::nanoseconds>(std::chrono::duration<double>(seconds));
}

}  // namespace ferry::detail
