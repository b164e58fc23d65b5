// The feed: batches pushed as host byte ranges reach the device intact and in order, a chunked copy by
// several workers included; a piece past the batch is refused before anything is queued; close wakes a
// consumer waiting for a batch that was never pushed.
#include <gtest/gtest.h>

#include <cstdint>
#include <thread>
#include <vector>

#include "ferry/core/error.hpp"
#include "ferry/core/pattern.hpp"
#include "ferry/ingest/feed.hpp"
#include "ingest_test_support.hpp"

namespace ferry::ingest {
namespace {

using namespace testing;

class ingest_feed : public on_backend {};

TEST_P(ingest_feed, pushed_pieces_reach_the_device_at_their_offsets_in_push_order) {
  with_watchdog(60s, [&] {
    // Batches of three pieces each, at offsets that cross chunk boundaries; the last batch is shorter.
    feed in(dev(), {.batch_bytes = 110000, .chunk_bytes = 4096, .workers = 3, .slots = 2});
    prefetcher gpu(dev(), in.source(), {.depth = 2});
    const stream consumer = dev().make_stream();
    const int batches = 7;
    std::vector<std::vector<std::byte>> sources;
    std::vector<std::vector<feed_piece>> pieces;
    for (int k = 0; k < batches; ++k) {
      const std::size_t sizes[3] = {10000, 50001, k + 1 == batches ? std::size_t{12} : std::size_t{39999}};
      std::size_t offset = 0;
      pieces.emplace_back();
      for (std::size_t i = 0; i < 3; ++i) {
        sources.emplace_back(sizes[i]);
        fill_pattern(std::span<std::byte>(sources.back()), 1000 * static_cast<std::uint64_t>(k) + i);
        pieces.back().push_back({sources.back().data(), sizes[i], offset});
        offset += (sizes[i] + 255) / 256 * 256;
      }
    }
    buffer back = dev().alloc_pinned(in.slot_bytes());
    for (int k = 0; k < batches; ++k) {
      // Push one ahead, as a consumer with lookahead does.
      if (k == 0) {
        EXPECT_EQ(in.push(pieces[0]), 0u);
      }
      if (k + 1 < batches) {
        EXPECT_EQ(in.push(pieces[k + 1]), static_cast<std::uint64_t>(k + 1));
      }
      auto b = gpu.next(consumer);
      ASSERT_TRUE(b.has_value());
      EXPECT_EQ(b->epoch, static_cast<std::uint64_t>(k));
      dev().copy_async(back.view(0, b->field(0).bytes), b->field(0), consumer);
      gpu.release(*b, consumer);
      consumer.synchronize();
      for (std::size_t i = 0; i < 3; ++i) {
        const feed_piece& p = pieces[k][i];
        const auto bad =
            find_pattern_mismatch(std::span<const std::byte>(back.host_bytes() + p.offset, p.bytes),
                                  1000 * static_cast<std::uint64_t>(k) + i);
        EXPECT_FALSE(bad.has_value()) << "batch " << k << " piece " << i << " byte " << *bad;
      }
    }
    EXPECT_EQ(in.pushed(), static_cast<std::uint64_t>(batches));
    gpu.close();
  });
}

TEST_P(ingest_feed, a_piece_past_the_batch_is_refused_naming_it_and_nothing_is_queued) {
  feed in(dev(), {.batch_bytes = 1000, .workers = 1, .slots = 1});
  std::vector<std::byte> src(600);
  const feed_piece pieces[2] = {{src.data(), 500, 0}, {src.data(), 600, 500}};
  const std::string what = message_of<logic_error>([&] { (void)in.push(pieces); });
  EXPECT_NE(what.find("piece 1"), std::string::npos) << what;
  EXPECT_NE(what.find("batch_bytes"), std::string::npos) << what;
  EXPECT_EQ(in.pushed(), 0u);
}

TEST_P(ingest_feed, close_wakes_a_consumer_waiting_for_a_batch_never_pushed) {
  with_watchdog(60s, [&] {
    feed in(dev(), {.batch_bytes = 4096, .workers = 2, .slots = 2});
    prefetcher gpu(dev(), in.source(), {.depth = 1});
    const stream consumer = dev().make_stream();
    std::thread closer([&] {
      std::this_thread::sleep_for(50ms);
      in.close();
    });
    EXPECT_ANY_THROW((void)gpu.next(consumer));
    closer.join();
    const feed_piece none[1] = {};
    EXPECT_THROW((void)in.push(none), stopped_error);
  });
}

INSTANTIATE_TEST_SUITE_P(backends, ingest_feed, ::testing::ValuesIn(backends_under_test()),
                         backend_test_name);

}  // namespace
}  // namespace ferry::ingest
