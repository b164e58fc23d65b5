// The CPU decode of one JPEG sample into a fixed-size uint8 RGB output: libjpeg-turbo (opened at run time
// through ferry::shim) with DCT scaling and crop-region decode, then an antialiased bilinear resize of the
// crop box to size x size and the box's flip.
//
// Note [CPU decode and crop]:
// - Scale: libjpeg decodes at scale_num/8, scale_num the smallest of 1, 2, 4 and 8 whose scaled box is
//   still at least `size` in both sides (scaled box = box * scale_num / 8), so the resize only ever shrinks
//   or keeps; an image smaller than `size` decodes at 8/8 and is enlarged. Only powers of two, as Pillow's
//   draft(): libjpeg-turbo has SIMD inverse DCTs for those, while 3/8, 5/8, 6/8 and 7/8 run plain C ones
//   (for 4:2:0 chroma at twice the size: 6/8 is a 12x12 IDCT), which measured slower here than decoding
//   at the next power of two and resizing more (docs/PERFORMANCE.md, CPU JPEG decode).
// - Region: jpeg_crop_scanline narrows the decoded columns to the iMCU columns covering the box,
//   jpeg_skip_scanlines skips the rows above it, and decoding stops after its last row (the rows below are
//   never decoded: jpeg_abort_decompress).
// - Resize: separable, triangle filter whose support widens by the downscale factor, sampling the exact
//   box in scaled coordinates (fractional edges box * scale_num / 8), taps kept inside the box's scaled
//   pixels: Pillow's BILINEAR resample (ImagingResample, 22-bit fixed point, horizontal pass then
//   vertical, each rounded to 8 bits), so at scale 8/8 the output equals PIL's
//   crop(box).resize((size, size), BILINEAR) byte for byte.
// - Flip mirrors the output columns; grayscale is replicated to three channels.
// - Refused by name (logic_error): not a JPEG, truncated headers, CMYK/YCCK, lossless, arithmetic-coded,
//   hierarchical and 12-bit JPEGs (jpeg_info.hpp's undecodable_reason). Progressive JPEGs decode (the whole
//   image is buffered by libjpeg, so they cost more). Corrupt scan data libjpeg can continue past (a
//   truncated scan) decodes with its warning ignored, as PIL does; an error libjpeg stops on throws
//   input_error with libjpeg's message.
//
// Host only; thread-safe (each call owns its libjpeg state).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "ferry/image/crop_box.hpp"

namespace ferry::image {

/// How an output sample's 3 x size x size bytes are laid out.
enum class pixel_layout : std::int32_t {
  chw = 0,  // three planes R, G, B of size x size rows
  hwc = 1   // size x size pixels of R, G, B
};

/// The largest output side ferry decodes to (outputs of 3 x 8192 x 8192 bytes).
inline constexpr std::int32_t max_output_size = 8192;

/// The DCT scale numerator (over 8) the decode uses for a box of `box_height` x `box_width` pixels resized
/// to `size`: the smallest n of 1, 2, 4 with n * side / 8 >= size for both sides, else 8.
[[nodiscard]] int jpeg_scale_for(std::int32_t box_height, std::int32_t box_width, std::int32_t size) noexcept;

/// Decodes `jpeg`, crops `box` (validated against the image's size), resizes to size x size and flips as
/// box.flip says, writing 3 * size * size bytes at `out` (`out_bytes` of room; logic_error when smaller).
/// Throws logic_error for an undecodable JPEG (naming what it is) or a bad box/size, input_error for
/// data libjpeg cannot decode, and logic_error naming what to install when libjpeg is missing.
void decode_jpeg_crop(std::span<const std::byte> jpeg, const crop_box& box, std::int32_t size,
                      pixel_layout layout, std::uint8_t* out, std::size_t out_bytes);

}  // namespace ferry::image
