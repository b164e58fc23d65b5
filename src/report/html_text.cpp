// The report's text primitives: escaping, clipping and number formats.
#include "html_text.hpp"

#include <algorithm>
#include <cmath>

namespace ferry::trace::html {

void escape_into(std::string& out, std::string_view s) {
  for (const char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      case '\t':
      case '\n': out += c; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f)
          out += "\xEF\xBF\xBD";
        else
          out += c;
    }
  }
}

std::string clip(std::string_view s, std::size_t n) {
  if (s.size() <= n) return std::string(s);
  while (n > 0 && (static_cast<unsigned char>(s[n]) & 0xC0) == 0x80) --n;
  return std::string(s.substr(0, n)) + "\xE2\x80\xA6";
}

double sane(double v) { return std::isfinite(v) && v > 0 ? v : 0; }

std::string fmt_ms(double ms) {
  if (!std::isfinite(ms)) return "n/a";
  return fmt::format("{:.3f}", ms);
}

std::string fmt_pct(double fraction) {
  if (!std::isfinite(fraction)) return "n/a";
  return fmt::format("{:.1f}%", 100 * fraction);
}

double nice_step(double span, int ticks) {
  if (!(span > 0) || !std::isfinite(span)) return 1;
  const double raw = span / ticks;
  const double p = std::pow(10.0, std::floor(std::log10(raw)));
  const double m = raw / p;
  return (m <= 1 ? 1 : m <= 2 ? 2 : m <= 5 ? 5 : 10) * p;
}

std::string fmt_tick(double v, double step) {
  const int decimals = step >= 1 ? 0 : std::min(6, static_cast<int>(std::ceil(-std::log10(step))));
  return fmt::format("{:.{}f}", v, decimals);
}

}  // namespace ferry::trace::html
