// The word function of ferry's verification pattern (see pattern.hpp), in C++17 with no library
// dependency, so device code (nvcc) includes it as it is.
#pragma once

#include <cstdint>

namespace ferry {

/// splitmix64's finalizer: a fast bijective mix of 64 bits.
[[nodiscard]] constexpr std::uint64_t mix64(std::uint64_t z) noexcept {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/// The step between consecutive words of a pattern: odd, so no two words of one output are equal.
inline constexpr std::uint64_t pattern_stride = 0x9E3779B97F4A7C15ull;

/// Word `index` of the pattern of `seed`: a start that depends on the seed through a full mix, plus an
/// odd stride per word. Every word of an output differs from every other (a shifted or repeated copy
/// fails), outputs of different seeds differ everywhere, and checking costs an add per word, so the host
/// verifies at memory speed.
[[nodiscard]] constexpr std::uint64_t pattern_word(std::uint64_t seed, std::uint64_t index) noexcept {
  return mix64(seed) + index * pattern_stride;
}

/// One term of ferry's 64-bit checksum: word `w` (little-endian) at word index `index` of the data. The
/// checksum of some bytes is the wrapping sum of their terms, a final partial word zero-padded; it is
/// independent of how the data is split and in which order the parts are summed, and it sees a reordered
/// word, since each term depends on its position.
[[nodiscard]] constexpr std::uint64_t checksum_term(std::uint64_t w, std::uint64_t index) noexcept {
  return mix64(w + index);
}

}  // namespace ferry
