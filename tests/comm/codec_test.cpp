// Codecs on a device (the host backend, or a GPU with FERRY_TEST_BACKENDS=cuda): encode n ranks'
// buckets, sum the wires as the worst all-reduce would (every partial sum rounded to the wire type, in
// more than one order), decode, and check every element against the exact mean within the codec's
// documented bound. Also saturation, infinity and NaN, the vector and scalar paths of the kernels, and
// the cuda kernels bit for bit against the host implementation.
#include "ferry/comm/codec.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "ferry/comm/detail/device_ops.hpp"
#include "ferry/comm/f32_ops.hpp"
#include "ferry/comm/float16.hpp"
#include "support/test_support.hpp"

namespace ferry::comm {
namespace {

using ferry::testing::message_of;

// Rounds an exact (double) value to the wire type, to nearest with ties to even, and returns it as a
// double: the rounding an all-reduce applies to each partial sum.
double round_to_wire(double v, codec_kind c) {
  if (c == codec_kind::none) return static_cast<float>(v);
  const bool bf = c == codec_kind::bf16;
  auto enc = [&](float f) { return bf ? float_to_bf16(f) : float_to_f16(f); };
  auto dec = [&](std::uint16_t h) { return static_cast<double>(bf ? bf16_to_float(h) : f16_to_float(h)); };
  const std::uint16_t h = enc(static_cast<float>(v));
  double best = dec(h);
  std::uint16_t best_bits = h;
  // The float rounding may have landed one step off (double rounding): look at the neighbours.
  for (const int d : {-1, 1}) {
    const std::uint16_t mag = h & 0x7fffu;
    if ((d < 0 && mag == 0) || (d > 0 && mag >= (bf ? 0x7f80u : 0x7c00u))) continue;
    const auto n = static_cast<std::uint16_t>((h & 0x8000u) | static_cast<std::uint16_t>(mag + d));
    const double cand = dec(n);
    const double e_best = std::fabs(v - best);
    const double e_cand = std::fabs(v - cand);
    if (e_cand < e_best || (e_cand == e_best && (n & 1u) == 0)) {
      best = cand;
      best_bits = n;
    }
  }
  static_cast<void>(best_bits);
  return best;
}

double from_wire(const std::byte* wire, std::size_t i, codec_kind c) {
  if (c == codec_kind::none) {
    float f;
    std::memcpy(&f, wire + 4 * i, 4);
    return f;
  }
  std::uint16_t h;
  std::memcpy(&h, wire + 2 * i, 2);
  return c == codec_kind::bf16 ? bf16_to_float(h) : f16_to_float(h);
}

void to_wire(std::byte* wire, std::size_t i, double v, codec_kind c) {
  if (c == codec_kind::none) {
    const auto f = static_cast<float>(v);
    std::memcpy(wire + 4 * i, &f, 4);
    return;
  }
  const auto f = static_cast<float>(v);  // v is already a wire value: exact in fp32
  const std::uint16_t h = c == codec_kind::bf16 ? float_to_bf16(f) : float_to_f16(f);
  std::memcpy(wire + 2 * i, &h, 2);
}

class codec_device : public ::testing::TestWithParam<backend> {
 protected:
  std::unique_ptr<device> dev =
      ferry::testing::make_device_under_test(GetParam(), ferry::testing::jittery_host_options(21));
  stream s = dev->make_stream();

  std::vector<std::byte> download(mem_view v, std::size_t bytes) {
    const buffer host = dev->alloc_pinned(bytes);
    dev->copy(host.view(), v.subview(0, bytes), s);
    std::vector<std::byte> out(bytes);
    std::memcpy(out.data(), host.host_bytes(), bytes);
    return out;
  }

  void upload(mem_view dst, const std::vector<std::byte>& bytes) {
    const buffer host = dev->alloc_pinned(bytes.size());
    std::memcpy(host.host_bytes(), bytes.data(), bytes.size());
    dev->copy(dst, host.view(), s);
  }

  std::vector<float> download_floats(mem_view v, std::size_t count) {
    const auto bytes = download(v, count * 4);
    std::vector<float> out(count);
    std::memcpy(out.data(), bytes.data(), count * 4);
    return out;
  }

