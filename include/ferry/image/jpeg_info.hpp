// What a JPEG's header says, read from its markers without decoding (no libjpeg): size, components,
// coding process and chroma sampling. Used by the CPU decode (src/image/jpeg_decode.cpp), by the device
// decode to sort a batch before nvJPEG sees it, and by the crop boxes, which need each sample's size.
//
// Robust to any input: the parser reads only inside the given bytes (garbage, truncation and lying
// segment lengths included) and reports what it found or why it gave up; it never throws or allocates.
//
// Host only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace ferry::image {

/// The coding process a JPEG's start-of-frame marker names (ITU T.81 table B.1).
enum class jpeg_process : std::uint8_t {
  baseline = 0,     // SOF0: sequential, Huffman, 8-bit
  extended = 1,     // SOF1: sequential, Huffman, 8- or 12-bit
  progressive = 2,  // SOF2: progressive, Huffman
  lossless = 3,     // SOF3: lossless, Huffman
  arithmetic = 4,   // SOF9..SOF11: arithmetic coding (sequential, progressive or lossless)
  hierarchical = 5  // SOF5..SOF7, SOF13..SOF15: hierarchical (differential) frames
};

/// Why read_jpeg_info() gave up (jpeg_status::ok when it did not).
enum class jpeg_status : std::uint8_t {
  ok = 0,
  not_jpeg = 1,    // no SOI marker (FF D8) at the start
  truncated = 2,   // the bytes end before a start-of-frame marker was complete
  bad_marker = 3,  // a byte where a marker was expected is not FF, or a segment length is < 2
  bad_frame = 4,   // the start-of-frame segment is malformed (too short, 0 components, bad sampling)
  zero_size = 5,   // width 0, or height 0 (a DNL-defined height, which ferry does not support)
  no_frame = 6     // scan data or EOI came before any start-of-frame marker
};

/// A JPEG's header as read_jpeg_info() found it. Fields past `status` are meaningful only when ok().
struct jpeg_info {
  jpeg_status status = jpeg_status::not_jpeg;
  jpeg_process process = jpeg_process::baseline;
  std::uint8_t precision = 0;   // bits per sample (8 for everything ferry decodes)
  std::uint8_t components = 0;  // 1 grayscale, 3 YCbCr (or RGB), 4 CMYK/YCCK
  // The Adobe APP14 marker's transform when one came before the frame: 0 none (RGB or CMYK), 1 YCbCr,
  // 2 YCCK; -1 when there is no Adobe marker.
  std::int16_t adobe_transform = -1;
  std::int32_t height = 0;
  std::int32_t width = 0;
  // Sampling factors of the first four components (horizontal, vertical), 1..4 each: {2,2},{1,1},{1,1}
  // is 4:2:0, all {1,1} 4:4:4.
  std::uint8_t h_sampling[4] = {0, 0, 0, 0};
  std::uint8_t v_sampling[4] = {0, 0, 0, 0};
  // Where in the bytes the parser stopped: the start-of-frame marker's offset when ok(), else the offset
  // of the problem.
  std::size_t offset = 0;

  [[nodiscard]] bool ok() const noexcept { return status == jpeg_status::ok; }
  [[nodiscard]] bool progressive() const noexcept { return process == jpeg_process::progressive; }
  /// Whether ferry's decoders take it: 8-bit baseline, extended or progressive Huffman coding, with 1 or 3
  /// components. (CMYK/YCCK, lossless, arithmetic, hierarchical and 12-bit JPEGs are refused by name.)
  [[nodiscard]] bool decodable() const noexcept;
};

/// Reads the header of the JPEG in `bytes` up to its first start-of-frame marker. Never reads outside
/// `bytes`, never throws; status says why when it is not a JPEG ferry can size.
[[nodiscard]] jpeg_info read_jpeg_info(std::span<const std::byte> bytes) noexcept;

/// A short fixed text for `s`: "not a JPEG (no SOI marker)", "truncated before the frame header", ...
[[nodiscard]] const char* to_string(jpeg_status s) noexcept;
/// "baseline", "extended", "progressive", "lossless", "arithmetic-coded", "hierarchical".
[[nodiscard]] const char* to_string(jpeg_process p) noexcept;

/// Why ferry's decoders refuse `info` ("CMYK (4 components)", "lossless", "12-bit samples", the status'
/// text when it is not ok()), or nullptr when info.decodable().
[[nodiscard]] const char* undecodable_reason(const jpeg_info& info) noexcept;

}  // namespace ferry::image
