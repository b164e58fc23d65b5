#include "ferry/core/units.hpp"

#include <array>
#include <cctype>
#include <cmath>
#include <limits>

#include <fmt/format.h>

#include "ferry/core/error.hpp"

namespace ferry {
namespace {

__extension__ typedef unsigned __int128 uint128;

// Three significant digits; the precision is picked on the rounded value so 9.999 prints "10.0", not "10.00".
std::string three_digits(double value, std::string_view unit) {
  if (value < 9.995) return fmt::format("{:.2f} {}", value, unit);
  if (value < 99.95) return fmt::format("{:.1f} {}", value, unit);
  return fmt::format("{:.0f} {}", value, unit);
}

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

char lower(char c) { return static_cast<char>(std::tolower(static_cast<unsigned char>(c))); }

[[noreturn]] void bad_size(std::string_view text, std::string_view why) {
  throw logic_error(
      fmt::format("cannot parse size \"{}\": {}; expected a non-negative number with an optional binary unit "
                  "(B, K/KiB, M/MiB, G/GiB, T/TiB), such as 64MiB, 1.5GiB, 512k or 4096",
                  text, why));
}

// Returns log2 of the unit's multiple, or -1 when `unit` is not a unit ferry accepts.
int unit_shift(std::string_view unit) {
  std::string u;
  for (char c : unit) u += lower(c);
  if (u.empty() || u == "b") return 0;
  static constexpr std::array<char, 4> prefixes{'k', 'm', 'g', 't'};
  for (std::size_t i = 0; i < prefixes.size(); ++i) {
    if (u[0] != prefixes[i]) continue;
    const std::string_view rest = std::string_view(u).substr(1);
    if (rest.empty() || rest == "b" || rest == "ib") return static_cast<int>(10 * (i + 1));
  }
  return -1;
}

}  // namespace

std::string format_bytes(std::uint64_t bytes) {
  if (bytes < KiB) return fmt::format("{} B", bytes);
  static constexpr std::array<std::string_view, 6> units{"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  double value = static_cast<double>(bytes) / 1024.0;
  std::size_t unit = 0;
  // Move up once the rounded value would read 1024, so 1048575 bytes prints "1.00 MiB".
  while (value >= 1023.5 && unit + 1 < units.size()) {
    value /= 1024.0;
    ++unit;
  }
  return three_digits(value, units[unit]);
}

std::string format_duration_ns(std::uint64_t ns) {
  if (ns < 1000) return fmt::format("{} ns", ns);
  const double v = static_cast<double>(ns);
  if (v < 999.5e3) return three_digits(v / 1e3, "us");
  if (v < 999.5e6) return three_digits(v / 1e6, "ms");
  return three_digits(v / 1e9, "s");
}

double gb_per_s(std::uint64_t bytes, double seconds) noexcept {
  if (!(seconds > 0.0) || !std::isfinite(seconds)) return 0.0;
  return static_cast<double>(bytes) / 1e9 / seconds;
}

std::uint64_t parse_bytes(std::string_view text) {
  std::size_t begin = 0;
  std::size_t end = text.size();
  while (begin < end && is_space(text[begin])) ++begin;
  while (end > begin && is_space(text[end - 1])) --end;
  const std::string_view s = text.substr(begin, end - begin);
  if (s.empty()) bad_size(text, "the text is empty");
  if (s[0] == '-') bad_size(text, "a size cannot be negative");

  std::size_t i = 0;
  uint128 whole = 0;
  std::size_t digits = 0;
  constexpr uint128 too_big = uint128{std::numeric_limits<std::uint64_t>::max()} + 1;
  for (; i < s.size() && std::isdigit(static_cast<unsigned char>(s[i])); ++i, ++digits) {
    whole = whole * 10 + static_cast<unsigned>(s[i] - '0');
    if (whole >= too_big) bad_size(text, "it does not fit in 64 bits");
  }
  uint128 fraction = 0;
  uint128 scale = 1;
  bool has_fraction = false;
  if (i < s.size() && s[i] == '.') {
    ++i;
    for (; i < s.size() && std::isdigit(static_cast<unsigned char>(s[i])); ++i, ++digits) {
      // Digits past the 18th cannot change a result that is rounded down to whole bytes of at most 2^64.
      if (scale < uint128{1'000'000'000'000'000'000ULL}) {
        fraction = fraction * 10 + static_cast<unsigned>(s[i] - '0');
        scale *= 10;
      }
      has_fraction = true;
    }
  }
  if (digits == 0) bad_size(text, "there is no number");
  std::size_t unit_begin = i;
  while (unit_begin < s.size() && is_space(s[unit_begin])) ++unit_begin;
  const int shift = unit_shift(s.substr(unit_begin));
  if (shift < 0) bad_size(text, fmt::format("\"{}\" is not a unit", s.substr(unit_begin)));
  if (shift == 0 && has_fraction && fraction != 0) {
    bad_size(text, "a count of bytes without a larger unit must be a whole number");
  }

  const uint128 multiple = uint128{1} << shift;
  // whole < 2^64 and multiple <= 2^40, so the product fits in 128 bits; so does fraction * multiple.
  const uint128 bytes = whole * multiple + fraction * multiple / scale;
  if (bytes >= too_big) bad_size(text, "it does not fit in 64 bits (at most 16.0 EiB)");
  return static_cast<std::uint64_t>(bytes);
}

}  // namespace ferry
