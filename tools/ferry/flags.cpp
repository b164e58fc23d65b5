#include "flags.hpp"

#include <fmt/format.h>

#include <charconv>
#include <cmath>
#include <deque>
#include <exception>

#include "ferry/core/host_memory.hpp"
#include "ferry/core/text.hpp"
#include "ferry/core/units.hpp"

namespace ferry::cli {
namespace {

std::deque<detail::flag_entry>& entries() {
  static std::deque<detail::flag_entry> all;  // a deque: entries never move, CLI11 keeps their address
  return all;
}

[[noreturn]] void bad(const std::string& flag, const std::string& value, const std::string& range) {
  throw flag_error(out_of_range(flag, value, range));
}

std::string int_range(std::int64_t min, std::int64_t max) {
  return fmt::format("expected a whole number from {} to {}", min, max);
}

// "0.5", "1e+06": a bound as a person reads it.
std::string number(double v) { return fmt::format("{:g}", v); }

}  // namespace

std::string out_of_range(const std::string& flag, const std::string& value, const std::string& range) {
  return fmt::format("{} {}: out of range; {}", flag, escape_control(value), range);
}

std::uint64_t max_host_buffer_bytes() {
  const std::uint64_t total = host_memory_total();
  return total > 0 ? total : std::uint64_t{1} << 40;
}

namespace detail {

flag_entry& new_flag_entry() { return entries().emplace_back(); }

std::string shown_name(const std::string& name) {
  const auto comma = name.rfind(',');
  return comma == std::string::npos ? name : name.substr(comma + 1);
}

std::int64_t parse_int(const std::string& name, const std::string& text, std::int64_t min, std::int64_t max) {
  std::int64_t v = 0;
  const char* first = text.data();
  const char* last = text.data() + text.size();
  if (first != last && *first == '+') ++first;
  const auto [end, ec] = std::from_chars(first, last, v);
  if (ec == std::errc::result_out_of_range) bad(name, text, int_range(min, max));
  if (ec != std::errc{} || end != last || text.empty()) {
    throw flag_error(
        fmt::format("{} {}: not a whole number; {}", name, escape_control(text), int_range(min, max)));
  }
  if (v < min || v > max) bad(name, text, int_range(min, max));
  return v;
}

}  // namespace detail

CLI::Option* add_double_flag(CLI::App& app, const std::string& name, double& target, double min, double max,
                             const std::string& help) {
  detail::flag_entry& e = detail::new_flag_entry();
  e.option = app.add_option(name, e.text, help)->type_name("NUM");
  e.check = [name = detail::shown_name(name), &target, min, max](const std::string& text) {
    const std::string range = fmt::format("expected a finite number from {} to {}", number(min), number(max));
    double v = 0;
    const char* first = text.data();
    const char* last = text.data() + text.size();
    if (first != last && *first == '+') ++first;
    const auto [end, ec] = std::from_chars(first, last, v);
    if (text.empty() || ec == std::errc::invalid_argument || end != last)
      throw flag_error(fmt::format("{} {}: not a number; {}", name, escape_control(text), range));
    if (ec == std::errc::result_out_of_range || !std::isfinite(v) || v < min || v > max)
      bad(name, text, range);
    target = v;
  };
  return e.option;
}

CLI::Option* add_bytes_flag(CLI::App& app, const std::string& name, std::uint64_t& target, std::uint64_t min,
                            std::uint64_t max, const std::string& help) {
  detail::flag_entry& e = detail::new_flag_entry();
  e.option = app.add_option(name, e.text, help)->type_name("SIZE");
  e.check = [name = detail::shown_name(name), &target, min, max](const std::string& text) {
    const std::string range =
        fmt::format("expected a size from {} to {}", format_bytes(min), format_bytes(max));
    std::uint64_t v = 0;
    try {
      v = parse_bytes(text);
    } catch (const std::exception&) {
      throw flag_error(fmt::format("{} {}: not a size such as 64MiB, 1.5GiB or 4096; {}", name,
                                   escape_control(text), range));
    }
    if (v < min || v > max) bad(name, text, range);
    target = v;
  };
  return e.option;
}

void check_flags() {
  for (const auto& e : entries()) {
    if (e.option->count() > 0) e.check(e.text);
  }
}

}  // namespace ferry::cli
