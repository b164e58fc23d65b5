// The JPEG header parse against every truncation and lying lengths of a hand-made header, and the crop
// box generator's arithmetic (no libjpeg needed: the decode is tested from Python against PIL,
// tests/python/test_image.py).
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "ferry/image/crop_box.hpp"
#include "ferry/image/jpeg_decode.hpp"
#include "ferry/image/jpeg_info.hpp"

namespace ferry::image {
namespace {

__extension__ using wide_uint = unsigned __int128;  // GCC's and Clang's: the reference of mul_high

std::vector<std::byte> bytes(std::initializer_list<unsigned> v) {
  std::vector<std::byte> out;
  for (unsigned b : v) out.push_back(static_cast<std::byte>(b));
  return out;
}

// SOI, an APP0 of 16 bytes, an Adobe APP14 (transform 1), a progressive SOF2 of 3 components 4:2:0,
// 300 x 451, then SOS.
std::vector<std::byte> header() {
  return bytes(
      {0xFF, 0xD8,                                                                                // SOI
       0xFF, 0xE0, 0x00, 0x10, 'J',  'F',  'I',  'F',  0,    1,  1,   0,    0, 1, 0,    1, 0, 0,  // APP0
       0xFF, 0xEE, 0x00, 0x0E, 'A',  'd',  'o',  'b',  'e',  0,  100, 0,    0, 0, 0,    1,        // APP14
       0xFF, 0xFF,                                                                                // fill
       0xFF, 0xC2, 0x00, 0x11, 8,    0x01, 0x2C, 0x01, 0xC3, 3,  1,   0x22, 0, 2, 0x11, 1, 3, 0x11,
       1,    0xFF, 0xDA, 0x00, 0x08, 1,    1,    0,    0,    63, 0});
}

TEST(jpeg_info, a_progressive_4_2_0_header_is_read_whole) {
  const auto h = header();
  const jpeg_info info = read_jpeg_info(h);
  ASSERT_TRUE(info.ok()) << to_string(info.status);
  EXPECT_EQ(info.process, jpeg_process::progressive);
  EXPECT_TRUE(info.progressive() && info.decodable());
  EXPECT_EQ(info.height, 300);
  EXPECT_EQ(info.width, 451);
  EXPECT_EQ(info.components, 3);
  EXPECT_EQ(info.precision, 8);
  EXPECT_EQ(info.adobe_transform, 1);
  EXPECT_EQ(info.h_sampling[0], 2);
  EXPECT_EQ(info.v_sampling[0], 2);
  EXPECT_EQ(info.h_sampling[1], 1);
  EXPECT_EQ(info.v_sampling[2], 1);
  EXPECT_EQ(info.offset, 36U);  // the first byte of the fill before SOF2
}

TEST(jpeg_info, every_truncation_is_reported_as_such_and_never_read_past) {
  const auto h = header();
  const std::size_t frame_end = 38 + 2 + 0x11;
  for (std::size_t n = 0; n < h.size(); ++n) {
    // A copy of exactly n bytes: reading past it is a heap overflow that the sanitizer builds catch.
    const std::vector<std::byte> cut(h.begin(), h.begin() + static_cast<std::ptrdiff_t>(n));
    const jpeg_info info = read_jpeg_info(cut);
    if (n < 2) {
      EXPECT_EQ(info.status, jpeg_status::not_jpeg) << n;
    } else if (n < frame_end) {
      EXPECT_EQ(info.status, jpeg_status::truncated) << n;
      EXPECT_FALSE(info.decodable());
      EXPECT_LE(info.offset, n);
    } else {
      EXPECT_TRUE(info.ok()) << n;
    }
  }
}

TEST(jpeg_info, lying_lengths_and_odd_frames_are_refused_by_name) {
  auto h = header();
  h[4] = std::byte{0xFF};  // APP0 claims 65,535 bytes
  EXPECT_EQ(read_jpeg_info(h).status, jpeg_status::truncated);
  h = header();
  h[5] = std::byte{0x01};  // APP0 length 1: under its own two bytes
  h[4] = std::byte{0x00};
  EXPECT_EQ(read_jpeg_info(h).status, jpeg_status::bad_marker);
  h = header();
  h[38 + 2 + 2 + 5] = std::byte{0};  // the frame's component count 0
  EXPECT_EQ(read_jpeg_info(h).status, jpeg_status::bad_frame);
  h = header();
  h[38 + 2 + 2 + 7] = std::byte{0x50};  // a sampling factor of 5
  EXPECT_EQ(read_jpeg_info(h).status, jpeg_status::bad_frame);
  h = header();
  h[38 + 2 + 2 + 1] = h[38 + 2 + 2 + 2] = std::byte{0};  // height 0 (a DNL frame)
  EXPECT_EQ(read_jpeg_info(h).status, jpeg_status::zero_size);
  h = header();
  h[39] = std::byte{0xCB};  // SOF11: lossless arithmetic
  const jpeg_info arith = read_jpeg_info(h);
  EXPECT_TRUE(arith.ok());
  EXPECT_EQ(arith.process, jpeg_process::arithmetic);
  EXPECT_STREQ(undecodable_reason(arith), "an arithmetic-coded JPEG");
  h = header();
  h[2] = std::byte{0x12};  // no marker where one must be
  EXPECT_EQ(read_jpeg_info(h).status, jpeg_status::bad_marker);
  EXPECT_EQ(read_jpeg_info(bytes({0xFF, 0xD8, 0xFF, 0xDA, 0, 2})).status, jpeg_status::no_frame);
  EXPECT_EQ(read_jpeg_info(bytes({0x89, 'P', 'N', 'G'})).status, jpeg_status::not_jpeg);
}

TEST(crop_rng, the_high_product_and_the_draws_are_the_documented_arithmetic) {
  for (std::uint64_t a : {0ULL, 1ULL, 0xFFFFFFFFFFFFFFFFULL, 0x9E3779B97F4A7C15ULL, 12345678901234567ULL}) {
    for (std::uint64_t b : {0ULL, 1ULL, 3ULL, 0xFFFFFFFFULL, 0xFFFFFFFFFFFFFFFFULL, 640ULL}) {
      const auto wide = static_cast<wide_uint>(a) * b;
      EXPECT_EQ(crop_rng::mul_high(a, b), static_cast<std::uint64_t>(wide >> 64U)) << a << " " << b;
    }
  }
  // splitmix64's published first outputs for seed 0.
  crop_rng g(0);
  EXPECT_EQ(g.next(), 0xE220A8397B1DCDAFULL);
  EXPECT_EQ(g.next(), 0x6E789E6AA1B965F4ULL);
  crop_rng u(42);
  for (int i = 0; i < 1000; ++i) {
    const double x = u.uniform();
    ASSERT_TRUE(x >= 0.0 && x < 1.0);
    ASSERT_LT(u.below(7), 7U);
  }
}

TEST(crop_box, boxes_lie_inside_their_image_and_scales_are_powers_of_two) {
  const crop_params p;
  for (std::uint64_t seed = 0; seed < 2000; ++seed) {
    const auto h = static_cast<std::int32_t>(1 + seed % 997);
    const auto w = static_cast<std::int32_t>(1 + (seed * 7919) % 1499);
    const crop_box b = make_crop_box(h, w, seed, crop_mode::random_resized, p);
    EXPECT_NO_THROW(validate(b, h, w)) << seed;
  }
  EXPECT_EQ(jpeg_scale_for(1800, 2000, 224), 1);  // 1800 / 8 = 225
  EXPECT_EQ(jpeg_scale_for(1791, 2000, 224), 2);
  EXPECT_EQ(jpeg_scale_for(448, 448, 224), 4);
  EXPECT_EQ(jpeg_scale_for(447, 900, 224), 8);
  EXPECT_EQ(jpeg_scale_for(100, 100, 224), 8);  // enlarged
}

}  // namespace
}  // namespace ferry::image
