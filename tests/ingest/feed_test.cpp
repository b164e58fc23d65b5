// The feed: batches pushed as host byte ranges reach the device intact and in order, a chunked copy by
// several workers included; a piece past the batch is refused before anything is queued; close wakes a
// consumer waiting for a batch that was never pushed. A slot feed: slots of caller memory registered as
// pinned and written in place reach the device in order, never more than `slots` batches ahead of the
// consumer; its eventfd tells when a slot came free; a close wakes a writer waiting for a slot; bad memory
// is refused naming what is wrong.
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <future>
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

// A shared anonymous mapping stands in for the memfd a Python Loader's worker processes write.
struct shared_mapping {
  explicit shared_mapping(std::size_t n)
      : bytes(n), data(::mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0)) {}
  ~shared_mapping() {
    if (data != MAP_FAILED) ::munmap(data, bytes);
  }
  shared_mapping(const shared_mapping&) = delete;
  shared_mapping& operator=(const shared_mapping&) = delete;
  std::size_t bytes;
  void* data;
};

TEST_P(ingest_feed, slots_written_in_place_reach_the_device_in_order_and_never_run_more_than_slots_ahead) {
  with_watchdog(60s, [&] {
    constexpr std::size_t slot_bytes = 64 << 10;
    constexpr std::size_t slots = 3;
    constexpr std::uint64_t batches = 9;
    shared_mapping memory(slot_bytes * slots);
    ASSERT_NE(memory.data, MAP_FAILED);
    {
      buffer pinned = dev().register_host(memory.data, memory.bytes);
      EXPECT_EQ(pinned.kind(), memory_kind::pinned);
      EXPECT_EQ(pinned.data(), memory.data);
      slot_feed in(dev(), {.pool = pinned.view(), .slot_bytes = slot_bytes, .slots = slots});
      prefetcher gpu(dev(), in.source(), {.depth = 2});
      // Nothing was consumed: batches 0..slots-1 are writable, batch `slots` (slot 0's next) is not.
      for (std::uint64_t k = 0; k < slots; ++k) EXPECT_TRUE(in.wait_writable(k, 10s)) << k;
      EXPECT_FALSE(in.wait_writable(slots, 20ms));
      EXPECT_THROW(in.ready(slots), logic_error);  // not writable yet
      std::thread writer([&] {
        for (std::uint64_t k = 0; k < batches; ++k) {
          if (!in.wait_writable(k, 30s)) return;
          const std::span<std::byte> slot = in.slot(k);
          EXPECT_EQ(static_cast<void*>(slot.data()),
                    static_cast<void*>(static_cast<std::byte*>(memory.data) + (k % slots) * slot_bytes));
          fill_pattern(slot, 500 + k);
          in.ready(k);
        }
      });
      const stream consumer = dev().make_stream();
      buffer back = dev().alloc_pinned(slot_bytes);
      for (std::uint64_t k = 0; k < batches; ++k) {
        auto b = gpu.next(consumer);
        ASSERT_TRUE(b.has_value());
        EXPECT_EQ(b->epoch, k);
        dev().copy_async(back.view(0, slot_bytes), b->field(0), consumer);
        gpu.release(*b, consumer);
        consumer.synchronize();
        const auto bad =
            find_pattern_mismatch(std::span<const std::byte>(back.host_bytes(), slot_bytes), 500 + k);
        EXPECT_FALSE(bad.has_value()) << "batch " << k << " byte " << *bad;
      }
      writer.join();
      EXPECT_THROW(in.ready(batches - 1), logic_error);  // marked ready already
      gpu.close();
      EXPECT_THROW((void)in.wait_writable(batches, 1s), stopped_error);  // the prefetcher closed the feed
    }
    EXPECT_EQ(dev().pinned().bytes, 0u);  // unregistered with the buffer
  });
}

