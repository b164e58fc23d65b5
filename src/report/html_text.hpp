// The report's writing primitives (private to ferry::report): an output buffer that escapes whatever
// comes from a trace, and the number formats every section shares.
#pragma once

#include <fmt/format.h>

#include <cstddef>
#include <iterator>
#include <string>
#include <string_view>
#include <utility>

namespace ferry::trace::html {

/// Escapes `s` for element content and quoted attribute values alike. Control characters (which HTML
/// does not allow in text) become U+FFFD.
void escape_into(std::string& out, std::string_view s);

/// The first `n` bytes of `s` (not splitting a UTF-8 sequence), with an ellipsis when cut.
[[nodiscard]] std::string clip(std::string_view s, std::size_t n);

/// `v`, or 0 when it is not finite or negative: such amounts draw as nothing.
[[nodiscard]] double sane(double v);

/// Milliseconds with three decimals; "n/a" when not finite.
[[nodiscard]] std::string fmt_ms(double ms);

/// A fraction as a percentage with one decimal; "n/a" when not finite.
[[nodiscard]] std::string fmt_pct(double fraction);

/// A round tick spacing (1, 2 or 5 times a power of ten) giving about `ticks` ticks over `span`.
[[nodiscard]] double nice_step(double span, int ticks);

/// A tick's label with as many decimals as `step` needs.
[[nodiscard]] std::string fmt_tick(double v, double step);

/// The document being written: markup goes in through out() as is, text from the trace through text().
class writer {
 public:
  template <class... Args>
  void out(fmt::format_string<Args...> f, Args&&... args) {
    fmt::format_to(std::back_inserter(s_), f, std::forward<Args>(args)...);
  }
  /// Appends `v` escaped.
  void text(std::string_view v) { escape_into(s_, v); }
  /// Appends `markup` as is: it must come from ferry or from the caller of to_html, never from a trace.
  void raw(std::string_view markup) { s_ += markup; }

  void reserve(std::size_t n) { s_.reserve(n); }
  /// The document; the writer is empty afterwards.
  [[nodiscard]] std::string take() && { return std::move(s_); }

 private:
  std::string s_;
};

}  // namespace ferry::trace::html