  void upload_floats(mem_view dst, const std::vector<float>& values) {
    std::vector<std::byte> bytes(values.size() * 4);
    std::memcpy(bytes.data(), values.data(), bytes.size());
    upload(dst, bytes);
  }

  // Encodes `ranks` buckets filled with `fill` (seed + rank) at element offset `first` (to reach the
  // kernels' scalar path), sums the wires with every partial rounded (in rank order when `forward`,
  // else reversed), decodes, and returns the largest error over the bound's budget (<= 1 passes) and the
  // largest error itself.
  std::pair<double, double> reduce_and_check(codec_kind c, int ranks, const f32_fill& fill, std::size_t count,
                                             std::size_t first, bool forward) {
    const std::size_t wb = wire_bytes(c, 1);
    std::vector<buffer> buckets;
    std::vector<std::vector<std::byte>> wires;
    for (int r = 0; r < ranks; ++r) {
      buckets.push_back(dev->alloc_device((first + count) * 4));
      const buffer wire = dev->alloc_device((first + count) * wb);
      f32_fill f = fill;
      f.seed += static_cast<std::uint64_t>(r);
      const mem_view b = buckets.back().view(first * 4, count * 4);
      fill_f32_async(b, count, f, s);
      encode_async(c, b, wire.view(first * wb, count * wb), count, ranks, s);
      wires.push_back(download(wire.view(first * wb, count * wb), count * wb));
    }
    std::vector<std::byte> sum(count * wb);
    for (std::size_t i = 0; i < count; ++i) {
      double acc = from_wire(wires[forward ? 0 : ranks - 1].data(), i, c);
      for (int k = 1; k < ranks; ++k) {
        const int r = forward ? k : ranks - 1 - k;
        acc = round_to_wire(acc + from_wire(wires[r].data(), i, c), c);
      }
      to_wire(sum.data(), i, acc, c);
    }
    const buffer wire = dev->alloc_device((first + count) * wb);
    upload(wire.view(first * wb, count * wb), sum);
    const mem_view out = buckets[0].view(first * 4, count * 4);
    decode_async(c, wire.view(first * wb, count * wb), out, count, s);
    const std::vector<float> got = download_floats(out, count);
    double worst_ratio = 0;
    double worst_err = 0;
    for (std::size_t i = 0; i < count; ++i) {
      double exact = 0;
      double m = 0;
      for (int r = 0; r < ranks; ++r) {
        f32_fill f = fill;
        f.seed += static_cast<std::uint64_t>(r);
        const double x = f.value(i);
        exact += x;
        m = std::max(m, std::fabs(x));
      }
      exact /= ranks;
      const double err = std::fabs(static_cast<double>(got[i]) - exact);
      const double bound = error_bound(c, ranks, m);
      worst_err = std::max(worst_err, err);
      worst_ratio = std::max(worst_ratio, err / bound);
      if (err > bound) {
        ADD_FAILURE() << to_string(c) << ", " << ranks << " ranks, element " << i << ": got " << got[i]
                      << ", exact " << exact << ", error " << err << " > bound " << bound;
        break;
      }
    }
    return {worst_ratio, worst_err};
  }
};

TEST_P(codec_device, the_mean_of_decoded_buckets_is_within_each_codecs_bound) {
  const std::size_t count = 10'007;  // not a multiple of 4: the kernels' tail
  for (const codec_kind c : {codec_kind::none, codec_kind::fp16, codec_kind::bf16}) {
    for (const int ranks : {2, 3, 4}) {
      SCOPED_TRACE(::testing::Message() << to_string(c) << ", " << ranks << " ranks");
      // Values of mixed sign and magnitude: noise in [-2.3, 2.3] around 0.3, near zero included.
      const f32_fill fill{0.3F, 2.0F, 100, 1};
      const auto [ratio, err] = reduce_and_check(c, ranks, fill, count, 0, true);
      const auto [ratio_rev, err_rev] = reduce_and_check(c, ranks, fill, count, 0, false);
      EXPECT_LE(std::max(ratio, ratio_rev), 1.0);
      if (lossy(c)) {
        // The codec really quantizes: the error is a sizeable share of the bound (not a vacuous bound).
        EXPECT_GT(std::max(ratio, ratio_rev), 0.1) << "largest error " << err;
      }
    }
  }
}

TEST_P(codec_device, unaligned_views_take_the_scalar_path_with_the_same_result) {
  for (const codec_kind c : {codec_kind::none, codec_kind::fp16, codec_kind::bf16}) {
    const f32_fill fill{-0.5F, 1.0F, 7, 1};
    const auto [ratio, err] = reduce_and_check(c, 3, fill, 1001, 1, true);
    EXPECT_LE(ratio, 1.0) << to_string(c);
    static_cast<void>(err);
  }
}

TEST_P(codec_device, fp16_saturates_finite_values_and_keeps_infinity_and_nan) {
  const int ranks = 2;
  const float limit = saturation_limit(codec_kind::fp16, ranks);
  EXPECT_GT(limit, 65000.0F);
  EXPECT_LT(limit, 65504.0F);
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> x{
      1.0F, 1e5F, -1e5F, 65504.0F, 3e38F, inf, -inf, std::numeric_limits<float>::quiet_NaN(), -2.0F};
  const buffer bucket = dev->alloc_device(x.size() * 4);
  const buffer wire = dev->alloc_device(x.size() * 2);
  upload_floats(bucket.view(), x);
  encode_async(codec_kind::fp16, bucket.view(), wire.view(), x.size(), ranks, s);
  const auto w = download(wire.view(), x.size() * 2);
  auto y = [&](std::size_t i) { return from_wire(w.data(), i, codec_kind::fp16); };
  EXPECT_EQ(y(0), 0.5);
  EXPECT_EQ(y(8), -1.0);
  for (const std::size_t i : {1, 2, 3, 4}) {
    EXPECT_TRUE(std::isfinite(y(i))) << x[i];
    EXPECT_LE(std::fabs(y(i)), limit / ranks * (1 + 0x1p-11)) << x[i];
    EXPECT_GE(std::fabs(y(i)), limit / ranks * (1 - 0x1p-11)) << x[i];
    EXPECT_EQ(std::signbit(y(i)), std::signbit(x[i]));
  }
  EXPECT_EQ(y(5), inf);
  EXPECT_EQ(y(6), -inf);
  EXPECT_TRUE(std::isnan(y(7)));
  // Two saturated ranks sum, partial sums rounded, to a finite value: no overflow on the wire.
  const double sum = round_to_wire(y(1) + y(1), codec_kind::fp16);
  EXPECT_TRUE(std::isfinite(sum));
  EXPECT_LE(sum, 65504.0);
  // Decoding the encoded values gives them back.
  const buffer back = dev->alloc_device(x.size() * 4);
  decode_async(codec_kind::fp16, wire.view(), back.view(), x.size(), s);
  const auto d = download_floats(back.view(), x.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    if (std::isnan(y(i))) {
      EXPECT_TRUE(std::isnan(d[i]));
    } else {
      EXPECT_EQ(d[i], y(i)) << i;
    }
  }
}

TEST_P(codec_device, saturation_keeps_every_partial_sum_finite_for_any_world_size) {
  for (const codec_kind c : {codec_kind::fp16, codec_kind::bf16}) {
    for (const int ranks : {2, 3, 8, 64, 128}) {
      const float big = c == codec_kind::fp16 ? 1e9F : std::numeric_limits<float>::max();
      const buffer bucket = dev->alloc_device(4);
      const buffer wire = dev->alloc_device(2);
      upload_floats(bucket.view(), {big});
      encode_async(c, bucket.view(), wire.view(), 1, ranks, s);
      const double y = from_wire(download(wire.view(), 2).data(), 0, c);
      double acc = y;
      for (int r = 1; r < ranks; ++r) acc = round_to_wire(acc + y, c);
      EXPECT_TRUE(std::isfinite(acc)) << to_string(c) << ", " << ranks << " ranks";
      EXPECT_GT(acc, 0.9 * saturation_limit(c, ranks)) << to_string(c) << ", " << ranks << " ranks";
    }
  }
}

TEST_P(codec_device, cuda_kernels_match_the_host_implementation_bit_for_bit) {
  if (GetParam() != backend::cuda) GTEST_SKIP() << "compares the cuda kernels with the host loops";
  const std::size_t count = 65'537;
  const auto host_dev = make_host_device(ferry::testing::jittery_host_options(3, 0.0));
  const stream hs = host_dev->make_stream();
  const float inf = std::numeric_limits<float>::infinity();
  for (const codec_kind c : {codec_kind::none, codec_kind::fp16, codec_kind::bf16}) {
    for (const int ranks : {1, 2, 3}) {
      const std::size_t wb = wire_bytes(c, count);
      // The same input on both: the fill formula, with extreme values planted.
      const buffer in = dev->alloc_device(count * 4);
      fill_f32_async(in.view(), count, f32_fill{0.0F, 70'000.0F, 3, 1}, s);
      std::vector<float> planted = download_floats(in.view(), count);
      planted[5] = inf;
      planted[6] = -inf;
      planted[7] = 1e-30F;
      planted[8] = -3e38F;
      upload_floats(in.view(), planted);
      const buffer wire = dev->alloc_device(wb);
      encode_async(c, in.view(), wire.view(), count, ranks, s);
      const auto cuda_wire = download(wire.view(), wb);

      const buffer hin = host_dev->alloc_device(count * 4);
      const buffer hwire = host_dev->alloc_device(wb);
      const buffer hstage = host_dev->alloc_pinned(std::max(wb, count * 4));
      std::memcpy(hstage.host_bytes(), planted.data(), count * 4);
      host_dev->copy(hin.view(), hstage.view(0, count * 4), hs);
      encode_async(c, hin.view(), hwire.view(), count, ranks, hs);
      host_dev->copy(hstage.view(0, wb), hwire.view(), hs);
      EXPECT_EQ(std::memcmp(cuda_wire.data(), hstage.host_bytes(), wb), 0) << to_string(c) << ", " << ranks;

      const buffer out = dev->alloc_device(count * 4);
      decode_async(c, wire.view(), out.view(), count, s);
      const auto decoded = download_floats(out.view(), count);
      for (std::size_t i = 0; i < count; ++i) {
        ASSERT_EQ(decoded[i], from_wire(cuda_wire.data(), i, c)) << to_string(c) << " element " << i;
      }
    }
  }
}

TEST_P(codec_device, fill_and_compare_agree_with_the_host_formula) {
  const std::size_t count = 4099;
  const buffer a = dev->alloc_device(count * 4);
  const buffer b = dev->alloc_device(count * 4);
  const f32_fill f{1.5F, 0.25F, 77, 1};
  fill_f32_async(a.view(), count, f, s);
  const auto values = download_floats(a.view(), count);
  for (std::size_t i = 0; i < count; ++i) ASSERT_EQ(values[i], f.value(i)) << i;
  // The mean formula over 3 ranks: what an exact average of three fills gives.
  const f32_fill mean{1.5F, 0.25F, 77, 3};
  fill_f32_async(b.view(), count, mean, s);
  const auto means = download_floats(b.view(), count);
  for (std::size_t i = 0; i < count; ++i) {
    const double m = (static_cast<double>(f32_fill{1.5F, 0.25F, 77, 1}.value(i)) +
                      f32_fill{1.5F, 0.25F, 78, 1}.value(i) + f32_fill{1.5F, 0.25F, 79, 1}.value(i)) /
                     3;
    ASSERT_EQ(means[i], static_cast<float>(m)) << i;
  }

  EXPECT_EQ(compare_f32(a.view(), f, count, 0.0F, s).wrong, 0U);
  EXPECT_EQ(compare_f32(a.view(), f, count, 0.0F, s).max_abs_diff, 0.0F);
  // Three planted differences: 0.5, 2, and a NaN; the tolerance decides which are wrong.
  std::vector<float> changed = values;
  changed[0] += 0.5F;
  changed[100] -= 2.0F;
  changed[count - 1] = std::numeric_limits<float>::quiet_NaN();
  upload_floats(b.view(), changed);
  const f32_diff d = compare_f32(b.view(), a.view(), count, 1.0F, s);
  EXPECT_EQ(d.wrong, 2U);  // 2.0 and the NaN
  EXPECT_EQ(d.max_abs_diff, std::numeric_limits<float>::infinity());
  changed[count - 1] = values[count - 1];
  upload_floats(b.view(), changed);
  const f32_diff d2 = compare_f32(b.view(), f, count, 0.1F, s);
  EXPECT_EQ(d2.wrong, 2U);
  EXPECT_FLOAT_EQ(d2.max_abs_diff, 2.0F);
  // The asynchronous form into a caller's result buffer.
  const buffer result = dev->alloc_device(f32_diff_bytes);
  compare_f32_async(b.view(), a.view(), count, 0.0F, result.view(), s);
  const auto bytes = download(result.view(), f32_diff_bytes);
  EXPECT_EQ(read_f32_diff(bytes.data()).wrong, 2U);
}

TEST_P(codec_device, refuses_views_that_are_too_small_pageable_or_misaligned) {
  const buffer bucket = dev->alloc_device(400);
  const buffer wire = dev->alloc_device(200);
  EXPECT_MESSAGE_HAS(
      message_of<logic_error>([&] { encode_async(codec_kind::fp16, bucket.view(), wire.view(), 101, 2, s); }),
      "fewer than count = 101");
  EXPECT_MESSAGE_HAS(
      message_of<logic_error>([&] { encode_async(codec_kind::none, bucket.view(), wire.view(), 100, 2, s); }),
      "the wire view of 200 B holds 50 elements");
  EXPECT_MESSAGE_HAS(
      message_of<logic_error>([&] { encode_async(codec_kind::fp16, bucket.view(), wire.view(), 100, 0, s); }),
      "world size of 0");
  EXPECT_MESSAGE_HAS(message_of<logic_error>(
                         [&] { decode_async(codec_kind::fp16, wire.view(1, 100), bucket.view(), 10, s); }),
                     "not aligned");
  std::vector<float> pageable(100);
  EXPECT_MESSAGE_HAS(
      message_of<logic_error>(
          [&] { decode_async(codec_kind::bf16, wire.view(), pageable_view(pageable.data(), 400), 100, s); }),
      "pageable");
  EXPECT_MESSAGE_HAS(message_of<logic_error>([&] { fill_f32_async(bucket.view(), 101, f32_fill{}, s); }),
                     "smaller than");
  EXPECT_MESSAGE_HAS(message_of<logic_error>([&] {
                       fill_f32_async(bucket.view(), 10, f32_fill{0, 1, 0, 0}, s);
                     }),
                     "ranks = 0");
}

INSTANTIATE_TEST_SUITE_P(backends, codec_device, ::testing::ValuesIn(ferry::testing::backends_under_test()),
                         ferry::testing::backend_test_name);

TEST(codec, names_parse_and_the_bound_grows_with_ranks_and_roundoff) {
  EXPECT_EQ(parse_codec("bf16"), codec_kind::bf16);
  EXPECT_EQ(parse_codec("fp32"), codec_kind::none);
  EXPECT_EQ(parse_codec("half"), codec_kind::fp16);
  EXPECT_MESSAGE_HAS(message_of<logic_error>([] { (void)parse_codec("int8"); }), "codec \"int8\"");
  EXPECT_EQ(wire_type(codec_kind::fp16), dtype::f16);
  EXPECT_EQ(wire_bytes(codec_kind::bf16, 10), 20U);
  EXPECT_EQ(wire_bytes(codec_kind::none, 10), 40U);
  EXPECT_LT(error_bound(codec_kind::none, 2, 1.0), error_bound(codec_kind::fp16, 2, 1.0));
  EXPECT_LT(error_bound(codec_kind::fp16, 2, 1.0), error_bound(codec_kind::bf16, 2, 1.0));
  EXPECT_LT(error_bound(codec_kind::bf16, 2, 1.0), error_bound(codec_kind::bf16, 4, 1.0));
  // About n u M: bf16 with 4 ranks, M = 1: 4 * 2^-8 and a little.
  EXPECT_GT(error_bound(codec_kind::bf16, 4, 1.0), 4 * 0x1p-8);
  EXPECT_LT(error_bound(codec_kind::bf16, 4, 1.0), 4.2 * 0x1p-8);
  EXPECT_EQ(error_bound(codec_kind::bf16, 200, 1.0), std::numeric_limits<double>::infinity());
  EXPECT_MESSAGE_HAS(message_of<logic_error>([] { (void)error_bound(codec_kind::none, 0, 1.0); }),
                     "world size of 0");
  EXPECT_MESSAGE_HAS(message_of<logic_error>([] { (void)error_bound(codec_kind::none, 2, -1.0); }),
                     "max_abs = -1");
}

}  // namespace
}  // namespace ferry::comm
