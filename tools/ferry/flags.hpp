// The one place the CLI parses and checks flag values. Every numeric flag of every subcommand is
// registered here with its range; CLI11 only collects the text, and check_flags() converts and checks
// every flag that was given before any work starts. A value out of range or not a number is a
// flag_error: one line naming the flag, the value and the range, and exit status 2.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <functional>
#include <limits>
#include <stdexcept>
#include <string>
#include <type_traits>

namespace ferry::cli {

/// A flag's value is not a number of its kind or is out of its range. main prints it and exits 2.
class flag_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Upper bounds shared by many flags.
inline constexpr std::int64_t max_threads = 4096;     // --workers and the like
inline constexpr std::int64_t max_count = 1'000'000;  // steps, iterations, slots, buffers
inline constexpr double max_gbps = 100'000;           // a link's GB/s, far above any real one
inline constexpr std::int64_t max_gpu_ordinal = 1023;

/// Adds an integer flag `name` to `app`, writing into `target` when given: a whole number in [min, max]
/// (inclusive; for an unsigned target a minus sign is refused, never wrapped).
template <class T>
CLI::Option* add_int_flag(CLI::App& app, const std::string& name, T& target, std::int64_t min,
                          std::int64_t max, const std::string& help);

/// Adds a floating-point flag: finite numbers in [min, max] only (nan and inf are refused).
CLI::Option* add_double_flag(CLI::App& app, const std::string& name, double& target, double min, double max,
                             const std::string& help);

/// Adds a size flag ("64MiB", "4096"): bytes in [min, max].
CLI::Option* add_bytes_flag(CLI::App& app, const std::string& name, std::uint64_t& target, std::uint64_t min,
                            std::uint64_t max, const std::string& help);

/// Converts and checks every registered flag that the parsed command line gave. Throws flag_error.
void check_flags();

/// "--workers -1 is out of range: expected an integer from 1 to 4096": the message of an out-of-range
/// value (for checks made after parsing, such as a size against memory).
[[nodiscard]] std::string out_of_range(const std::string& flag, const std::string& value,
                                       const std::string& range);

/// The bound of flags that size host buffers: the host's physical memory.
[[nodiscard]] std::uint64_t max_host_buffer_bytes();

namespace detail {
/// A registered flag: the text CLI11 collected and the check that converts it.
struct flag_entry {
  std::string text;
  CLI::Option* option = nullptr;
  std::function<void(const std::string& text)> check;
};
/// A new entry, alive until the process ends.
[[nodiscard]] flag_entry& new_flag_entry();
/// The name messages give a flag registered as "-b,--min-bytes": its last name ("--min-bytes").
[[nodiscard]] std::string shown_name(const std::string& name);
/// Parses `text` as an integer in [min, max] for flag `name`; throws flag_error.
[[nodiscard]] std::int64_t parse_int(const std::string& name, const std::string& text, std::int64_t min,
                                     std::int64_t max);
}  // namespace detail

template <class T>
CLI::Option* add_int_flag(CLI::App& app, const std::string& name, T& target, std::int64_t min,
                          std::int64_t max, const std::string& help) {
  static_assert(std::is_integral_v<T>);
  if constexpr (std::is_unsigned_v<T>) {
    if (min < 0) min = 0;
  }
  if (static_cast<std::uint64_t>(max) > static_cast<std::uint64_t>(std::numeric_limits<T>::max()))
    max = static_cast<std::int64_t>(std::numeric_limits<T>::max());
  detail::flag_entry& e = detail::new_flag_entry();
  e.option = app.add_option(name, e.text, help)->type_name("INT");
  e.check = [name = detail::shown_name(name), &target, min, max](const std::string& value) {
    target = static_cast<T>(detail::parse_int(name, value, min, max));
  };
  return e.option;
}

}  // namespace ferry::cli
