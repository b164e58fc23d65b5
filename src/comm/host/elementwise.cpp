#include "elementwise.hpp"

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>

#include "ferry/comm/float16.hpp"

namespace ferry::comm::host {
namespace {

// Elements per block: the float accumulator and one staging block stay on the stack (12 KiB in all).
constexpr std::size_t block = 1024;

const std::byte* at(const void* p, std::size_t offset) noexcept {
  return static_cast<const std::byte*>(p) + offset;
}
std::byte* at(void* p, std::size_t offset) noexcept { return static_cast<std::byte*>(p) + offset; }

// `m` elements of `type` from `src` (any alignment: views may start at any byte) as floats.
void load(dtype type, const std::byte* src, std::size_t m, float* out) noexcept {
  if (type == dtype::f32) {
    std::memcpy(out, src, m * sizeof(float));
    return;
  }
  std::array<std::uint16_t, block> raw;
  std::memcpy(raw.data(), src, m * sizeof(std::uint16_t));
  if (type == dtype::f16) {
    for (std::size_t k = 0; k < m; ++k) out[k] = f16_to_float(raw[k]);
  } else {
    for (std::size_t k = 0; k < m; ++k) out[k] = bf16_to_float(raw[k]);
  }
}

// An integer all-reduce's sum of elements [begin, end), in U (the unsigned type of the element's width):
// unsigned arithmetic wraps modulo 2^bits, which is the two's complement sum of signed elements too, as on
// the GPU, without signed overflow's undefined behaviour. Only sum reaches here (communicator refuses avg).
template <typename U>
void sum_integers(std::span<const void* const> sends, std::span<void* const> recvs, std::size_t begin,
                  std::size_t end) noexcept {
  std::array<U, block> acc;
  std::array<U, block> term;
  for (std::size_t b = begin; b < end; b += block) {
    const std::size_t m = std::min(block, end - b);
    const std::size_t offset = b * sizeof(U);
    std::memcpy(acc.data(), at(sends[0], offset), m * sizeof(U));
    for (std::size_t i = 1; i < sends.size(); ++i) {
      std::memcpy(term.data(), at(sends[i], offset), m * sizeof(U));
      for (std::size_t k = 0; k < m; ++k) acc[k] = static_cast<U>(acc[k] + term[k]);
    }
    for (void* recv : recvs) std::memcpy(at(recv, offset), acc.data(), m * sizeof(U));
  }
}

}  // namespace

range share_of(int rank, int ranks, std::size_t count) noexcept {
  const auto r = static_cast<std::size_t>(rank);
  const auto n = static_cast<std::size_t>(ranks);
  // count * r / n without overflow: count / n whole parts plus the remainder spread over the first ranks.
  const std::size_t base = count / n;
  const std::size_t extra = count % n;
  const std::size_t begin = r * base + std::min(r, extra);
  return {begin, begin + base + (r < extra ? 1 : 0)};
}

void reduce_range(dtype type, reduce_op op, std::span<const void* const> sends, std::span<void* const> recvs,
                  std::size_t begin, std::size_t end) noexcept {
  if (type == dtype::i32) return sum_integers<std::uint32_t>(sends, recvs, begin, end);
  if (type == dtype::i64 || type == dtype::u64) return sum_integers<std::uint64_t>(sends, recvs, begin, end);
  const std::size_t size = size_of(type);
  const auto ranks = static_cast<float>(sends.size());
  std::array<float, block> acc;
  std::array<float, block> term;
  std::array<std::uint16_t, block> out16;
  for (std::size_t b = begin; b < end; b += block) {
    const std::size_t m = std::min(block, end - b);
    const std::size_t offset = b * size;
    load(type, at(sends[0], offset), m, acc.data());
    for (std::size_t i = 1; i < sends.size(); ++i) {
      load(type, at(sends[i], offset), m, term.data());
      for (std::size_t k = 0; k < m; ++k) acc[k] += term[k];
    }
    if (op == reduce_op::avg)
      for (std::size_t k = 0; k < m; ++k) acc[k] /= ranks;
    const void* result = acc.data();
    if (type == dtype::f16) {
      for (std::size_t k = 0; k < m; ++k) out16[k] = float_to_f16(acc[k]);
      result = out16.data();
    } else if (type == dtype::bf16) {
      for (std::size_t k = 0; k < m; ++k) out16[k] = float_to_bf16(acc[k]);
      result = out16.data();
    }
    for (void* recv : recvs) std::memcpy(at(recv, offset), result, m * size);
  }
}

void gather_part(int rank, const void* send, std::span<void* const> recvs, std::size_t bytes) noexcept {
  const std::size_t offset = static_cast<std::size_t>(rank) * bytes;
  for (void* recv : recvs) {
    std::byte* dst = at(recv, offset);
    if (dst != send) std::memcpy(dst, send, bytes);  // the own part of an in-place all-gather is in place
  }
}

}  // namespace ferry::comm::host
