// Human-readable sizes and rates, and size parsing for command-line flags.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace ferry {

inline constexpr std::size_t KiB = std::size_t{1} << 10;
inline constexpr std::size_t MiB = std::size_t{1} << 20;
inline constexpr std::size_t GiB = std::size_t{1} << 30;

/// "1.41 GiB"-style text for a byte count: binary units (KiB .. EiB) with three significant digits, or
/// whole bytes below 1 KiB ("512 B").
[[nodiscard]] std::string format_bytes(std::uint64_t bytes);

/// "850 ns", "12.3 us", "1.20 ms", "3.45 s": a duration in nanoseconds with three significant digits.
[[nodiscard]] std::string format_duration_ns(std::uint64_t ns);

/// Bandwidth in decimal GB/s (1e9 bytes per second), the unit CUDA tools and nccl-tests use.
/// Returns 0 when `seconds` is not a positive finite number.
[[nodiscard]] double gb_per_s(std::uint64_t bytes, double seconds) noexcept;

/// Parses "64MiB", "1.5GiB", "4096", "512k", "2G": a non-negative decimal number, then optionally a
/// case-insensitive unit K, M, G or T with an optional "B" or "iB" (all binary multiples; "B" alone is
/// bytes). Surrounding blanks are ignored; fractions of a unit are rounded down to whole bytes, and a
/// bare byte count must be whole. Throws logic_error naming the text when it is empty, negative, not a
/// size, or larger than 2^64 - 1.
[[nodiscard]] std::uint64_t parse_bytes(std::string_view text);

}  // namespace ferry
