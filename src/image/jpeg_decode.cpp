#include "ferry/image/jpeg_decode.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "ferry/core/error.hpp"
#include "ferry/image/jpeg_info.hpp"

#if __has_include(<jpeglib.h>)
// <jpeglib.h> needs <cstdio> (FILE) before it.
#include <csetjmp>
#include <cstdio>

#include <jpeglib.h>

#include "ferry/shim/jpeg.hpp"
#define FERRY_IMAGE_HAVE_JPEGLIB_H 1
#endif

namespace ferry::image {

int jpeg_scale_for(std::int32_t box_height, std::int32_t box_width, std::int32_t size) noexcept {
  const std::int64_t need = std::int64_t{size} * 8;
  const std::int64_t side = std::min(box_height, box_width);
  for (int n = 1; n < 8; n *= 2)
    if (side * n >= need) return n;
  return 8;
}

#ifdef FERRY_IMAGE_HAVE_JPEGLIB_H

namespace {

// Note [CPU decode and crop] (jpeg_decode.hpp). The resize is Pillow's ImagingResample for 8-bit images
// (libImaging/Resample.c, Pillow 9): the same coefficients, the same 22-bit fixed point, the same rounding
// after each pass, so at scale 8/8 the output matches PIL's crop(box).resize(size, BILINEAR) byte for byte.
constexpr int precision_bits = 32 - 8 - 2;

// The taps of one axis: output i reads `count[i]` inputs from `first[i]` with weights coeffs[i * ksize ...].
struct axis_taps {
  int ksize = 0;
  std::vector<std::int32_t> first;
  std::vector<std::int32_t> count;
  std::vector<std::int32_t> coeffs;
  std::vector<double> weights;  // scratch of one output's weights

