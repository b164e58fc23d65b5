#include "ferry/core/strided_copy.hpp"

#include <fmt/format.h>
#include <array>
#include <cstring>

#include "ferry/core/error.hpp"

namespace ferry {
namespace {

struct dims {
  std::array<std::int64_t, kMaxStridedDims> size{};
  std::array<std::int64_t, kMaxStridedDims> stride{};
  std::size_t n = 0;
};

// Dimensions of size 1 dropped, and each dimension merged into the one outside it where the two walk
// memory as one (outer stride == inner stride x inner size): the same elements in the same order.
dims simplified(std::span<const std::int64_t> shape, std::span<const std::int64_t> strides) {
  dims d;
  for (std::size_t k = 0; k < shape.size(); ++k) {
    if (shape[k] == 1) continue;
    if (d.n > 0 && d.stride[d.n - 1] == strides[k] * shape[k]) {
      d.size[d.n - 1] *= shape[k];
      d.stride[d.n - 1] = strides[k];
      continue;
    }
    d.size[d.n] = shape[k];
    d.stride[d.n] = strides[k];
    ++d.n;
  }
  return d;
}

// The deinterleave of `channels` interleaved byte planes: out[c][j] = in[j * channels + c]. Built also
// for SSSE3 on x86-64 and chosen at load time where the CPU has it: GCC vectorizes these loops with byte
// shuffles (pshufb), which the x86-64 baseline lacks, under its dynamic cost model (-O2's cheap model
// leaves them scalar, about 4 times slower).
// Not under a sanitizer: an ifunc's resolver runs while relocating, before the sanitizer's runtime is up,
// and the TSan build crashed at load.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_THREAD__) && \
    !defined(__SANITIZE_ADDRESS__)
#define FERRY_SHUFFLE_CLONES \
  __attribute__((target_clones("default", "ssse3"), optimize("tree-vectorize", "vect-cost-model=dynamic")))
#else
#define FERRY_SHUFFLE_CLONES
#endif

FERRY_SHUFFLE_CLONES void deinterleave3(std::uint8_t* __restrict out, const std::uint8_t* __restrict in,
                                        std::int64_t n) {
  std::uint8_t* __restrict o0 = out;
  std::uint8_t* __restrict o1 = out + n;
  std::uint8_t* __restrict o2 = out + 2 * n;
  for (std::int64_t j = 0; j < n; ++j) {
    o0[j] = in[3 * j];
    o1[j] = in[3 * j + 1];
    o2[j] = in[3 * j + 2];
  }
}

FERRY_SHUFFLE_CLONES void deinterleave4(std::uint8_t* __restrict out, const std::uint8_t* __restrict in,
                                        std::int64_t n) {
  std::uint8_t* __restrict o0 = out;
  std::uint8_t* __restrict o1 = out + n;
  std::uint8_t* __restrict o2 = out + 2 * n;
  std::uint8_t* __restrict o3 = out + 3 * n;
  for (std::int64_t j = 0; j < n; ++j) {
    o0[j] = in[4 * j];
    o1[j] = in[4 * j + 1];
    o2[j] = in[4 * j + 2];
    o3[j] = in[4 * j + 3];
  }
}

// One element of `item` bytes, with the common sizes as single loads and stores.
inline void copy_item(std::byte* out, const std::byte* in, std::size_t item) {
  switch (item) {
    case 1: *out = *in; break;
    case 2: std::memcpy(out, in, 2); break;
    case 4: std::memcpy(out, in, 4); break;
    case 8: std::memcpy(out, in, 8); break;
    default: std::memcpy(out, in, item);
  }
}

// The innermost dimension `d.n - 1` (or, when `inner` is 2, the two innermost) of every index of the
// dimensions outside it, in C order; `row(out, in)` copies one and returns the bytes it wrote.
template <class Row>
void for_each_row(std::byte* dst, const std::byte* src, const dims& d, std::size_t inner, Row row) {
  const std::size_t outer = d.n - inner;
  std::array<std::int64_t, kMaxStridedDims> index{};
  for (;;) {
    dst += row(dst, src);
    std::size_t k = outer;
    for (; k > 0; --k) {
      src += d.stride[k - 1];
      if (++index[k - 1] < d.size[k - 1]) break;
      src -= d.stride[k - 1] * d.size[k - 1];
      index[k - 1] = 0;
    }
    if (k == 0) return;
  }
}

}  // namespace

void copy_strided(std::byte* dst, const std::byte* src, std::span<const std::int64_t> shape,
                  std::span<const std::int64_t> strides, std::size_t item_bytes) {
  FERRY_EXPECTS(shape.size() == strides.size(),
                fmt::format("copy_strided: {} sizes but {} strides; give one stride per dimension",
                            shape.size(), strides.size()));
  FERRY_EXPECTS(shape.size() <= kMaxStridedDims,
                fmt::format("copy_strided: {} dimensions; at most {}", shape.size(), kMaxStridedDims));
  FERRY_EXPECTS(item_bytes > 0, "copy_strided: item_bytes 0; an element is at least 1 byte");
  for (std::size_t k = 0; k < shape.size(); ++k) {
    FERRY_EXPECTS(shape[k] >= 0,
                  fmt::format("copy_strided: size {} of dimension {}; sizes are at least 0", shape[k], k));
  }
  for (const auto size : shape) {
    if (size == 0) return;
  }
  const dims d = simplified(shape, strides);
  const auto item = static_cast<std::int64_t>(item_bytes);
  if (d.n == 0) {  // one element
    std::memcpy(dst, src, item_bytes);
    return;
  }
  const std::int64_t last = d.size[d.n - 1];
  if (d.stride[d.n - 1] == item) {  // contiguous rows
    const auto bytes = static_cast<std::size_t>(last * item);
    for_each_row(dst, src, d, 1, [bytes](std::byte* out, const std::byte* in) {
      std::memcpy(out, in, bytes);
      return bytes;
    });
    return;
  }
  // Interleaved channels read as planes: a channels-first view of channels-last bytes (an image's
  // permute(2, 0, 1)).
  if (item == 1 && d.n >= 2 && d.stride[d.n - 2] == 1 && (d.size[d.n - 2] == 3 || d.size[d.n - 2] == 4) &&
      d.stride[d.n - 1] == d.size[d.n - 2]) {
    const std::int64_t channels = d.size[d.n - 2];
    const auto bytes = static_cast<std::size_t>(channels * last);
    for_each_row(dst, src, d, 2, [channels, last, bytes](std::byte* out, const std::byte* in) {
      auto* o = reinterpret_cast<std::uint8_t*>(out);
      const auto* i = reinterpret_cast<const std::uint8_t*>(in);
      if (channels == 3) {
        deinterleave3(o, i, last);
      } else {
        deinterleave4(o, i, last);
      }
      return bytes;
    });
    return;
  }
  const std::int64_t stride = d.stride[d.n - 1];
  const auto bytes = static_cast<std::size_t>(last * item);
  for_each_row(dst, src, d, 1, [last, stride, item_bytes, bytes](std::byte* out, const std::byte* in) {
    for (std::int64_t j = 0; j < last; ++j, in += stride, out += item_bytes) copy_item(out, in, item_bytes);
    return bytes;
  });
}

}  // namespace ferry
