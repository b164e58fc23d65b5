#include "ferry/image/jpeg_info.hpp"

#include <cstddef>
#include <cstdint>
#include <span>

namespace ferry::image {

namespace {

// Markers of ITU T.81 table B.1 that matter before the frame header.
constexpr unsigned marker_soi = 0xD8;
constexpr unsigned marker_eoi = 0xD9;
constexpr unsigned marker_sos = 0xDA;
constexpr unsigned marker_tem = 0x01;
constexpr unsigned marker_rst0 = 0xD0;
constexpr unsigned marker_rst7 = 0xD7;
constexpr unsigned marker_app14 = 0xEE;
constexpr unsigned marker_dht = 0xC4;
constexpr unsigned marker_jpg = 0xC8;
constexpr unsigned marker_dac = 0xCC;

// SOF0..SOF15 less DHT, JPG and DAC, which share the range.
bool is_start_of_frame(unsigned m) noexcept {
  return m >= 0xC0 && m <= 0xCF && m != marker_dht && m != marker_jpg && m != marker_dac;
}

jpeg_process process_of(unsigned m) noexcept {
  switch (m) {
    case 0xC0: return jpeg_process::baseline;
    case 0xC1: return jpeg_process::extended;
    case 0xC2: return jpeg_process::progressive;
    case 0xC3: return jpeg_process::lossless;
    case 0xC9:
    case 0xCA:
    case 0xCB: return jpeg_process::arithmetic;
    default: return jpeg_process::hierarchical;  // C5..C7, CD..CF
  }
}

class reader {
 public:
  explicit reader(std::span<const std::byte> b) noexcept : b_(b) {}
  [[nodiscard]] std::size_t size() const noexcept { return b_.size(); }
  [[nodiscard]] unsigned at(std::size_t i) const noexcept { return std::to_integer<unsigned>(b_[i]); }
  [[nodiscard]] unsigned u16(std::size_t i) const noexcept { return (at(i) << 8U) | at(i + 1); }

