#include "ferry/core/strided_copy.hpp"

#include "ferry/core/error.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

namespace {

// The element-by-element gather the fast paths must equal.
std::vector<std::byte> reference(const std::byte* src, const std::vector<std::int64_t>& shape,
                                 const std::vector<std::int64_t>& strides, std::size_t item) {
  std::int64_t count = 1;
  for (auto s : shape) count *= s;
  std::vector<std::byte> out(static_cast<std::size_t>(count) * item);
  std::vector<std::int64_t> index(shape.size(), 0);
  for (std::int64_t e = 0; e < count; ++e) {
    std::int64_t off = 0;
    for (std::size_t k = 0; k < shape.size(); ++k) off += index[k] * strides[k];
    std::memcpy(out.data() + e * static_cast<std::int64_t>(item), src + off, item);
    for (std::size_t k = shape.size(); k-- > 0;) {
      if (++index[k] < shape[k]) break;
      index[k] = 0;
    }
  }
  return out;
}

// A buffer of distinct-looking bytes, with `src` placed `lead` bytes in (room for negative strides).
struct source {
  std::vector<std::byte> bytes;
  explicit source(std::size_t n) : bytes(n) {
    for (std::size_t i = 0; i < n; ++i)
      bytes[i] = std::byte(static_cast<std::uint8_t>((i * 131u + 7u) ^ (i >> 8)));
  }
};

void expect_same_as_reference(const std::byte* src, std::vector<std::int64_t> shape,
                              std::vector<std::int64_t> strides, std::size_t item) {
  const auto want = reference(src, shape, strides, item);
  // One guard byte past the end: a copy that writes too far is caught.
  std::vector<std::byte> got(want.size() + 1, std::byte{0xA5});
  ferry::copy_strided(got.data(), src, shape, strides, item);
  EXPECT_EQ(got.back(), std::byte{0xA5}) << "wrote past the end";
  got.pop_back();
  EXPECT_EQ(got, want);
}

TEST(strided_copy, an_image_viewed_channels_first_is_deinterleaved) {
  for (std::int64_t channels : {1, 2, 3, 4, 5}) {
    for (auto [h, w] : {std::pair<std::int64_t, std::int64_t>{224, 224}, {7, 13}, {1, 1}, {3, 33}}) {
      source s(static_cast<std::size_t>(h * w * channels));
      // HWC bytes, viewed as CHW (strides in bytes): image.permute(2, 0, 1)
      expect_same_as_reference(s.bytes.data(), {channels, h, w}, {1, w * channels, channels}, 1);
    }
  }
}

TEST(strided_copy, a_batch_of_channels_last_images_and_a_cropped_view) {
  source s(4 * 10 * 12 * 3);
  expect_same_as_reference(s.bytes.data(), {4, 3, 10, 12}, {10 * 12 * 3, 1, 12 * 3, 3}, 1);
  // a crop: rows 2..7 and columns 1..9 of each image, still channels first
  expect_same_as_reference(s.bytes.data() + (2 * 12 + 1) * 3, {4, 3, 6, 9}, {10 * 12 * 3, 1, 12 * 3, 3}, 1);
}

TEST(strided_copy, contiguous_transposed_negative_and_broadcast_strides_of_any_item_size) {
  for (std::size_t item : {1u, 2u, 3u, 4u, 8u, 16u}) {
    const auto i = static_cast<std::int64_t>(item);
    source s(static_cast<std::size_t>(6 * 5 * 4) * item);
    const std::byte* p = s.bytes.data();
    expect_same_as_reference(p, {6, 5, 4}, {20 * i, 4 * i, i}, item);                // contiguous
    expect_same_as_reference(p, {4, 5, 6}, {i, 4 * i, 20 * i}, item);                // fully transposed
    expect_same_as_reference(p, {6, 4}, {20 * i, i}, item);                          // rows with gaps
    expect_same_as_reference(p + 119 * i, {6, 5, 4}, {-20 * i, -4 * i, -i}, item);   // flipped every way
    expect_same_as_reference(p, {3, 5}, {0, i}, item);                               // a row broadcast
    expect_same_as_reference(p, {5, 3}, {i, 0}, item);                               // a column broadcast
    expect_same_as_reference(p, {1, 6, 1, 5, 1}, {999, 20 * i, 7, 4 * i, 3}, item);  // sizes of 1 ignored
  }
}

TEST(strided_copy, an_empty_array_writes_nothing_and_a_scalar_one_element) {
  source s(16);
  std::vector<std::byte> out(4, std::byte{0x11});
  ferry::copy_strided(out.data(), s.bytes.data(), std::vector<std::int64_t>{3, 0, 2},
                      std::vector<std::int64_t>{1, 1, 1}, 1);
  EXPECT_EQ(out, std::vector<std::byte>(4, std::byte{0x11}));
  ferry::copy_strided(out.data(), s.bytes.data() + 4, std::span<const std::int64_t>{},
                      std::span<const std::int64_t>{}, 4);
  EXPECT_EQ(0, std::memcmp(out.data(), s.bytes.data() + 4, 4));
}

TEST(strided_copy, bad_arguments_are_refused_with_the_value_and_the_limit) {
  source s(8);
  std::vector<std::byte> out(8);
  auto message = [&](std::vector<std::int64_t> shape, std::vector<std::int64_t> strides, std::size_t item) {
    try {
      ferry::copy_strided(out.data(), s.bytes.data(), shape, strides, item);
    } catch (const ferry::logic_error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  auto refused = [](const std::string& got, const std::string& want) {
    EXPECT_NE(got.find(want), std::string::npos) << got;
  };
  refused(message({2, 2}, {1}, 1), "copy_strided: 2 sizes but 1 strides; give one stride per dimension");
  refused(message({2, -1}, {1, 1}, 1), "copy_strided: size -1 of dimension 1; sizes are at least 0");
  refused(message({2}, {1}, 0), "copy_strided: item_bytes 0; an element is at least 1 byte");
  refused(message(std::vector<std::int64_t>(33, 1), std::vector<std::int64_t>(33, 1), 1),
          "copy_strided: 33 dimensions; at most 32");
}

}  // namespace
