// The verification pattern ferry's benches and tests write on the device and check on the host: byte g of
// an output with seed s is byte (g % 8) of the little-endian word pattern_word(s, g / 8). Every byte
// depends on its seed and position, so a lost, shifted, stale or torn copy is caught.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>

#include "ferry/core/pattern_word.hpp"

namespace ferry {

/// Writes the pattern of `seed` into `out`, whose first byte is byte `offset` of the output.
void fill_pattern(std::span<std::byte> out, std::uint64_t seed, std::uint64_t offset = 0) noexcept;

/// The offset (within the output) of the first byte of `bytes` that differs from the pattern of `seed`,
/// where `bytes` starts at byte `offset` of the output; nullopt when every byte matches.
[[nodiscard]] std::optional<std::uint64_t> find_pattern_mismatch(std::span<const std::byte> bytes,
                                                                 std::uint64_t seed,
                                                                 std::uint64_t offset = 0) noexcept;

/// ferry's checksum (checksum_term) of `bytes`, whose first byte is word `first_word` of the data (so
/// `bytes` starts on a word boundary). Sums of parts add up to the checksum of the whole.
[[nodiscard]] std::uint64_t checksum64(std::span<const std::byte> bytes,
                                       std::uint64_t first_word = 0) noexcept;

/// The checksum of `bytes` bytes of the pattern of `seed` starting at byte 0, computed without the bytes
/// (what a receiver of a pattern expects), starting at word `first_word` of the checksummed data.
[[nodiscard]] std::uint64_t pattern_checksum(std::uint64_t seed, std::uint64_t bytes,
                                             std::uint64_t first_word = 0) noexcept;

}  // namespace ferry
