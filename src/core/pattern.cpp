#include "ferry/core/pattern.hpp"

#include <cstring>

namespace ferry {
namespace {

std::byte pattern_byte(std::uint64_t seed, std::uint64_t offset) noexcept {
  return static_cast<std::byte>(pattern_word(seed, offset / 8) >> (8 * (offset % 8)));
}

}  // namespace

void fill_pattern(std::span<std::byte> out, std::uint64_t seed, std::uint64_t offset) noexcept {
  std::size_t i = 0;
  for (; i < out.size() && (offset + i) % 8 != 0; ++i) out[i] = pattern_byte(seed, offset + i);
  // Whole words; memcpy keeps the stores unaligned-safe and little-endian on the hosts ferry supports.
  for (std::uint64_t w = pattern_word(seed, (offset + i) / 8); i + 8 <= out.size();
       i += 8, w += pattern_stride) {
    std::memcpy(out.data() + i, &w, 8);
  }
  for (; i < out.size(); ++i) out[i] = pattern_byte(seed, offset + i);
}

std::optional<std::uint64_t> find_pattern_mismatch(std::span<const std::byte> bytes, std::uint64_t seed,
                                                   std::uint64_t offset) noexcept {
  // Exact search over a small range, used for the unaligned edges and to locate a wrong byte.
  auto first_wrong = [&](std::size_t from, std::size_t to) -> std::optional<std::uint64_t> {
    for (std::size_t b = from; b < to; ++b)
      if (bytes[b] != pattern_byte(seed, offset + b)) return offset + b;
    return std::nullopt;
  };
  std::size_t i = 0;
  while (i < bytes.size() && (offset + i) % 8 != 0) ++i;
  if (auto bad = first_wrong(0, i)) return bad;
  // Whole words in blocks: the differences of a block are OR-ed together with no branch per word, so the
  // independent pattern computations pipeline; a block that differs is searched byte by byte. This check
  // runs over every delivered byte of a bench, so its speed bounds what the host side can verify.
  constexpr std::size_t block_words = 32;
  std::uint64_t expected = pattern_word(seed, (offset + i) / 8);
  for (; i + 8 * block_words <= bytes.size(); i += 8 * block_words) {
    std::uint64_t diff = 0;
    for (std::size_t k = 0; k < block_words; ++k) {
      std::uint64_t w;
      std::memcpy(&w, bytes.data() + i + 8 * k, 8);
      diff |= w ^ (expected + k * pattern_stride);
    }
    expected += block_words * pattern_stride;
    if (diff != 0) [[unlikely]]
      return first_wrong(i, i + 8 * block_words);
  }
  return first_wrong(i, bytes.size());
}

std::uint64_t checksum64(std::span<const std::byte> bytes, std::uint64_t first_word) noexcept {
  const std::size_t words = bytes.size() / 8;
  const std::byte* p = bytes.data();
  std::uint64_t sum = 0;
  for (std::size_t i = 0; i < words; ++i) {
    std::uint64_t w;
    std::memcpy(&w, p + 8 * i, 8);
    sum += checksum_term(w, first_word + i);
  }
  if (const std::size_t rest = bytes.size() % 8; rest != 0) {
    std::uint64_t w = 0;
    for (std::size_t k = 0; k < rest; ++k)
      w |= std::uint64_t{std::to_integer<std::uint8_t>(p[8 * words + k])} << (8 * k);
    sum += checksum_term(w, first_word + words);
  }
  return sum;
}

std::uint64_t pattern_checksum(std::uint64_t seed, std::uint64_t bytes, std::uint64_t first_word) noexcept {
  const std::uint64_t words = bytes / 8;
  std::uint64_t sum = 0;
  std::uint64_t w = pattern_word(seed, 0);
  for (std::uint64_t i = 0; i < words; ++i, w += pattern_stride) sum += checksum_term(w, first_word + i);
  if (const std::uint64_t rest = bytes % 8; rest != 0) {
    const std::uint64_t mask = (std::uint64_t{1} << (8 * rest)) - 1;
    sum += checksum_term(pattern_word(seed, words) & mask, first_word + words);
  }
  return sum;
}

}  // namespace ferry
