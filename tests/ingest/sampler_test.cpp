// The sampler: sequential and shuffled orders, drop_last, determinism, and bad options.
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "ferry/core/error.hpp"
#include "ferry/ingest/ingest.hpp"
#include "support/test_support.hpp"

namespace ferry::ingest {
namespace {

using ferry::testing::message_of;

std::vector<std::uint64_t> epoch_order(const sampler& s, std::uint64_t epoch) {
  std::vector<std::uint64_t> out;
  for (std::size_t b = 0; b < s.batches_per_epoch(); ++b) {
    for (std::size_t p = 0; p < s.batch_samples(b); ++p) out.push_back(s.index(epoch, b, p));
  }
  return out;
}

TEST(ingest_sampler, sequential_order_and_short_final_batch) {
  const sampler keep({.dataset_size = 10, .batch_size = 4, .drop_last = false});
  EXPECT_EQ(keep.batches_per_epoch(), 3U);
  EXPECT_EQ(keep.batch_samples(0), 4U);
  EXPECT_EQ(keep.batch_samples(2), 2U);
  std::vector<std::uint64_t> expected(10);
  for (std::uint64_t i = 0; i < 10; ++i) expected[i] = i;
  EXPECT_EQ(epoch_order(keep, 0), expected);
  EXPECT_EQ(epoch_order(keep, 5), expected);

  const sampler drop({.dataset_size = 10, .batch_size = 4, .drop_last = true});
  EXPECT_EQ(drop.batches_per_epoch(), 2U);
  EXPECT_EQ(drop.batch_samples(1), 4U);
  EXPECT_THROW((void)drop.batch_samples(2), logic_error);
  EXPECT_THROW((void)drop.index(0, 0, 4), logic_error);
}

TEST(ingest_sampler, shuffled_epochs_are_seeded_permutations) {
  for (const std::uint64_t n : {1ULL, 2ULL, 7ULL, 64ULL, 1000ULL, 4097ULL}) {
    const sampler s({.dataset_size = n, .batch_size = 3, .shuffle = true, .seed = 42, .drop_last = false});
    const sampler again(
        {.dataset_size = n, .batch_size = 3, .shuffle = true, .seed = 42, .drop_last = false});
    const sampler other(
        {.dataset_size = n, .batch_size = 3, .shuffle = true, .seed = 43, .drop_last = false});
    std::vector<std::uint64_t> identity(n);
    for (std::uint64_t i = 0; i < n; ++i) identity[i] = i;
    for (std::uint64_t epoch = 0; epoch < 3; ++epoch) {
      auto order = epoch_order(s, epoch);
      EXPECT_EQ(order, epoch_order(again, epoch)) << "not deterministic, n " << n;
      if (n >= 64) {
        EXPECT_NE(order, identity) << "not shuffled, n " << n;
        EXPECT_NE(order, epoch_order(s, epoch + 1)) << "same order in two epochs, n " << n;
        EXPECT_NE(order, epoch_order(other, epoch)) << "the seed does not matter, n " << n;
      }
      std::sort(order.begin(), order.end());
      EXPECT_EQ(order, identity) << "not a permutation, n " << n << " epoch " << epoch;
    }
  }
}

TEST(ingest_sampler, drop_last_shuffle_takes_distinct_samples) {
  const sampler s({.dataset_size = 100, .batch_size = 8, .shuffle = true, .seed = 1, .drop_last = true});
  EXPECT_EQ(s.batches_per_epoch(), 12U);
  auto order = epoch_order(s, 0);
  EXPECT_EQ(order.size(), 96U);
  std::sort(order.begin(), order.end());
  EXPECT_EQ(std::adjacent_find(order.begin(), order.end()), order.end());
  EXPECT_LT(order.back(), 100U);
}

TEST(ingest_sampler, bad_options_name_the_value) {
  EXPECT_MESSAGE_HAS(message_of<logic_error>([] { sampler s({.dataset_size = 0, .batch_size = 4}); }),
                     "dataset_size is 0");
  EXPECT_MESSAGE_HAS(message_of<logic_error>([] { sampler s({.dataset_size = 5, .batch_size = 0}); }),
                     "batch_size is 0");
  EXPECT_MESSAGE_HAS(
      message_of<logic_error>([] { sampler s({.dataset_size = 5, .batch_size = 8, .drop_last = true}); }),
      "dataset_size 5 is smaller than batch_size 8");
}

}  // namespace
}  // namespace ferry::ingest
