// Decimal microseconds to nanoseconds digit by digit: a double's 15-16 significant digits do not hold
// every nanosecond of a timestamp taken weeks after boot.
#include "timestamps.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>

namespace ferry::trace::detail {

std::optional<std::int64_t> us_text_to_ns(std::string_view text, double approx) {
  if (!std::isfinite(approx) || std::fabs(approx) > max_abs_ts_us) return std::nullopt;
  std::size_t i = 0;
  const bool negative = i < text.size() && text[i] == '-';
  if (negative) ++i;
  const std::size_t int_begin = i;
  while (i < text.size() && text[i] >= '0' && text[i] <= '9') ++i;
  const std::size_t int_len = i - int_begin;
  std::size_t frac_begin = i;
  std::size_t frac_len = 0;
  if (i < text.size() && text[i] == '.') {
    frac_begin = ++i;
    while (i < text.size() && text[i] >= '0' && text[i] <= '9') ++i;
    frac_len = i - frac_begin;
  }
  std::int64_t exp10 = 0;
  if (i < text.size() && (text[i] == 'e' || text[i] == 'E')) {
    ++i;
    bool exp_negative = false;
    if (i < text.size() && (text[i] == '+' || text[i] == '-')) exp_negative = text[i++] == '-';
    while (i < text.size() && text[i] >= '0' && text[i] <= '9') {
      // Saturates: an exponent this large leaves only zeros (the range check caught the rest).
      if (exp10 < 100'000'000) exp10 = exp10 * 10 + (text[i] - '0');
      ++i;
    }
    if (exp_negative) exp10 = -exp10;
  }
  if (i != text.size() || int_len + frac_len == 0) return std::nullopt;
  const std::size_t n = int_len + frac_len;
  auto digit = [&](std::size_t k) -> unsigned {
    return static_cast<unsigned>(k < int_len ? text[int_begin + k] - '0'
                                             : text[frac_begin + (k - int_len)] - '0');
  };
  // Digit k weighs 10^(top - 1 - k) nanoseconds.
  const std::int64_t top = static_cast<std::int64_t>(int_len) + exp10 + 3;
  const std::size_t whole = top <= 0 ? 0 : std::min<std::size_t>(n, static_cast<std::size_t>(top));
  std::uint64_t acc = 0;
  constexpr auto cap = static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max());
  auto push = [&](unsigned d) {
    return !__builtin_mul_overflow(acc, std::uint64_t{10}, &acc) && !__builtin_add_overflow(acc, d, &acc) &&
           acc <= cap;
  };
  for (std::size_t k = 0; k < whole; ++k)
    if (!push(digit(k))) return std::nullopt;
  if (acc != 0)
    for (std::int64_t k = static_cast<std::int64_t>(n); k < top; ++k)
      if (!push(0)) return std::nullopt;
  if (top >= 0 && static_cast<std::uint64_t>(top) < n && digit(static_cast<std::size_t>(top)) >= 5) ++acc;
  if (acc > cap) return std::nullopt;
  const auto mag = static_cast<std::int64_t>(acc);
  return negative ? -mag : mag;
}

}  // namespace ferry::trace::detail