TEST_P(ingest_feed, a_slot_feeds_eventfd_tells_of_free_slots_and_close_wakes_a_writer_waiting_for_one) {
  with_watchdog(60s, [&] {
    constexpr std::size_t slot_bytes = 4096;
    shared_mapping memory(2 * slot_bytes);
    ASSERT_NE(memory.data, MAP_FAILED);
    buffer pinned = dev().register_host(memory.data, memory.bytes);
    slot_feed in(dev(), {.pool = pinned.view(), .slot_bytes = slot_bytes, .slots = 2});
    const int fd = in.event_fd();
    ASSERT_GE(fd, 0);
    const auto readable = [fd](int ms) {
      pollfd p{.fd = fd, .events = POLLIN, .revents = 0};
      if (::poll(&p, 1, ms) != 1) return false;
      std::uint64_t n = 0;
      return ::read(fd, &n, sizeof n) == sizeof n;
    };
    EXPECT_TRUE(readable(0)) << "every slot is writable at the start";
    EXPECT_FALSE(readable(0));
    // A batch whose slot is writable may be marked ready without asking wait_writable first.
    fill_pattern(in.slot(0), 70);
    in.ready(0);
    EXPECT_TRUE(in.wait_writable(1, 0ms));
    in.ready(1);
    EXPECT_FALSE(in.wait_writable(2, 0ms));
    loader& source = in.source();
    auto b0 = source.next();
    ASSERT_TRUE(b0.has_value());
    EXPECT_EQ(b0->slot, 0u);
    EXPECT_FALSE(find_pattern_mismatch(b0->field(0), 70).has_value());
    source.release(*b0);
    EXPECT_TRUE(readable(10000)) << "a release frees a slot";
    EXPECT_TRUE(in.wait_writable(2, 0ms));
    EXPECT_EQ(static_cast<void*>(in.slot(2).data()), memory.data);
    // Batch 3 needs slot 1, which batch 1 holds: the writer waits until the feed is closed.
    auto writer = std::async(std::launch::async, [&] { return in.wait_writable(3, 60s); });
    EXPECT_EQ(writer.wait_for(50ms), std::future_status::timeout);
    in.close();
    EXPECT_THROW((void)writer.get(), stopped_error);
    EXPECT_THROW(in.ready(2), stopped_error);
    EXPECT_THROW((void)source.next(), stopped_error);
  });
}

TEST_P(ingest_feed, registering_and_slot_feeds_refuse_bad_memory_naming_it) {
  shared_mapping memory(1 << 20);
  ASSERT_NE(memory.data, MAP_FAILED);
  auto* base = static_cast<std::byte*>(memory.data);
  EXPECT_NE(
      message_of<logic_error>([&] { (void)dev().register_host(base + 64, 4096); }).find("not page-aligned"),
      std::string::npos);
  EXPECT_NE(message_of<logic_error>([&] { (void)dev().register_host(base, 0); }).find("0 bytes"),
            std::string::npos);
  const mem_view pageable = pageable_view(memory.data, memory.bytes);
  EXPECT_NE(message_of<logic_error>([&] {
              slot_feed in(dev(), {.pool = pageable, .slot_bytes = 4096, .slots = 2});
            }).find("register it"),
            std::string::npos);
  buffer pinned = dev().register_host(memory.data, 8192);
  EXPECT_NE(message_of<logic_error>([&] {
              slot_feed in(dev(), {.pool = pinned.view(), .slot_bytes = 4096, .slots = 3});
            }).find("fewer than 3"),
            std::string::npos);
  EXPECT_NE(message_of<logic_error>([&] {
              slot_feed in(dev(), {.pool = pinned.view(), .slot_bytes = 1000, .slots = 2});
            }).find("multiple of 256"),
            std::string::npos);
}

INSTANTIATE_TEST_SUITE_P(backends, ingest_feed, ::testing::ValuesIn(backends_under_test()),
                         backend_test_name);

}  // namespace
}  // namespace ferry::ingest
