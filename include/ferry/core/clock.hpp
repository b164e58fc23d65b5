// Time helpers shared by every component: ferry measures wall time on the steady clock, and every
// blocking *_for form clamps its timeout the same way.
#pragma once

#include <chrono>

namespace ferry {

using steady_clock = std::chrono::steady_clock;

/// Seconds of steady-clock time since `start`.
[[nodiscard]] inline double seconds_since(steady_clock::time_point start) noexcept {
  return std::chrono::duration<double>(steady_clock::now() - start).count();
}

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

/// The steady-clock deadline `timeout` from now, with the timeout clamped as clamp_timeout does.
template <class Rep, class Period>
[[nodiscard]] steady_clock::time_point deadline_after(std::chrono::duration<Rep, Period> timeout) {
  return steady_clock::now() + clamp_timeout(timeout);
}

}  // namespace ferry
