// codec_cache: a stateless codec is made once per codec and bucket size and then serves every call for
// that pair (the same object, no more made), each call still the mean over the ranks within the codec's
// bound; a codec that keeps state is refused, naming the stateless ones; a full cache starts over.
#include "ferry/comm/codec_cache.hpp"

#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <vector>

#include "ferry/comm/f32_ops.hpp"
#include "ferry/comm/powersgd_codec.hpp"
#include "host_ranks.hpp"
#include "reducer_steps.hpp"
#include "support/test_support.hpp"

namespace ferry::comm {
namespace {

using ferry::testing::message_of;
using testing::host_ranks;
using testing::unmodelled;

TEST(codec_cache, a_codec_is_made_once_per_codec_and_size_and_every_call_reduces_to_the_mean) {
  const int n = 2;
  host_ranks ranks(n, unmodelled(std::chrono::seconds(20)), 5);
  // DDP's comm hook: the same few bucket sizes, in the same order, every step.
  const std::array<std::size_t, 3> buckets{1000, 37, 1000};
  const std::array<codec_kind, 2> codecs{codec_kind::none, codec_kind::bf16};
  testing::on_every_rank(n, [&](int rank) {
    device& dev = ranks.dev(rank);
    const stream s = dev.make_stream();
    codec_cache cache(ranks[rank]);
    const buffer scratch = dev.alloc_device(1000 * sizeof(float));
    std::vector<buffer> data;
    for (const std::size_t elements : buckets) data.push_back(dev.alloc_device(elements * sizeof(float)));
    std::vector<const bucket_codec*> first;
    for (std::uint64_t step = 1; step <= 3; ++step) {
      for (const codec_kind c : codecs) {
        for (std::size_t b = 0; b < buckets.size(); ++b) {
          bucket_codec& codec = cache.get(c, buckets[b]);
          EXPECT_EQ(codec.kind(), c);
          if (step == 1) first.push_back(&codec);
          EXPECT_EQ(&codec, first[(c == codecs[0] ? 0 : buckets.size()) + b])
              << "step " << step << ", " << to_string(c) << ", bucket " << b;
          fill_f32_async(data[b].view(), buckets[b], testing::fill_of(step, b, rank), s);
          reduce_marks marks;
          codec.reduce_async(data[b].view(), scratch.view(0, codec.scratch_bytes()), s, marks);
          EXPECT_TRUE(marks.started() && marks.ended());
          const std::vector<float> got = testing::read_floats(dev, data[b].view(), s);
          for (std::size_t i = 0; i < got.size(); ++i) {
            double exact = 0;
            double m = 0;
            for (int k = 0; k < n; ++k) {
              const double x = testing::fill_of(step, b, k).value(i);
              exact += x / n;
              m = std::max(m, std::fabs(x));
            }
            ASSERT_NEAR(got[i], exact, error_bound(c, n, m))
                << to_string(c) << " bucket " << b << " element " << i;
          }
        }
      }
    }
    EXPECT_EQ(first[0], first[2]) << "buckets of one size share their codec";
    // Two sizes of two codecs: four codecs, made in step 1 only.
    EXPECT_EQ(cache.made(), 4U);
    EXPECT_EQ(cache.size(), 4U);
  });
}

TEST(codec_cache, a_codec_that_keeps_state_is_refused_naming_the_stateless_ones) {
  host_ranks ranks(1, unmodelled(std::chrono::seconds(5)), 2);
  codec_cache cache(ranks[0]);
  EXPECT_FALSE(stateless(powersgd_kind));
  const std::string why = message_of<logic_error>([&] { static_cast<void>(cache.get(powersgd_kind, 64)); });
  EXPECT_MESSAGE_HAS(why, "codec powersgd keeps state between steps");
  EXPECT_MESSAGE_HAS(why, "the stateless codecs: none, fp16, bf16");
  EXPECT_MESSAGE_HAS(
      message_of<logic_error>([&] { static_cast<void>(cache.get(static_cast<codec_kind>(251), 8)); }),
      "codec 251 is not registered");
  EXPECT_EQ(cache.size(), 0U);
  EXPECT_EQ(cache.made(), 0U);
  EXPECT_MESSAGE_HAS(message_of<logic_error>([&] { codec_cache none(ranks[0], 0); }), "capacity 0");
}

TEST(codec_cache, a_full_cache_starts_over_and_keeps_at_most_its_capacity) {
  host_ranks ranks(1, unmodelled(std::chrono::seconds(5)), 3);
  codec_cache cache(ranks[0], 2);
  static_cast<void>(cache.get(codec_kind::none, 1));
  static_cast<void>(cache.get(codec_kind::fp16, 1));
  EXPECT_EQ(cache.size(), 2U);
  static_cast<void>(cache.get(codec_kind::none, 3));
  EXPECT_EQ(cache.size(), 1U);
  EXPECT_EQ(cache.made(), 3U);
  static_cast<void>(cache.get(codec_kind::none, 3));
  EXPECT_EQ(cache.made(), 3U) << "the pair kept after the start-over is found";
  static_cast<void>(cache.get(codec_kind::none, 1));
  EXPECT_EQ(cache.made(), 4U) << "the pair dropped at the start-over is made again";
}

}  // namespace
}  // namespace ferry::comm