 private:
  std::span<const std::byte> b_;
};

jpeg_info fail(jpeg_info info, jpeg_status s, std::size_t offset) noexcept {
  info.status = s;
  info.offset = offset;
  return info;
}

// The frame header (B.2.2) of the segment at [seg, seg + len - 2): P, Y, X, Nf, then Nf x (C, H|V, Tq).
jpeg_info read_frame(const reader& r, jpeg_info info, unsigned marker, std::size_t marker_offset,
                     std::size_t seg, std::size_t len) noexcept {
  if (len < 8) return fail(info, jpeg_status::bad_frame, marker_offset);
  const unsigned nf = r.at(seg + 5);
  if (nf == 0 || len < 8 + 3 * std::size_t{nf}) return fail(info, jpeg_status::bad_frame, marker_offset);
  info.process = process_of(marker);
  info.precision = static_cast<std::uint8_t>(r.at(seg));
  info.height = static_cast<std::int32_t>(r.u16(seg + 1));
  info.width = static_cast<std::int32_t>(r.u16(seg + 3));
  info.components = static_cast<std::uint8_t>(nf);
  for (unsigned i = 0; i < nf; ++i) {
    const unsigned hv = r.at(seg + 6 + 3 * std::size_t{i} + 1);
    const unsigned h = hv >> 4U;
    const unsigned v = hv & 0xFU;
    if (h < 1 || h > 4 || v < 1 || v > 4) return fail(info, jpeg_status::bad_frame, marker_offset);
    if (i < 4) {
      info.h_sampling[i] = static_cast<std::uint8_t>(h);
      info.v_sampling[i] = static_cast<std::uint8_t>(v);
    }
  }
  if (info.height == 0 || info.width == 0) return fail(info, jpeg_status::zero_size, marker_offset);
  info.status = jpeg_status::ok;
  info.offset = marker_offset;
  return info;
}

}  // namespace

jpeg_info read_jpeg_info(std::span<const std::byte> bytes) noexcept {
  const reader r(bytes);
  const std::size_t n = r.size();
  jpeg_info info;
  if (n < 2 || r.at(0) != 0xFF || r.at(1) != marker_soi) return fail(info, jpeg_status::not_jpeg, 0);
  std::size_t pos = 2;
  for (;;) {
    if (pos >= n) return fail(info, jpeg_status::truncated, pos);
    if (r.at(pos) != 0xFF) return fail(info, jpeg_status::bad_marker, pos);
    const std::size_t marker_offset = pos;
    while (pos < n && r.at(pos) == 0xFF) ++pos;  // fill bytes (B.1.1.2)
    if (pos >= n) return fail(info, jpeg_status::truncated, pos);
    const unsigned m = r.at(pos++);
    if (m == marker_soi || m == marker_tem || (m >= marker_rst0 && m <= marker_rst7)) continue;  // no length
    if (m == marker_eoi || m == marker_sos) return fail(info, jpeg_status::no_frame, marker_offset);
    if (m == 0x00) return fail(info, jpeg_status::bad_marker, marker_offset);
    if (n - pos < 2) return fail(info, jpeg_status::truncated, pos);
    const std::size_t len = r.u16(pos);  // counts its own two bytes
    if (len < 2) return fail(info, jpeg_status::bad_marker, pos);
    if (len > n - pos) return fail(info, jpeg_status::truncated, marker_offset);
    const std::size_t seg = pos + 2;
    if (is_start_of_frame(m)) return read_frame(r, info, m, marker_offset, seg, len);
    // Adobe APP14: "Adobe", version(2), flags0(2), flags1(2), transform(1).
    if (m == marker_app14 && len >= 14 && r.at(seg) == 'A' && r.at(seg + 1) == 'd' && r.at(seg + 2) == 'o' &&
        r.at(seg + 3) == 'b' && r.at(seg + 4) == 'e')
      info.adobe_transform = static_cast<std::int16_t>(r.at(seg + 11));
    pos += len;
  }
}

bool jpeg_info::decodable() const noexcept { return undecodable_reason(*this) == nullptr; }

const char* to_string(jpeg_status s) noexcept {
  switch (s) {
    case jpeg_status::ok: return "ok";
    case jpeg_status::not_jpeg: return "not a JPEG (no SOI marker at the start)";
    case jpeg_status::truncated: return "truncated before the end of its frame header";
    case jpeg_status::bad_marker: return "a malformed marker before its frame header";
    case jpeg_status::bad_frame: return "a malformed frame header";
    case jpeg_status::zero_size:
      return "a frame of width or height 0 (DNL-defined heights are not supported)";
    case jpeg_status::no_frame: return "scan data or EOI before any frame header";
  }
  return "unknown status";
}

const char* to_string(jpeg_process p) noexcept {
  switch (p) {
    case jpeg_process::baseline: return "baseline";
    case jpeg_process::extended: return "extended";
    case jpeg_process::progressive: return "progressive";
    case jpeg_process::lossless: return "lossless";
    case jpeg_process::arithmetic: return "arithmetic-coded";
    case jpeg_process::hierarchical: return "hierarchical";
  }
  return "unknown process";
}

const char* undecodable_reason(const jpeg_info& info) noexcept {
  if (!info.ok()) return to_string(info.status);
  switch (info.process) {
    case jpeg_process::lossless: return "a lossless JPEG";
    case jpeg_process::arithmetic: return "an arithmetic-coded JPEG";
    case jpeg_process::hierarchical: return "a hierarchical JPEG";
    default: break;
  }
  if (info.precision != 8) return "a JPEG of other than 8-bit samples";
  if (info.components == 4)
    return info.adobe_transform == 2 ? "a YCCK JPEG (4 components)" : "a CMYK JPEG (4 components)";
  if (info.components != 1 && info.components != 3) return "a JPEG of other than 1, 3 or 4 components";
  return nullptr;
}

}  // namespace ferry::image
