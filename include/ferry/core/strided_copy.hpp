// Gathering a strided array into dense memory: how ferry.torch.Loader's workers write a sample into its
// place in a pinned batch slot. The common case, an image decoded as height x width x channels and
// handed over as a channels-first view (torchvision's PILToTensor, `.permute(2, 0, 1)`), is a
// deinterleave, which a byte-at-a-time strided copy (torch's copy_, numpy's copyto) does 4-5 times slower
// than this one.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace ferry {

/// Most dimensions an array given to copy_strided may have.
inline constexpr std::size_t kMaxStridedDims = 32;

/// Copies the array at `src` of `shape`, whose element (i0, i1, ...) is at byte offset
/// sum(ik * strides[k]) and `item_bytes` long, into `dst` densely in C order. Strides may be zero or
/// negative; `dst` must not overlap the source elements. Throws ferry::logic_error, naming the value and
/// the limit, when shape and strides differ in length, there are more than kMaxStridedDims dimensions,
/// a size is negative or item_bytes is 0.
void copy_strided(std::byte* dst, const std::byte* src, std::span<const std::int64_t> shape,
                  std::span<const std::int64_t> strides, std::size_t item_bytes);

}  // namespace ferry