  [[nodiscard]] std::int32_t begin() const { return first.front(); }
  [[nodiscard]] std::int32_t end() const { return first.back() + count.back(); }
};

double triangle(double x) noexcept {
  x = std::fabs(x);
  return x < 1.0 ? 1.0 - x : 0.0;
}

// Pillow's precompute_coeffs + normalize_coeffs_8bpc for the input span [in0, in1) resized to `out`, the
// taps kept inside [lo, hi) (the box's pixels, as PIL's crop() keeps them).
void make_taps(double in0, double in1, int lo, int hi, int out, axis_taps& t) {
  const double scale = (in1 - in0) / out;
  const double filterscale = std::max(scale, 1.0);
  const double support = 1.0 * filterscale;
  t.ksize = static_cast<int>(std::ceil(support)) * 2 + 1;
  t.first.resize(static_cast<std::size_t>(out));
  t.count.resize(static_cast<std::size_t>(out));
  t.coeffs.assign(static_cast<std::size_t>(out) * static_cast<std::size_t>(t.ksize), 0);
  t.weights.resize(static_cast<std::size_t>(t.ksize));
  const double ss = 1.0 / filterscale;
  for (int xx = 0; xx < out; ++xx) {
    const double center = in0 + (xx + 0.5) * scale;
    // Pillow's own rounding (a cast of x + 0.5), kept so the taps are Pillow's.
    int xmin = static_cast<int>(center - support + 0.5);  // NOLINT(bugprone-incorrect-roundings)
    xmin = std::max(xmin, lo);
    int xmax = static_cast<int>(center + support + 0.5);  // NOLINT(bugprone-incorrect-roundings)
    xmax = std::min(xmax, hi) - xmin;
    xmax = std::clamp(xmax, 0, t.ksize);
    double ww = 0.0;
    for (int x = 0; x < xmax; ++x) {
      const double w = triangle((x + xmin - center + 0.5) * ss);
      t.weights[static_cast<std::size_t>(x)] = w;
      ww += w;
    }
    std::int32_t* k = &t.coeffs[static_cast<std::size_t>(xx) * static_cast<std::size_t>(t.ksize)];
    for (int x = 0; x < xmax; ++x) {
      double w = t.weights[static_cast<std::size_t>(x)];
      if (ww != 0.0) w /= ww;
      const double fixed = w * (1 << precision_bits);
      k[x] = static_cast<std::int32_t>(fixed < 0 ? fixed - 0.5 : fixed + 0.5);
    }
    t.first[static_cast<std::size_t>(xx)] = xmin;
    t.count[static_cast<std::size_t>(xx)] = xmax;
  }
}

[[gnu::always_inline]] inline std::uint8_t clip8(std::int32_t v) noexcept {
  v >>= precision_bits;
  return static_cast<std::uint8_t>(std::clamp(v, 0, 255));
}

// Buffers a thread reuses from call to call (grown, never shrunk): no allocation per sample once warm.
struct scratch {
  axis_taps horizontal;
  axis_taps vertical;
  std::vector<std::uint8_t> decoded;  // the decoded region, rows x width RGBX pixels
  std::vector<JSAMPROW> rows;
  std::vector<std::uint8_t> wide;  // after the horizontal pass: rows x size RGBX pixels
  std::vector<std::int32_t> acc;   // one output row of the vertical pass
  std::vector<std::uint8_t> line;  // the same, rounded
};

scratch& thread_scratch() {
  thread_local scratch s;
  return s;
}

// libjpeg's error manager, extended: error_exit formats the message and jumps back to the setjmp of the
// phase that called libjpeg (decode_header or decode_rows), which hold no C++ object with a destructor.
struct error_state {
  jpeg_error_mgr mgr;
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
  int warnings;
};

extern "C" void ferry_jpeg_error_exit(j_common_ptr c) {
  auto* e = reinterpret_cast<error_state*>(c->err);  // NOLINT(cppcoreguidelines-pro-type-reinterpret-cast)
  (*c->err->format_message)(c, e->message);
  std::longjmp(e->jump, 1);  // NOLINT(cert-err52-cpp): libjpeg's documented way out of an error
}

// Warnings (corrupt data libjpeg continues past) are counted, not printed; trace messages are dropped.
extern "C" void ferry_jpeg_emit_message(j_common_ptr c, int level) {
  if (level < 0) {
    auto* e = reinterpret_cast<error_state*>(c->err);  // NOLINT(cppcoreguidelines-pro-type-reinterpret-cast)
    ++e->warnings;
  }
}

// Phase 1: create, read the header, pick the output scale and color space, compute the output size. Returns
// false after a libjpeg error (its message in err.message). Only trivially destructible objects here.
bool decode_header(const shim::jpeg_api& api, jpeg_decompress_struct& cinfo, error_state& err,
                   std::span<const std::byte> jpeg, int scale_num) {
  if (setjmp(err.jump) != 0) return false;  // NOLINT(cert-err52-cpp)
  api.create_decompress(&cinfo, JPEG_LIB_VERSION, sizeof(jpeg_decompress_struct));
  api.mem_src(&cinfo, reinterpret_cast<const unsigned char*>(jpeg.data()),  // NOLINT
              static_cast<unsigned long>(jpeg.size()));                     // NOLINT(google-runtime-int)
  api.read_header(&cinfo, TRUE);
  cinfo.scale_num = static_cast<unsigned>(scale_num);
  cinfo.scale_denom = 8;
  cinfo.out_color_space = JCS_EXT_RGBX;  // grayscale too: libjpeg-turbo replicates it
  cinfo.dct_method = JDCT_ISLOW;         // PIL's default
  cinfo.do_fancy_upsampling = TRUE;
  api.calc_output_dimensions(&cinfo);
  return true;
}

// Phase 2: decode scaled rows [y0, y1) of the scaled columns [x0, x1) (widened by jpeg_crop_scanline to
// iMCU boundaries: `xoffset` is where row buffers begin), into rows[0 .. y1 - y0). Same rules as phase 1.
bool decode_rows(const shim::jpeg_api& api, jpeg_decompress_struct& cinfo, error_state& err, unsigned x0,
                 unsigned x1, unsigned y0, unsigned y1, JSAMPROW* rows, unsigned& xoffset, unsigned& width) {
  if (setjmp(err.jump) != 0) return false;  // NOLINT(cert-err52-cpp)
  api.start_decompress(&cinfo);
  xoffset = x0;
  width = x1 - x0;
  if (width < cinfo.output_width)
    api.crop_scanline(&cinfo, &xoffset, &width);
  else
    xoffset = 0, width = cinfo.output_width;
  if (y0 > 0) api.skip_scanlines(&cinfo, y0);
  unsigned done = 0;
  while (done < y1 - y0) {
    const unsigned got = api.read_scanlines(&cinfo, rows + done, y1 - y0 - done);
    if (got == 0) break;  // suspended: cannot happen with a memory source, which never suspends
    done += got;
  }
  api.abort_decompress(&cinfo);
  return done == y1 - y0;
}

// Destroys the decompressor whatever happened (jpeg_destroy_decompress tolerates a partial create).
struct decompressor {
  const shim::jpeg_api& api;
  jpeg_decompress_struct cinfo{};
  error_state err{};
  explicit decompressor(const shim::jpeg_api& a) : api(a) {
    cinfo.err = api.std_error(&err.mgr);
    err.mgr.error_exit = ferry_jpeg_error_exit;
    err.mgr.emit_message = ferry_jpeg_emit_message;
  }
  decompressor(const decompressor&) = delete;
  decompressor& operator=(const decompressor&) = delete;
  ~decompressor() { api.destroy_decompress(&cinfo); }
};

// Pixels are 4 bytes (libjpeg-turbo's RGBX), so each tap is one 4-lane multiply-add (the vectorizer
// makes it one instruction) and rows stay aligned to pixels.
constexpr std::size_t lanes = 4;

// The vertical pass is built twice on x86-64, for AVX2 (pmulld: 32-bit lane multiplies) and for the
// baseline SSE2 (which emulates them), picked at the first call by __builtin_cpu_supports (not an ifunc:
// the loader runs ifunc resolvers before ThreadSanitizer's and AddressSanitizer's runtimes start, and an
// instrumented resolver crashes there); the horizontal pass has an SSE4.1 form of its own
// (resample_horizontal_sse41).
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define FERRY_IMAGE_HAVE_AVX2_PASS 1
#endif

// One RGBX pixel as four 32-bit lanes (GCC's and Clang's vector extension: one SSE/NEON register).
using pixel_i32 = std::int32_t __attribute__((vector_size(16)));
using pixel_u8 = std::uint8_t __attribute__((vector_size(4)));

[[gnu::always_inline]] inline pixel_i32 load_pixel(const std::uint8_t* p) noexcept {
  pixel_u8 v;
  std::memcpy(&v, p, sizeof v);
  return __builtin_convertvector(v, pixel_i32);
}

[[gnu::always_inline]] inline void store_pixel(pixel_i32 acc, std::uint8_t* p) noexcept {
  pixel_i32 v = acc >> precision_bits;
  v = v < 0 ? 0 : v;
  v = v > 255 ? 255 : v;
  const auto b = __builtin_convertvector(v, pixel_u8);
  std::memcpy(p, &b, sizeof b);
}

// Horizontal pass over `n_rows` rows of `in` (stride in_stride, RGBX, first column = input column
// `offset`), into `out` (n_rows x size RGBX). K > 0: every output reads exactly K inputs (the taps padded
// with zero weights, the rows with K columns of slack), so the tap loop unrolls.
template <int K>
void resample_horizontal(const std::uint8_t* in, std::size_t in_stride, int offset, std::size_t n_rows,
                         const axis_taps& t, int size, std::uint8_t* out) {
  const auto out_stride = static_cast<std::size_t>(size) * lanes;
  const std::int32_t* coeffs = t.coeffs.data();
  const std::int32_t* first = t.first.data();
  const std::int32_t* count = t.count.data();
  const auto ksize = static_cast<std::size_t>(t.ksize);
  const pixel_i32 half = {1 << (precision_bits - 1), 1 << (precision_bits - 1), 1 << (precision_bits - 1),
                          1 << (precision_bits - 1)};
  for (std::size_t y = 0; y < n_rows; ++y) {
    const std::uint8_t* row = in + y * in_stride;
    std::uint8_t* o = out + y * out_stride;
    for (int xx = 0; xx < size; ++xx) {
      const std::int32_t* k = coeffs + static_cast<std::size_t>(xx) * ksize;
      const std::uint8_t* p = row + static_cast<std::size_t>(first[xx] - offset) * lanes;
      pixel_i32 acc = half;
      const int n = K > 0 ? K : count[xx];
      for (int x = 0; x < n; ++x) acc += load_pixel(p + lanes * static_cast<std::size_t>(x)) * k[x];
      store_pixel(acc, o + lanes * static_cast<std::size_t>(xx));
    }
  }
}

#if defined(__x86_64__) && defined(__GNUC__)
// resample_horizontal with SSE4.1 (every x86-64 CPU since 2008 has it): one pmovzxbd, pmulld and paddd per
// tap, the rounding shift and the two saturating packs being clip8's clamp.
template <int K>
__attribute__((target("sse4.1"))) void resample_horizontal_sse41(const std::uint8_t* in,
                                                                 std::size_t in_stride, int offset,
                                                                 std::size_t n_rows, const axis_taps& t,
                                                                 int size, std::uint8_t* out) {
  const auto out_stride = static_cast<std::size_t>(size) * lanes;
  const std::int32_t* coeffs = t.coeffs.data();
  const std::int32_t* first = t.first.data();
  const std::int32_t* count = t.count.data();
  const auto ksize = static_cast<std::size_t>(t.ksize);
  const __m128i half = _mm_set1_epi32(1 << (precision_bits - 1));
  for (std::size_t y = 0; y < n_rows; ++y) {
    const std::uint8_t* row = in + y * in_stride;
    std::uint8_t* o = out + y * out_stride;
    for (int xx = 0; xx < size; ++xx) {
      const std::int32_t* k = coeffs + static_cast<std::size_t>(xx) * ksize;
      const std::uint8_t* p = row + static_cast<std::size_t>(first[xx] - offset) * lanes;
      __m128i acc = half;
      const int n = K > 0 ? K : count[xx];
      for (int x = 0; x < n; ++x) {
        std::int32_t word = 0;
        std::memcpy(&word, p + lanes * static_cast<std::size_t>(x), sizeof word);
        const __m128i px = _mm_cvtepu8_epi32(_mm_cvtsi32_si128(word));
        acc = _mm_add_epi32(acc, _mm_mullo_epi32(px, _mm_set1_epi32(k[x])));
      }
      acc = _mm_srai_epi32(acc, precision_bits);
      const __m128i w = _mm_packus_epi16(_mm_packs_epi32(acc, acc), acc);
      const std::int32_t packed = _mm_cvtsi128_si32(w);
      std::memcpy(o + lanes * static_cast<std::size_t>(xx), &packed, sizeof packed);
    }
  }
}

bool have_sse41() noexcept {
  static const bool yes = __builtin_cpu_supports("sse4.1") != 0;
  return yes;
}
#endif

template <int K>
void resample_horizontal_k(const std::uint8_t* in, std::size_t in_stride, int offset, std::size_t n_rows,
                           const axis_taps& t, int size, std::uint8_t* out) {
#if defined(__x86_64__) && defined(__GNUC__)
  if (have_sse41()) {
    resample_horizontal_sse41<K>(in, in_stride, offset, n_rows, t, size, out);
    return;
  }
#endif
  resample_horizontal<K>(in, in_stride, offset, n_rows, t, size, out);
}

void resample_horizontal_any(const std::uint8_t* in, std::size_t in_stride, int offset, std::size_t n_rows,
                             const axis_taps& t, int size, std::uint8_t* out) {
  switch (t.ksize) {
    case 3: resample_horizontal_k<3>(in, in_stride, offset, n_rows, t, size, out); return;
    case 5: resample_horizontal_k<5>(in, in_stride, offset, n_rows, t, size, out); return;
    case 7: resample_horizontal_k<7>(in, in_stride, offset, n_rows, t, size, out); return;
    default: resample_horizontal_k<0>(in, in_stride, offset, n_rows, t, size, out); return;
  }
}

// Vertical pass from `in` (rows from input row `offset`, size RGBX pixels each) to the output, flipped and
// laid out as asked. `acc` and `line` are one row's scratch.
[[gnu::always_inline]] inline void resample_vertical_body(const std::uint8_t* in, int offset,
                                                          const axis_taps& t, int size, bool flip,
                                                          pixel_layout layout, std::vector<std::int32_t>& acc,
                                                          std::vector<std::uint8_t>& line,
                                                          std::uint8_t* out) {
  const auto side = static_cast<std::size_t>(size);
  const std::size_t width = side * lanes;
  const std::size_t plane = side * side;
  acc.resize(width);
  line.resize(width);
  std::int32_t* a = acc.data();
  std::uint8_t* l = line.data();
  for (std::size_t yy = 0; yy < side; ++yy) {
    for (std::size_t i = 0; i < width; ++i) a[i] = 1 << (precision_bits - 1);
    const std::int32_t* k = &t.coeffs[yy * static_cast<std::size_t>(t.ksize)];
    const int first = t.first[yy] - offset;
    const int n = t.count[yy];
    for (int y = 0; y < n; ++y) {
      const std::uint8_t* row = in + static_cast<std::size_t>(first + y) * width;
      const std::int32_t c = k[y];
      for (std::size_t i = 0; i < width; ++i) a[i] += row[i] * c;
    }
    for (std::size_t i = 0; i < width; ++i) l[i] = clip8(a[i]);
    if (layout == pixel_layout::hwc) {
      std::uint8_t* o = out + yy * side * 3;
      for (std::size_t x = 0; x < side; ++x) {
        const std::size_t from = (flip ? side - 1 - x : x) * lanes;
        o[3 * x] = l[from];
        o[3 * x + 1] = l[from + 1];
        o[3 * x + 2] = l[from + 2];
      }
    } else {
      std::uint8_t* r = out + yy * side;
      std::uint8_t* g = r + plane;
      std::uint8_t* b = g + plane;
      for (std::size_t x = 0; x < side; ++x) {
        const std::size_t from = (flip ? side - 1 - x : x) * lanes;
        r[x] = l[from];
        g[x] = l[from + 1];
        b[x] = l[from + 2];
      }
    }
  }
}

#ifdef FERRY_IMAGE_HAVE_AVX2_PASS
__attribute__((target("avx2"))) void resample_vertical_avx2(
    const std::uint8_t* in, int offset, const axis_taps& t, int size, bool flip, pixel_layout layout,
    std::vector<std::int32_t>& acc, std::vector<std::uint8_t>& line, std::uint8_t* out) {
  resample_vertical_body(in, offset, t, size, flip, layout, acc, line, out);
}
#endif

void resample_vertical(const std::uint8_t* in, int offset, const axis_taps& t, int size, bool flip,
                       pixel_layout layout, std::vector<std::int32_t>& acc, std::vector<std::uint8_t>& line,
                       std::uint8_t* out) {
#ifdef FERRY_IMAGE_HAVE_AVX2_PASS
  static const bool avx2 = __builtin_cpu_supports("avx2") != 0;
  if (avx2) {
    resample_vertical_avx2(in, offset, t, size, flip, layout, acc, line, out);
    return;
  }
#endif
  resample_vertical_body(in, offset, t, size, flip, layout, acc, line, out);
}

}  // namespace

void decode_jpeg_crop(std::span<const std::byte> jpeg, const crop_box& box, std::int32_t size,
                      pixel_layout layout, std::uint8_t* out, std::size_t out_bytes) {
  FERRY_EXPECTS(size >= 1 && size <= max_output_size,
                fmt::format("output size {} must lie in [1, {}]", size, max_output_size));
  FERRY_EXPECTS(layout == pixel_layout::chw || layout == pixel_layout::hwc,
                fmt::format("pixel layout {} is neither chw (0) nor hwc (1)", static_cast<int>(layout)));
  const std::size_t need = std::size_t{3} * static_cast<std::size_t>(size) * static_cast<std::size_t>(size);
  FERRY_EXPECTS(out != nullptr && out_bytes >= need,
                fmt::format("the output of {} bytes cannot hold a 3 x {} x {} sample ({} bytes)",
                            out == nullptr ? 0 : out_bytes, size, size, need));
  const jpeg_info info = read_jpeg_info(jpeg);
  if (const char* why = undecodable_reason(info); why != nullptr) {
    FERRY_EXPECTS(
        false,
        fmt::format("cannot decode {} bytes: {} (at byte {}{})", jpeg.size(), why, info.offset,
                    info.ok() ? fmt::format(", {} {} x {}", to_string(info.process), info.height, info.width)
                              : std::string()));
  }
  validate(box, info.height, info.width);

  const shim::jpeg_api& api = shim::require_jpeg();
  const int n = jpeg_scale_for(box.height, box.width, size);
  decompressor d(api);
  if (!decode_header(api, d.cinfo, d.err, jpeg, n))
    throw input_error(
        fmt::format("libjpeg cannot read the header of {} bytes: {}", jpeg.size(), d.err.message));
  FERRY_EXPECTS(
      static_cast<std::int64_t>(d.cinfo.image_height) == info.height &&
          static_cast<std::int64_t>(d.cinfo.image_width) == info.width && d.cinfo.output_components == 4,
      fmt::format("libjpeg reads a {} x {} image of {} output components where the frame header says "
                  "{} x {}",
                  d.cinfo.image_height, d.cinfo.image_width, d.cinfo.output_components, info.height,
                  info.width));
  const auto out_w = static_cast<int>(d.cinfo.output_width);
  const auto out_h = static_cast<int>(d.cinfo.output_height);

  // The box in scaled pixels: fractional edges, taps kept to the scaled pixels it covers.
  const double f = n / 8.0;
  const double x_in0 = box.left * f;
  const double x_in1 = (box.left + box.width) * f;
  const double y_in0 = box.top * f;
  const double y_in1 = (box.top + box.height) * f;
  scratch& s = thread_scratch();
  make_taps(x_in0, x_in1, static_cast<int>(std::floor(x_in0)),
            std::min(out_w, static_cast<int>(std::ceil(x_in1))), size, s.horizontal);
  make_taps(y_in0, y_in1, static_cast<int>(std::floor(y_in0)),
            std::min(out_h, static_cast<int>(std::ceil(y_in1))), size, s.vertical);
  const auto x0 = static_cast<unsigned>(s.horizontal.begin());
  const auto x1 = static_cast<unsigned>(std::max(s.horizontal.end(), s.horizontal.begin() + 1));
  const auto y0 = static_cast<unsigned>(s.vertical.begin());
  const auto y1 = static_cast<unsigned>(std::max(s.vertical.end(), s.vertical.begin() + 1));

  // jpeg_crop_scanline widens the columns by less than one iMCU (at most 4 x 8 scaled pixels) on the left.
  const std::size_t max_width = std::min<std::size_t>(out_w, x1 - x0 + 32);
  // K columns of slack: the horizontal pass reads ksize inputs for every output (zero weights past count).
  const std::size_t stride = (max_width + static_cast<std::size_t>(s.horizontal.ksize)) * lanes;
  const std::size_t n_rows = y1 - y0;
  s.decoded.resize(n_rows * stride);
  s.rows.resize(n_rows);
  for (std::size_t i = 0; i < n_rows; ++i) s.rows[i] = s.decoded.data() + i * stride;
  unsigned xoffset = 0;
  unsigned width = 0;
  if (!decode_rows(api, d.cinfo, d.err, x0, x1, y0, y1, s.rows.data(), xoffset, width))
    throw input_error(fmt::format("libjpeg cannot decode the {} bytes of a {} x {} JPEG: {}", jpeg.size(),
                                  info.height, info.width,
                                  d.err.message[0] != '\0' ? d.err.message : "rows missing"));
  FERRY_EXPECTS(xoffset <= x0 && xoffset + width >= x1 && width <= max_width,
                fmt::format("jpeg_crop_scanline gave columns [{}, {}) for [{}, {}) (room for {})", xoffset,
                            xoffset + width, x0, x1, max_width));

  s.wide.resize(n_rows * static_cast<std::size_t>(size) * lanes);
  resample_horizontal_any(s.decoded.data(), stride, static_cast<int>(xoffset), n_rows, s.horizontal, size,
                          s.wide.data());
  resample_vertical(s.wide.data(), static_cast<int>(y0), s.vertical, size, box.flip == 1, layout, s.acc,
                    s.line, out);
}

#else  // no <jpeglib.h> at build time

void decode_jpeg_crop(std::span<const std::byte> /*jpeg*/, const crop_box& /*box*/, std::int32_t /*size*/,
                      pixel_layout /*layout*/, std::uint8_t* /*out*/, std::size_t /*out_bytes*/) {
  FERRY_EXPECTS(false,
                "this ferry was built without <jpeglib.h>, so it has no CPU JPEG decode; install "
                "libjpeg62-turbo-dev (Debian/Ubuntu) and rebuild ferry");
}

#endif

}  // namespace ferry::image
