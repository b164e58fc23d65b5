// The bucket plan: properties over random parameter sets (every parameter exactly once, the ready order
// kept, caps kept except by a lone oversized parameter, aligned offsets, no overlap), the exact cut of
// small cases, and every refusal naming its value.
#include "ferry/comm/bucket_plan.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>

#include "support/test_support.hpp"

namespace ferry::comm {
namespace {

using ferry::testing::message_of;

// Checks every property of the header's contract; returns nothing, reports through gtest.
void expect_properties(const bucket_plan& plan, const std::vector<std::size_t>& sizes,
                       const std::vector<std::size_t>& order, const bucket_plan_options& o) {
  const std::size_t align = o.alignment_bytes / 4;
  // The buckets' parameters, concatenated, are the ready order: each parameter once, order kept.
  EXPECT_EQ(plan.order(), order);
  ASSERT_EQ(plan.places.size(), sizes.size());
  std::size_t end = 0;
  for (std::size_t b = 0; b < plan.buckets.size(); ++b) {
    const bucket& k = plan.buckets[b];
    ASSERT_FALSE(k.params.empty()) << "bucket " << b;
    const std::size_t cap = b == 0 ? o.first_bucket_bytes : o.bucket_cap_bytes;
    if (k.params.size() > 1) {
      EXPECT_LE(k.bytes(), cap) << "bucket " << b << " of " << k.params.size() << " params";
    } else {
      // A lone parameter: it may exceed the cap only because it alone does.
      EXPECT_EQ(k.elements, sizes[k.params[0]]);
    }
    EXPECT_EQ(k.offset % align, 0U);
    EXPECT_GE(k.offset, end);
    for (std::size_t j = 0; j < k.params.size(); ++j) {
      const std::size_t p = k.params[j];
      const param_place& at = plan.places[p];
      EXPECT_EQ(at.bucket, b);
      EXPECT_EQ(at.elements, sizes[p]);
      EXPECT_EQ(at.offset % align, 0U) << "param " << p;
      EXPECT_GE(at.offset, end) << "param " << p << " overlaps the one before it";
      // No gap larger than the alignment padding: the buffer is dense.
      EXPECT_LT(at.offset - end, align) << "param " << p;
      end = at.offset + at.elements;
    }
    EXPECT_EQ(k.offset + k.elements, end);
  }
  EXPECT_GE(plan.total_elements, end);
  EXPECT_EQ(plan.total_elements % align, 0U);
  EXPECT_NO_THROW(validate(plan, sizes, o.alignment_bytes));
  // Greedy: a bucket closed only when the next parameter would not fit in it.
  for (std::size_t b = 0; b + 1 < plan.buckets.size(); ++b) {
    const bucket& k = plan.buckets[b];
    const std::size_t cap = (b == 0 ? o.first_bucket_bytes : o.bucket_cap_bytes) / 4;
    const std::size_t next = plan.buckets[b + 1].params.front();
    const std::size_t padded = (k.offset + k.elements + align - 1) / align * align;
    EXPECT_GT(padded + sizes[next] - k.offset, cap)
        << "bucket " << b << " closed although param " << next << " fits";
  }
}

TEST(bucket_plan, random_parameter_sets_keep_every_property) {
  std::mt19937_64 rng(12);
  for (int trial = 0; trial < 300; ++trial) {
    const std::size_t n = 1 + rng() % 60;
    std::vector<std::size_t> sizes(n);
    for (auto& s : sizes) {
      // Mostly small (biases, norms), some large, a few beyond the cap.
      const auto kind = rng() % 10;
      s = kind < 5 ? 1 + rng() % 2000 : kind < 9 ? 1 + rng() % 300'000 : 1 + rng() % 3'000'000;
    }
    std::vector<std::size_t> order(n);
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    bucket_plan_options o;
    o.first_bucket_bytes = 4 + (rng() % 400'000) * 4;
    o.bucket_cap_bytes = 4 + (rng() % 4'000'000) * 4;
    o.alignment_bytes = std::size_t{4} << (rng() % 8);  // 4 .. 512
    SCOPED_TRACE(::testing::Message()
                 << "trial " << trial << ", " << n << " params, first cap " << o.first_bucket_bytes
                 << ", cap " << o.bucket_cap_bytes << ", align " << o.alignment_bytes);
    const bucket_plan plan = make_bucket_plan(sizes, order, o);
    expect_properties(plan, sizes, order, o);
    // The same inputs give the same plan (every rank computes it).
    EXPECT_EQ(make_bucket_plan(sizes, order, o), plan);
  }
}

TEST(bucket_plan, small_first_bucket_then_buckets_up_to_the_cap) {
  // 64 elements = 256 bytes: one alignment unit each.
  const std::vector<std::size_t> sizes{64, 64, 64, 64, 64, 64, 64};
  const std::vector<std::size_t> order{6, 5, 4, 3, 2, 1, 0};
  const bucket_plan plan =
      make_bucket_plan(sizes, order, {.first_bucket_bytes = 256, .bucket_cap_bytes = 768});
  ASSERT_EQ(plan.buckets.size(), 3U);
  EXPECT_EQ(plan.buckets[0].params, (std::vector<std::size_t>{6}));
  EXPECT_EQ(plan.buckets[1].params, (std::vector<std::size_t>{5, 4, 3}));
  EXPECT_EQ(plan.buckets[2].params, (std::vector<std::size_t>{2, 1, 0}));
  EXPECT_EQ(plan.places[6].offset, 0U);
  EXPECT_EQ(plan.places[5].offset, 64U);
  EXPECT_EQ(plan.places[0].offset, 6 * 64U);
  EXPECT_EQ(plan.total_elements, 7 * 64U);
}

TEST(bucket_plan, padding_counts_toward_the_cap_and_offsets_are_aligned) {
  // 10 floats each: every parameter starts on a 256-byte (64-element) boundary.
  const std::vector<std::size_t> sizes{10, 10, 10};
  const std::vector<std::size_t> order{0, 1, 2};
  // A cap of 74 elements holds 10 + padding + 10 (64 + 10 = 74) but not a third.
  const bucket_plan plan =
      make_bucket_plan(sizes, order, {.first_bucket_bytes = 74 * 4, .bucket_cap_bytes = 74 * 4});
  ASSERT_EQ(plan.buckets.size(), 2U);
  EXPECT_EQ(plan.buckets[0].params, (std::vector<std::size_t>{0, 1}));
  EXPECT_EQ(plan.buckets[0].elements, 74U);
  EXPECT_EQ(plan.places[1].offset, 64U);
  EXPECT_EQ(plan.places[2].offset, 128U);
  EXPECT_EQ(plan.buckets[1].offset, 128U);
}

TEST(bucket_plan, a_parameter_above_the_cap_gets_a_bucket_of_its_own) {
  const std::vector<std::size_t> sizes{64, 10'000, 64, 64};
  const std::vector<std::size_t> order{0, 1, 2, 3};
  const bucket_plan plan =
      make_bucket_plan(sizes, order, {.first_bucket_bytes = 1024, .bucket_cap_bytes = 1024});
  ASSERT_EQ(plan.buckets.size(), 3U);
  EXPECT_EQ(plan.buckets[0].params, (std::vector<std::size_t>{0}));
  EXPECT_EQ(plan.buckets[1].params, (std::vector<std::size_t>{1}));
  EXPECT_EQ(plan.buckets[1].bytes(), 40'000U);
  EXPECT_EQ(plan.buckets[2].params, (std::vector<std::size_t>{2, 3}));
}

TEST(bucket_plan, the_default_first_bucket_is_one_mebibyte_and_the_cap_25) {
  // 64 KiB parameters: 16 fit the first bucket, 400 each later one.
  const std::vector<std::size_t> sizes(1000, 16 * 1024);
  const bucket_plan plan = make_reverse_plan(sizes);
  ASSERT_GE(plan.buckets.size(), 3U);
  EXPECT_EQ(plan.buckets[0].params.size(), 16U);
  EXPECT_EQ(plan.buckets[1].params.size(), 400U);
  EXPECT_EQ(plan.buckets[0].params.front(), 999U);  // reverse registration order
}

TEST(bucket_plan, refuses_bad_options_sizes_and_orders_naming_the_value) {
  const std::vector<std::size_t> sizes{4, 4, 4};
  const std::vector<std::size_t> order{2, 1, 0};
  EXPECT_MESSAGE_HAS(
      message_of<logic_error>([&] { (void)make_bucket_plan(sizes, order, {.first_bucket_bytes = 0}); }),
      "first_bucket_bytes = 0");
  EXPECT_MESSAGE_HAS(
      message_of<logic_error>([&] { (void)make_bucket_plan(sizes, order, {.bucket_cap_bytes = 0}); }),
      "bucket_cap_bytes = 0");
  EXPECT_MESSAGE_HAS(
      message_of<logic_error>([&] { (void)make_bucket_plan(sizes, order, {.alignment_bytes = 96}); }),
      "alignment_bytes = 96");
  EXPECT_MESSAGE_HAS(
      message_of<logic_error>([&] { (void)make_bucket_plan(sizes, order, {.alignment_bytes = 2}); }),
      "alignment_bytes = 2");
  EXPECT_MESSAGE_HAS(message_of<logic_error>([&] {
                       (void)make_bucket_plan(std::vector<std::size_t>{4, 0, 4}, order);
                     }),
                     "parameter 1 has 0 elements");
  EXPECT_MESSAGE_HAS(message_of<logic_error>([&] {
                       (void)make_bucket_plan(std::vector<std::size_t>{}, std::vector<std::size_t>{});
                     }),
                     "no parameters");
  EXPECT_MESSAGE_HAS(message_of<logic_error>([&] {
                       (void)make_bucket_plan(sizes, std::vector<std::size_t>{2, 1});
                     }),
                     "ready order of 2 indices for 3 parameters");
  EXPECT_MESSAGE_HAS(message_of<logic_error>([&] {
                       (void)make_bucket_plan(sizes, std::vector<std::size_t>{2, 7, 0});
                     }),
                     "ready order[1] = 7 is not a parameter index");
  EXPECT_MESSAGE_HAS(message_of<logic_error>([&] {
                       (void)make_bucket_plan(sizes, std::vector<std::size_t>{2, 0, 2});
                     }),
                     "ready order[2] = 2 repeats a parameter");
}

TEST(bucket_plan, validate_finds_what_a_foreign_plan_gets_wrong) {
  const std::vector<std::size_t> sizes{100, 200, 300};
  const bucket_plan good =
      make_bucket_plan(sizes, std::vector<std::size_t>{0, 1, 2}, {.bucket_cap_bytes = 1200});
  ASSERT_NO_THROW(validate(good, sizes));

  bucket_plan missing = good;
  missing.buckets.back().params.pop_back();
  missing.buckets.back().elements = missing.places[1].offset + 200 - missing.buckets.back().offset;
  EXPECT_MESSAGE_HAS(message_of<logic_error>([&] { validate(missing, sizes); }), "parameter 2");

  bucket_plan twice = good;
  twice.buckets.back().params.push_back(0);
  EXPECT_MESSAGE_HAS(message_of<logic_error>([&] { validate(twice, sizes); }), "parameter 0");

  bucket_plan misaligned = make_bucket_plan(sizes, std::vector<std::size_t>{0, 1, 2}, {.alignment_bytes = 4});
  EXPECT_MESSAGE_HAS(message_of<logic_error>([&] { validate(misaligned, sizes, 256); }),
                     "not aligned to 256 bytes");

  bucket_plan resized = good;
  resized.places[1].elements = 201;
  EXPECT_MESSAGE_HAS(message_of<logic_error>([&] { validate(resized, sizes); }),
                     "parameter 1 has 200 elements");

  EXPECT_MESSAGE_HAS(message_of<logic_error>([&] {
                       validate(good, std::vector<std::size_t>{100, 200});
                     }),
                     "places 3 parameters, but the reducer has 2");
}

}  // namespace
}  // namespace ferry::comm
