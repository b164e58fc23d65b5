// The reducer over the host communicator: 2 to 4 ranks, each driven by its own thread over a jittery
// emulated device. Gradients equal the exact fp32 mean within each codec's bound and every rank ends
// with the same bytes; buckets launch in plan order; the communication stream waits for the producers
// and the optimizer's stream for the communication stream; the first step's rebuild follows rank 0's
// order on every rank; misuse is refused naming the parameter; ten jittered steps stay correct; the
// automatic plan learns over its steps, decides the same plan on every rank and keeps every step exact.
#include "ferry/comm/reducer.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <functional>
#include <mutex>
#include <numeric>
#include <random>
#include <vector>

#include "ferry/comm/f32_ops.hpp"
#include "ferry/comm/float16.hpp"
#include "host_ranks.hpp"
#include "reducer_steps.hpp"
#include "support/test_support.hpp"

namespace ferry::comm {
namespace {

using ferry::testing::message_of;
using testing::expect_reduced;
using testing::fill_of;
using testing::host_ranks;
using testing::on_every_rank;
using testing::read_floats;
using testing::reverse_order;
using testing::run_step;
using testing::sizes;
using testing::small_buckets;
using testing::unmodelled;

TEST(reducer, every_codec_averages_within_its_bound_and_every_rank_ends_with_the_same_bytes) {
  for (const codec_kind c : {codec_kind::none, codec_kind::fp16, codec_kind::bf16}) {
    for (const int n : {2, 3, 4}) {
      SCOPED_TRACE(::testing::Message() << to_string(c) << ", " << n << " ranks");
      host_ranks ranks(n, unmodelled(std::chrono::seconds(20)), 3);
      std::vector<std::vector<float>> flats(static_cast<std::size_t>(n));
      on_every_rank(n, [&](int rank) {
        device& dev = ranks.dev(rank);
        reducer r(ranks[rank], sizes, small_buckets(c));
        ASSERT_GE(r.plan().buckets.size(), 4U);
        const stream producer = dev.make_stream();
        const stream optimizer = dev.make_stream();
        for (std::uint64_t step = 1; step <= 2; ++step) {
          run_step(r, step, reverse_order(sizes.size()), producer, optimizer);
          expect_reduced(r, step, n, optimizer);
        }
        flats[static_cast<std::size_t>(rank)] = read_floats(dev, r.flat(), optimizer);
      });
      for (int rank = 1; rank < n; ++rank) {
        ASSERT_EQ(flats[static_cast<std::size_t>(rank)].size(), flats[0].size());
        EXPECT_EQ(
            std::memcmp(flats[static_cast<std::size_t>(rank)].data(), flats[0].data(), flats[0].size() * 4),
            0)
            << "rank " << rank << "'s buffer differs from rank 0's";
      }
    }
  }
}

TEST(reducer, a_complete_bucket_waits_for_the_buckets_before_it) {
  host_ranks ranks(2, unmodelled(std::chrono::seconds(20)), 5);
  on_every_rank(2, [&](int rank) {
    device& dev = ranks.dev(rank);
    reducer_options o = small_buckets();
    o.rebuild = false;
    reducer r(ranks[rank], sizes, o);
    const bucket_plan& plan = r.plan();
    const std::size_t nb = plan.buckets.size();
    ASSERT_GE(nb, 3U);
    const stream producer = dev.make_stream();
    r.begin_step();
    // The last bucket first: complete, but bucket 0 is not, so nothing launches.
    for (const std::size_t p : plan.buckets[nb - 1].params) {
      fill_f32_async(r.grad(p), sizes[p], fill_of(1, p, rank), producer);
      r.mark_ready(p, producer);
    }
    EXPECT_EQ(r.stats().buckets_launched, 0U);
    // Bucket 0 completes: it launches, and only it (bucket 1 is incomplete).
    for (const std::size_t p : plan.buckets[0].params) {
      fill_f32_async(r.grad(p), sizes[p], fill_of(1, p, rank), producer);
      r.mark_ready(p, producer);
    }
    EXPECT_EQ(r.stats().buckets_launched, 1U);
    // The middle buckets complete in order: each launch releases the next, the last one included.
    for (std::size_t b = 1; b + 1 < nb; ++b) {
      for (const std::size_t p : plan.buckets[b].params) {
        fill_f32_async(r.grad(p), sizes[p], fill_of(1, p, rank), producer);
        r.mark_ready(p, producer);
      }
      EXPECT_EQ(r.stats().buckets_launched, b + 1 == nb - 1 ? nb : b + 1);
    }
    r.finish(producer);
    expect_reduced(r, 1, 2, producer);
    EXPECT_EQ(r.stats().bucket_launches, std::vector<std::uint64_t>(nb, 1));
  });
}

TEST(reducer, the_communication_stream_waits_for_the_producer) {
  host_ranks ranks(2, unmodelled(std::chrono::seconds(20)), 7);
  on_every_rank(2, [&](int rank) {
    device& dev = ranks.dev(rank);
    reducer r(ranks[rank], sizes, small_buckets(codec_kind::bf16));
    const stream producer = dev.make_stream();
    r.begin_step();
    {
      // The producer is held before its fills: every bucket launches at once, and its encode and
      // all-reduce must wait on the device side until the fills ran.
      ferry::testing::held_stream hold(dev, producer);
      for (const std::size_t p : reverse_order(sizes.size())) {
        fill_f32_async(r.grad(p), sizes[p], fill_of(1, p, rank), producer);
        r.mark_ready(p, producer);
      }
      EXPECT_EQ(r.stats().buckets_launched, r.plan().buckets.size());
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      hold.open();
    }
    r.finish(producer);
    expect_reduced(r, 1, 2, producer);
  });
}

TEST(reducer, gradients_from_several_producer_streams_are_all_waited_for) {
  host_ranks ranks(3, unmodelled(std::chrono::seconds(20)), 8);
  on_every_rank(3, [&](int rank) {
    device& dev = ranks.dev(rank);
    reducer r(ranks[rank], sizes, small_buckets());
    // More producer streams than the reducer remembers between launches (8): it flushes early.
    std::vector<stream> producers;
    for (int k = 0; k < 11; ++k) producers.push_back(dev.make_stream());
    const stream optimizer = dev.make_stream();
    for (std::uint64_t step = 1; step <= 3; ++step) {
      r.begin_step();
      std::vector<std::unique_ptr<ferry::testing::held_stream>> holds;
      for (auto& s : producers) holds.push_back(std::make_unique<ferry::testing::held_stream>(dev, s));
      std::size_t k = 0;
      for (const std::size_t p : reverse_order(sizes.size())) {
        const stream& s = producers[(k++ + step) % producers.size()];
        fill_f32_async(r.grad(p), sizes[p], fill_of(step, p, rank), s);
        r.mark_ready(p, s);
      }
      r.finish(optimizer);
      // Released in reverse: the last producer's work is the last to run.
      for (auto it = holds.rbegin(); it != holds.rend(); ++it) (*it)->open();
      expect_reduced(r, step, 3, optimizer);
    }
  });
}

TEST(reducer, the_rebuild_follows_rank_0s_order_on_every_rank_and_keeps_the_gradients) {
  const int n = 3;
  host_ranks ranks(n, unmodelled(std::chrono::seconds(20)), 11);
  // Rank 0 marks in registration order (the reverse of the first plan's); the others shuffle.
  std::vector<std::vector<std::size_t>> orders(n);
  orders[0].resize(sizes.size());
  std::iota(orders[0].begin(), orders[0].end(), 0);
  for (int k = 1; k < n; ++k) {
    orders[static_cast<std::size_t>(k)] = orders[0];
    std::shuffle(orders[static_cast<std::size_t>(k)].begin(), orders[static_cast<std::size_t>(k)].end(),
                 std::mt19937(static_cast<unsigned>(k)));
  }
  const bucket_plan expected = make_bucket_plan(sizes, orders[0], small_buckets().plan);
  std::vector<bucket_plan> plans(n);
  on_every_rank(n, [&](int rank) {
    device& dev = ranks.dev(rank);
    reducer r(ranks[rank], sizes, small_buckets(codec_kind::fp16));
    const stream producer = dev.make_stream();
    const std::vector<std::size_t>& order = orders[static_cast<std::size_t>(rank)];
    run_step(r, 1, order, producer, producer);
    EXPECT_EQ(std::vector<std::size_t>(r.observed_order().begin(), r.observed_order().end()), order);
    EXPECT_TRUE(r.rebuild_due());
    EXPECT_EQ(r.generation(), 0U);
    const std::vector<float> before = read_floats(dev, r.grad(4), producer);
    const void* old_view = r.grad(0).data;

    r.begin_step();  // the exchange and the new layout
    EXPECT_FALSE(r.rebuild_due());
    EXPECT_FALSE(r.plan_pending());
    EXPECT_EQ(r.generation(), 1U);
    EXPECT_EQ(r.stats().plan_changes, 1U);
    EXPECT_NE(r.grad(0).data, old_view);
    plans[static_cast<std::size_t>(rank)] = r.plan();
    // The step-1 gradients moved with the layout.
    const std::vector<float> after = read_floats(dev, r.grad(4), producer);
    EXPECT_EQ(std::memcmp(before.data(), after.data(), before.size() * 4), 0);
    for (const std::size_t p : order) {
      fill_f32_async(r.grad(p), sizes[p], fill_of(2, p, rank), producer);
      r.mark_ready(p, producer);
    }
    r.finish(producer);
    expect_reduced(r, 2, n, producer);
    // Once only: later steps keep the plan whatever the order.
    run_step(r, 3, reverse_order(sizes.size()), producer, producer);
    r.begin_step();
    EXPECT_EQ(r.generation(), 1U);
    for (const std::size_t p : order) {
      fill_f32_async(r.grad(p), sizes[p], fill_of(4, p, rank), producer);
      r.mark_ready(p, producer);
    }
    r.finish(producer);
    expect_reduced(r, 4, n, producer);
  });
  for (int k = 0; k < n; ++k) EXPECT_EQ(plans[static_cast<std::size_t>(k)], expected) << "rank " << k;
  EXPECT_EQ(expected.buckets.front().params.front(), 0U);  // parameter 0 became ready first on rank 0
}

TEST(reducer, a_rebuild_to_the_same_order_keeps_the_layout_and_its_views) {
  host_ranks ranks(2, unmodelled(std::chrono::seconds(20)), 12);
  on_every_rank(2, [&](int rank) {
    device& dev = ranks.dev(rank);
    reducer r(ranks[rank], sizes, small_buckets());
    const stream producer = dev.make_stream();
    const void* view = r.grad(3).data;
    run_step(r, 1, reverse_order(sizes.size()), producer, producer);
    r.begin_step();
    EXPECT_EQ(r.generation(), 0U);
    EXPECT_EQ(r.grad(3).data, view);
    EXPECT_EQ(r.stats().plan_changes, 0U);
  });
}

TEST(reducer, a_missing_mark_names_the_parameters_and_the_step_can_still_finish) {
  host_ranks ranks(2, unmodelled(std::chrono::seconds(20)), 13);
  on_every_rank(2, [&](int rank) {
    device& dev = ranks.dev(rank);
    reducer r(ranks[rank], sizes, small_buckets());
    const stream producer = dev.make_stream();
    r.begin_step();
    for (const std::size_t p : reverse_order(sizes.size())) {
      fill_f32_async(r.grad(p), sizes[p], fill_of(1, p, rank), producer);
      if (p != 3 && p != 6) r.mark_ready(p, producer);
    }
    EXPECT_MESSAGE_HAS(message_of<logic_error>([&] { r.finish(producer); }),
                       "parameters 3, 6 (2 of 9) were never marked ready");
    r.mark_ready(6, producer);
    r.mark_ready(3, producer);
    r.finish(producer);
    expect_reduced(r, 1, 2, producer);
  });
}

TEST(reducer, marking_twice_is_refused_and_queues_nothing) {
  host_ranks ranks(2, unmodelled(std::chrono::seconds(20)), 14);
  on_every_rank(2, [&](int rank) {
    device& dev = ranks.dev(rank);
    reducer r(ranks[rank], sizes, small_buckets());
    const stream producer = dev.make_stream();
    r.begin_step();
    // Parameter 8 is the first of the reverse plan: its bucket (the first) launches when it completes.
    fill_f32_async(r.grad(8), sizes[8], fill_of(1, 8, rank), producer);
    r.mark_ready(8, producer);
    const std::uint64_t launched = r.stats().buckets_launched;
    EXPECT_MESSAGE_HAS(message_of<logic_error>([&] { r.mark_ready(8, producer); }),
                       "mark_ready(8) twice in step 1");
    EXPECT_EQ(r.stats().buckets_launched, launched);
    for (const std::size_t p : reverse_order(sizes.size())) {
      if (p == 8) continue;
      fill_f32_async(r.grad(p), sizes[p], fill_of(1, p, rank), producer);
      r.mark_ready(p, producer);
    }
    r.finish(producer);
    expect_reduced(r, 1, 2, producer);
  });
}

TEST(reducer, misuse_between_and_inside_steps_is_refused_naming_the_value) {
  host_ranks ranks(1, unmodelled(std::chrono::seconds(20)), 15);
  device& dev = ranks.dev(0);
  reducer r(ranks[0], sizes, small_buckets());
  const stream s = dev.make_stream();
  const auto other = make_host_device();
  const stream foreign = other->make_stream();
  EXPECT_MESSAGE_HAS(message_of<logic_error>([&] { r.mark_ready(0, s); }), "mark_ready(0) outside a step");
  EXPECT_MESSAGE_HAS(message_of<logic_error>([&] { r.finish(s); }), "finish() outside a step");
  EXPECT_MESSAGE_HAS(message_of<logic_error>([&] { (void)r.grad(9); }),
                     "grad(9): the reducer has 9 parameters");
  r.begin_step();
  EXPECT_MESSAGE_HAS(message_of<logic_error>([&] { r.begin_step(); }), "begin_step while step 1 is open");
  EXPECT_MESSAGE_HAS(message_of<logic_error>([&] { r.mark_ready(12, s); }), "mark_ready(12) in step 1");
  EXPECT_MESSAGE_HAS(message_of<logic_error>([&] { r.mark_ready(1, foreign); }), "another device");
  EXPECT_MESSAGE_HAS(message_of<logic_error>([&] { r.set_plan(r.plan(), {codec_kind::none}); }),
                     "set_plan during step 1");
  for (std::size_t p = 0; p < sizes.size(); ++p) r.mark_ready(p, s);
  EXPECT_MESSAGE_HAS(message_of<logic_error>([&] { r.finish(foreign); }), "another device");
  r.finish(s);
  EXPECT_MESSAGE_HAS(message_of<logic_error>([&] { (void)r.last_step_timing(); }),
                     "without reducer_options::timing");
  EXPECT_MESSAGE_HAS(message_of<logic_error>([&] {
                       r.set_plan(r.plan(), {codec_kind::none, codec_kind::bf16});
                     }),
                     "2 codecs for");
  bucket_plan broken = r.plan();
  broken.places[2].elements += 1;
  EXPECT_MESSAGE_HAS(message_of<logic_error>([&] { r.set_plan(broken, {codec_kind::none}); }),
                     "parameter 2 has 5000 elements");
  EXPECT_MESSAGE_HAS(message_of<logic_error>([&] {
                       reducer_options o;
                       o.plan.bucket_cap_bytes = 0;
                       reducer bad(ranks[0], sizes, o);
                     }),
                     "bucket_cap_bytes = 0");
  EXPECT_MESSAGE_HAS(message_of<logic_error>([&] {
                       reducer bad(ranks[0], std::vector<std::size_t>{3, 0}, reducer_options{});
                     }),
                     "parameter 1 has 0 elements");
}

TEST(reducer, set_plan_takes_effect_at_the_next_step_with_a_codec_per_bucket) {
  const int n = 2;
  host_ranks ranks(n, unmodelled(std::chrono::seconds(20)), 16);
  on_every_rank(n, [&](int rank) {
    device& dev = ranks.dev(rank);
    reducer r(ranks[rank], sizes, small_buckets());
    const stream producer = dev.make_stream();
    run_step(r, 1, reverse_order(sizes.size()), producer, producer);
    // Three buckets of about 100 KiB, one codec each.
    const std::vector<std::size_t> order{8, 7, 6, 5, 4, 3, 2, 1, 0};
    const bucket_plan plan =
        make_bucket_plan(sizes, order, {.first_bucket_bytes = 96 * KiB, .bucket_cap_bytes = 288 * KiB});
    ASSERT_EQ(plan.buckets.size(), 3U);
    const std::vector<codec_kind> codecs{codec_kind::bf16, codec_kind::none, codec_kind::fp16};
    r.set_plan(r.plan(), std::vector<codec_kind>(r.plan().buckets.size(), codec_kind::none));
    EXPECT_FALSE(r.plan_pending());  // what runs now: nothing to change
    r.set_plan(plan, codecs);
    EXPECT_TRUE(r.plan_pending());
    EXPECT_FALSE(r.rebuild_due());  // the explicit plan replaces the rebuild
    EXPECT_EQ(r.generation(), 0U);
    const reducer_stats before = r.stats();
    r.begin_step();
    EXPECT_EQ(r.generation(), 1U);
    EXPECT_EQ(r.plan(), plan);
    EXPECT_EQ(std::vector<codec_kind>(r.codecs().begin(), r.codecs().end()), codecs);
    for (const std::size_t p : order) {
      fill_f32_async(r.grad(p), sizes[p], fill_of(2, p, rank), producer);
      r.mark_ready(p, producer);
    }
    r.finish(producer);
    expect_reduced(r, 2, n, producer);
    const reducer_stats after = r.stats();
    std::uint64_t wire = 0;
    std::uint64_t grads = 0;
    for (std::size_t b = 0; b < 3; ++b) {
      wire += wire_bytes(codecs[b], plan.buckets[b].elements);
      grads += plan.buckets[b].bytes();
    }
    EXPECT_EQ(after.wire_bytes - before.wire_bytes, wire);
    EXPECT_EQ(after.gradient_bytes - before.gradient_bytes, grads);
    EXPECT_EQ(after.buckets_launched - before.buckets_launched, 3U);
    EXPECT_EQ(after.bucket_launches, std::vector<std::uint64_t>(3, 1));
    EXPECT_EQ(after.steps, 2U);
  });
}

TEST(reducer, ten_jittered_steps_on_four_ranks_stay_correct_and_every_rank_ends_with_the_same_bytes) {
  const int n = 4;
  host_ranks ranks(n, unmodelled(std::chrono::seconds(30)), 17);
  std::vector<std::vector<float>> flats(static_cast<std::size_t>(n));
  on_every_rank(n, [&](int rank) {
    reducer r(ranks[rank], sizes, small_buckets(codec_kind::bf16));
    flats[static_cast<std::size_t>(rank)] = testing::ten_steps_with_every_codec(r, n);
    EXPECT_EQ(r.stats().steps, 10U);
    // The rebuild after step 1 (rank 0's random order makes other buckets) and the codecs before step 6.
    EXPECT_EQ(r.generation(), 1U);
    EXPECT_EQ(r.stats().plan_changes, 2U);
  });
  for (int rank = 1; rank < n; ++rank)
    EXPECT_EQ(flats[static_cast<std::size_t>(rank)], flats[0])
        << "rank " << rank << "'s buffer differs from rank 0's";
}

// A 16-bit gradient value of rank `rank`: small multiples of 1/8, so every sum of a few of them is exact
// in f32 and the only rounding is the mean's, once.
float half_value(std::uint64_t step, std::size_t p, std::size_t i, int rank) {
  return static_cast<float>(
             static_cast<int>((step * 7 + p * 13 + i * 3 + static_cast<std::size_t>(rank) * 5) % 41) - 20) /
         8.0F;
}

std::uint16_t to_half(dtype t, float f) { return t == dtype::f16 ? float_to_f16(f) : float_to_bf16(f); }

// Pure low-precision training: bf16 and f16 gradients (odd element counts, so 2-byte padding inside the
// plans' 4-byte slots), averaged in their own type or widened to f32, over 2 and 3 ranks and a rebuild.
// The host group sums in f32 and rounds once, so either way each element is the rounded exact mean.
TEST(reducer, bf16_and_f16_gradients_are_averaged_in_their_type_or_in_f32_and_the_padding_stays_zero) {
  for (const dtype t : {dtype::bf16, dtype::f16}) {
    for (const bool widen : {false, true}) {
      for (const int n : {2, 3}) {
        SCOPED_TRACE(::testing::Message()
                     << to_string(t) << (widen ? " in f32, " : " in its type, ") << n << " ranks");
        host_ranks ranks(n, unmodelled(std::chrono::seconds(20)), 21);
        std::vector<std::vector<std::byte>> flats(static_cast<std::size_t>(n));
        on_every_rank(n, [&](int rank) {
          device& dev = ranks.dev(rank);
          reducer_options o = small_buckets();
          o.grad_type = t;
          if (widen) o.reduce_type = dtype::f32;
          reducer r(ranks[rank], sizes, o);
          ASSERT_GE(r.plan().buckets.size(), 3U);
          EXPECT_EQ(r.grad_type(), t);
          const stream producer = dev.make_stream();
          const stream optimizer = dev.make_stream();
          for (std::uint64_t step = 1; step <= 2; ++step) {
            r.begin_step();
            // Marked first to last: the rebuild after step 1 lays the gradients out anew (the first plan is
            // in reverse order), so step 2 runs on a moved layout.
            for (std::size_t p = 0; p < sizes.size(); ++p) {
              const mem_view g = r.grad(p);
              ASSERT_EQ(g.bytes, sizes[p] * 2);
              buffer staged = dev.alloc_pinned(g.bytes);
              auto* h = reinterpret_cast<std::uint16_t*>(staged.host_bytes());
              for (std::size_t i = 0; i < sizes[p]; ++i) h[i] = to_half(t, half_value(step, p, i, rank));
              dev.copy(g, staged.view(), producer);
              r.mark_ready(p, producer);
            }
            r.finish(optimizer);
            for (std::size_t p = 0; p < sizes.size(); ++p) {
              const buffer back = dev.alloc_pinned(r.grad(p).bytes);
              dev.copy(back.view(), r.grad(p), optimizer);
              const auto* got = reinterpret_cast<const std::uint16_t*>(back.host_bytes());
              for (std::size_t i = 0; i < sizes[p]; ++i) {
                float sum = 0;
                for (int k = 0; k < n; ++k) sum += half_value(step, p, i, k);
                const std::uint16_t want = to_half(t, sum / static_cast<float>(n));
                ASSERT_EQ(got[i], want)
                    << "rank " << rank << ", step " << step << ", param " << p << " element " << i;
              }
            }
          }
          EXPECT_EQ(r.generation(), 1U) << "the rebuild did not move the layout";
          ASSERT_EQ(r.plan_sizes().size(), sizes.size());
          EXPECT_EQ(r.plan_sizes()[1], 19U);  // 37 bf16/f16 values: 74 bytes, 19 slots of 4
          // In their own type the gradients' bytes travel; widened to f32, twice as many.
          EXPECT_EQ(r.stats().wire_bytes, (widen ? 2 : 1) * r.stats().gradient_bytes);
          const buffer all = dev.alloc_pinned(r.flat().bytes);
          dev.copy(all.view(), r.flat(), optimizer);
          flats[static_cast<std::size_t>(rank)].assign(all.host_bytes(), all.host_bytes() + all.size());
          // Every byte outside the gradients is padding, and zero.
          std::vector<bool> used(r.flat().bytes, false);
          for (std::size_t p = 0; p < sizes.size(); ++p) {
            const std::size_t at = static_cast<std::size_t>(r.grad(p).begin() - r.flat().begin());
            std::fill_n(used.begin() + static_cast<std::ptrdiff_t>(at), r.grad(p).bytes, true);
          }
          for (std::size_t b = 0; b < used.size(); ++b) {
            if (!used[b]) {
              ASSERT_EQ(all.host_bytes()[b], std::byte{0}) << "padding byte " << b;
            }
          }
        });
        for (int rank = 1; rank < n; ++rank)
          EXPECT_EQ(flats[static_cast<std::size_t>(rank)], flats[0])
              << "rank " << rank << " differs from rank 0";
      }
    }
  }
}

TEST(reducer, a_16_bit_gradient_is_refused_a_lossy_codec_and_a_reduction_in_another_16_bit_type) {
  host_ranks ranks(1, unmodelled(std::chrono::seconds(20)), 22);
  reducer_options o = small_buckets(codec_kind::fp16);
  o.grad_type = dtype::bf16;
  EXPECT_MESSAGE_HAS(message_of<logic_error>([&] { reducer bad(ranks[0], sizes, o); }),
                     "reducer_options::codec = fp16 for bf16 gradients");
  o.codec = codec_kind::none;
  o.reduce_type = dtype::f16;
  EXPECT_MESSAGE_HAS(message_of<logic_error>([&] { reducer bad(ranks[0], sizes, o); }),
                     "reduce_type = f16 for bf16 gradients: expected bf16 or f32");
  o.reduce_type.reset();
  o.automatic.enabled = true;
  o.automatic.policy = codec_policy::lossy_allowed;
  EXPECT_MESSAGE_HAS(message_of<logic_error>([&] { reducer bad(ranks[0], sizes, o); }),
                     "lossy codecs for bf16 gradients");
  o.automatic = {};
  o.grad_type = dtype::i32;
  EXPECT_MESSAGE_HAS(message_of<logic_error>([&] { reducer bad(ranks[0], sizes, o); }),
                     "grad_type = i32: expected f32, bf16 or f16");
  o.grad_type = dtype::f16;
  reducer r(ranks[0], sizes, o);
  EXPECT_MESSAGE_HAS(message_of<logic_error>([&] { r.set_plan(r.plan(), {codec_kind::bf16}); }),
                     "set_plan: codec bf16 for f16 gradients");
}

TEST(reducer, timing_events_follow_the_modelled_link) {
  const int n = 2;
  comm_options o = unmodelled(std::chrono::seconds(20));
  o.link = comm_link::host_memory();
  o.link.model = true;
  host_ranks ranks(n, o, 18);
  on_every_rank(n, [&](int rank) {
    device& dev = ranks.dev(rank);
    reducer_options ro = small_buckets(codec_kind::fp16);
    ro.timing = true;
    reducer r(ranks[rank], sizes, ro);
    const stream producer = dev.make_stream();
    run_step(r, 1, reverse_order(sizes.size()), producer, producer);
    const std::vector<bucket_timing> t = r.last_step_timing();
    ASSERT_EQ(t.size(), r.plan().buckets.size());
    for (std::size_t b = 0; b < t.size(); ++b) {
      EXPECT_LE(t[b].start_ms, t[b].reduce_start_ms);
      EXPECT_LE(t[b].reduce_start_ms, t[b].reduce_end_ms);
      EXPECT_LE(t[b].reduce_end_ms, t[b].end_ms);
      if (b > 0) {
        EXPECT_GE(t[b].start_ms, t[b - 1].end_ms) << "bucket " << b << " overlaps the one before";
      }
      // The all-reduce lasts at least the link's modelled time for the fp16 payload.
      const auto bytes = wire_bytes(codec_kind::fp16, r.plan().buckets[b].elements);
      const double modelled =
          std::chrono::duration<double, std::milli>(o.link.modelled_time(collective::all_reduce, bytes, n))
              .count();
      EXPECT_GE(t[b].reduce_end_ms - t[b].reduce_start_ms, modelled * 0.999) << "bucket " << b;
    }
  });
}

// ---- the automatic plan ----

// The automatic mode with candidates at the test's size (its 400 KB of gradients make several buckets).
reducer_options automatic(int learn_steps, codec_policy policy) {
  reducer_options o;
  o.automatic.enabled = true;
  o.automatic.learn_steps = learn_steps;
  o.automatic.policy = policy;
  o.automatic.caps = {16 * KiB, 64 * KiB, 256 * KiB};
  o.automatic.first_buckets = {4 * KiB};
  o.automatic.fixed_plans = {{8 * KiB, 32 * KiB}};
  o.automatic.probe = {4 * KiB, 64 * KiB};
  return o;
}

bool same_decision(const auto_decision& a, const auto_decision& b) {
  return a.buckets == b.buckets && a.first_bucket_bytes == b.first_bucket_bytes &&
         a.bucket_cap_bytes == b.bucket_cap_bytes && a.lossy_buckets == b.lossy_buckets &&
         a.predicted_exposed_s == b.predicted_exposed_s && a.backward_s == b.backward_s &&
         a.per_bucket_compute_us == b.per_bucket_compute_us && a.probe_buckets == b.probe_buckets &&
         a.decided_at_step == b.decided_at_step;
}

TEST(reducer_auto, decides_after_1_plus_3_learn_steps_the_same_plan_on_every_rank_and_every_step_is_exact) {
  constexpr int learn = 2;
  constexpr std::uint64_t decide_at = 1 + 3 * learn;
  for (const int n : {2, 3}) {
    for (const codec_policy policy : {codec_policy::lossless, codec_policy::lossy_allowed}) {
      SCOPED_TRACE(::testing::Message()
                   << n << " ranks, " << (policy == codec_policy::lossless ? "lossless" : "lossy allowed"));
      host_ranks ranks(n, unmodelled(std::chrono::seconds(20)), 40 + static_cast<std::uint64_t>(n));
      std::vector<bucket_plan> plans(static_cast<std::size_t>(n));
      std::vector<std::vector<codec_kind>> codecs(static_cast<std::size_t>(n));
      std::vector<auto_decision> decisions(static_cast<std::size_t>(n));
      std::vector<std::vector<float>> flats(static_cast<std::size_t>(n));
      on_every_rank(n, [&](int rank) {
        device& dev = ranks.dev(rank);
        reducer r(ranks[rank], sizes, automatic(learn, policy));
        EXPECT_TRUE(r.learning());
        EXPECT_FALSE(r.auto_result().has_value());
        EXPECT_EQ(r.plan().buckets.size(), 1U);  // one bucket until the decision
        const stream producer = dev.make_stream();
        // With three ranks, backward's end is given on another stream than the producer's (an optimizer's).
        const stream optimizer = dev.make_stream();
        const stream_view end = n == 3 ? optimizer.view() : producer.view();
        std::mt19937 rng(static_cast<unsigned>(7 + rank));  // every rank marks in its own order
        std::vector<std::size_t> order(sizes.size());
        std::iota(order.begin(), order.end(), 0);
        for (std::uint64_t step = 1; step <= decide_at + 3; ++step) {
          std::shuffle(order.begin(), order.end(), rng);
          run_step(r, step, order, producer, end);
          expect_reduced(r, step, n, end);  // the learning steps too
          if (step < decide_at) {
            EXPECT_FALSE(r.auto_result().has_value()) << "step " << step;
            EXPECT_TRUE(r.learning()) << "step " << step;
            for (const codec_kind c : r.codecs()) EXPECT_EQ(c, codec_kind::none) << "step " << step;
          }
          if (step == 1) {
            EXPECT_MESSAGE_HAS(message_of<logic_error>([&] { r.set_plan(r.plan(), {codec_kind::none}); }),
                               "while the automatic plan is learning");
          }
          if (step <= 1 + learn) {
            EXPECT_EQ(r.plan().buckets.size(), 1U) << "step " << step;  // the timeline: one bucket
          } else if (step <= decide_at) {
            EXPECT_GT(r.plan().buckets.size(), 4U) << "step " << step;  // the probe's 64 KiB buckets
          }
          if (step == decide_at) {
            ASSERT_TRUE(r.auto_result().has_value());
            EXPECT_TRUE(r.learning());  // until the next begin_step puts it into effect
            EXPECT_EQ(r.auto_result()->probe_buckets, r.plan().buckets.size());
          }
          if (step > decide_at) {
            EXPECT_FALSE(r.learning()) << "step " << step;
          }
        }
        const auto_decision& d = *r.auto_result();
        EXPECT_EQ(d.decided_at_step, decide_at);
        EXPECT_EQ(d.buckets, r.plan().buckets.size());
        const auto lossy_now = static_cast<std::size_t>(
            std::count_if(r.codecs().begin(), r.codecs().end(), [](codec_kind c) { return lossy(c); }));
        EXPECT_EQ(d.lossy_buckets, lossy_now);
        if (policy == codec_policy::lossless) {
          EXPECT_EQ(d.lossy_buckets, 0U);
        }
        EXPECT_GE(d.per_bucket_compute_us, 0);
        EXPECT_GE(d.predicted_exposed_s, 0);
        // The plan is one the search knows: its buckets are cut by the decided first bucket and cap.
        EXPECT_EQ(r.plan(),
                  make_bucket_plan(sizes, r.plan().order(), {d.first_bucket_bytes, d.bucket_cap_bytes, 256}));
        // After the decision nothing changes: the plan of step decide_at + 1 is the one of the last step.
        EXPECT_EQ(r.stats().steps, decide_at + 3);
        plans[static_cast<std::size_t>(rank)] = r.plan();
        codecs[static_cast<std::size_t>(rank)].assign(r.codecs().begin(), r.codecs().end());
        decisions[static_cast<std::size_t>(rank)] = d;
        flats[static_cast<std::size_t>(rank)] = read_floats(dev, r.flat(), end);
      });
      for (int rank = 1; rank < n; ++rank) {
        const auto k = static_cast<std::size_t>(rank);
        EXPECT_EQ(plans[k], plans[0]) << "rank " << rank << "'s plan differs from rank 0's";
        EXPECT_EQ(codecs[k], codecs[0]) << "rank " << rank << "'s codecs differ from rank 0's";
        EXPECT_TRUE(same_decision(decisions[k], decisions[0])) << "rank " << rank;
        EXPECT_EQ(flats[k], flats[0]) << "rank " << rank << "'s buffer differs from rank 0's";
      }
    }
  }
}

// A modelled link slow enough that one bucket's all-reduce (about 8 ms) would trail a backward of about
// 18 ms (a 2 ms spin before each gradient): the decision is several buckets, a new layout that takes
// effect with the gradients kept, and its steps stay exact.
TEST(reducer_auto, on_a_slow_link_it_decides_several_buckets_and_the_new_layout_keeps_steps_exact) {
  constexpr int learn = 1;
  const int n = 2;
  comm_options o = unmodelled(std::chrono::seconds(20));
  o.link.model = true;
  o.link.bus_gbps = 0.05;
  o.link.latency = std::chrono::microseconds(50);
  host_ranks ranks(n, o, 47);
  on_every_rank(n, [&](int rank) {
    device& dev = ranks.dev(rank);
    reducer r(ranks[rank], sizes, automatic(learn, codec_policy::lossless));
    const stream producer = dev.make_stream();
    std::uint64_t generation = 0;
    for (std::uint64_t step = 1; step <= 1 + 3 * learn + 2; ++step) {
      if (step == 2 + 3 * learn) generation = r.generation();
      r.begin_step();
      for (const std::size_t p : reverse_order(sizes.size())) {
        dev.spin_async(std::chrono::milliseconds(2), producer);
        fill_f32_async(r.grad(p), sizes[p], fill_of(step, p, rank), producer);
        r.mark_ready(p, producer);
      }
      r.finish(producer);
      expect_reduced(r, step, n, producer);
    }
    ASSERT_TRUE(r.auto_result().has_value());
    const auto_decision& d = *r.auto_result();
    EXPECT_GT(d.buckets, 1U);
    EXPECT_EQ(r.plan().buckets.size(), d.buckets);
    EXPECT_GT(d.backward_s, 0.010);             // from the first gradient: 8 of the 9 spins
    EXPECT_EQ(r.generation(), generation + 1);  // the decided buckets: a new layout
  });
}

TEST(reducer_auto, after_the_decision_steps_change_no_plan) {
  constexpr int learn = 1;
  const int n = 2;
  host_ranks ranks(n, unmodelled(std::chrono::seconds(20)), 48);
  on_every_rank(n, [&](int rank) {
    device& dev = ranks.dev(rank);
    reducer r(ranks[rank], sizes, automatic(learn, codec_policy::lossless));
    const stream producer = dev.make_stream();
    std::uint64_t step = 1;
    for (; r.learning(); ++step) {
      run_step(r, step, reverse_order(sizes.size()), producer, producer);
      ASSERT_LE(step, 10U) << "still learning";
    }
    // The step that put the decision into effect ran (learning() turned false in its begin_step).
    EXPECT_EQ(step, 1 + 3 * learn + 2U);
    const reducer_stats before = r.stats();
    const std::uint64_t generation = r.generation();
    for (int k = 0; k < 4; ++k, ++step) {
      run_step(r, step, reverse_order(sizes.size()), producer, producer);
      expect_reduced(r, step, n, producer);
    }
    EXPECT_EQ(r.generation(), generation);
    EXPECT_EQ(r.stats().plan_changes, before.plan_changes);
    // Outside learning, set_plan is the caller's again.
    r.set_plan(r.plan(), {codec_kind::none});
  });
}

TEST(reducer_auto, at_world_size_1_it_decides_one_bucket_at_once) {
  host_ranks ranks(1, unmodelled(std::chrono::seconds(20)), 49);
  device& dev = ranks.dev(0);
  reducer r(ranks[0], sizes, automatic(3, codec_policy::lossy_allowed));
  EXPECT_FALSE(r.learning());
  ASSERT_TRUE(r.auto_result().has_value());
  const auto_decision& d = *r.auto_result();
  EXPECT_EQ(d.buckets, 1U);
  EXPECT_EQ(d.decided_at_step, 0U);
  EXPECT_EQ(d.lossy_buckets, 0U);
  EXPECT_EQ(d.probe_buckets, 0U);
  EXPECT_EQ(d.first_bucket_bytes, r.plan().total_bytes());
  EXPECT_EQ(r.plan().buckets.size(), 1U);
  const stream s = dev.make_stream();
  for (std::uint64_t step = 1; step <= 3; ++step) {
    run_step(r, step, reverse_order(sizes.size()), s, s);
    expect_reduced(r, step, 1, s);
    EXPECT_EQ(r.plan().buckets.size(), 1U);  // the rebuild keeps one bucket
    EXPECT_FALSE(r.learning());
  }
}

TEST(reducer_auto, bad_automatic_options_are_refused_naming_the_value) {
  host_ranks ranks(1, unmodelled(std::chrono::seconds(20)), 50);
  auto refused = [&](const std::function<void(reducer_options&)>& change) {
    reducer_options o = automatic(2, codec_policy::lossless);
    change(o);
    return message_of<logic_error>([&] { reducer r(ranks[0], sizes, o); });
  };
  EXPECT_MESSAGE_HAS(refused([](reducer_options& o) { o.automatic.learn_steps = 0; }), "learn_steps = 0");
  EXPECT_MESSAGE_HAS(refused([](reducer_options& o) { o.automatic.learn_steps = -2; }), "learn_steps = -2");
  EXPECT_MESSAGE_HAS(refused([](reducer_options& o) { o.automatic.learn_steps = 5000; }), "[1, 1000]");
  EXPECT_MESSAGE_HAS(refused([](reducer_options& o) { o.automatic.min_lossy_gain = -0.5; }),
                     "min_lossy_gain = -0.5");
  EXPECT_MESSAGE_HAS(refused([](reducer_options& o) { o.automatic.caps = {4 * KiB, 0}; }), "caps[1] = 0");
  EXPECT_MESSAGE_HAS(refused([](reducer_options& o) { o.automatic.first_buckets = {0}; }),
                     "first_buckets[0] = 0");
  EXPECT_MESSAGE_HAS(refused([](reducer_options& o) { o.automatic.probe.bucket_cap_bytes = 0; }),
                     "automatic.probe");
  EXPECT_MESSAGE_HAS(refused([](reducer_options& o) {
                       o.automatic.fixed_plans = {{0, 1 * KiB}};
                     }),
                     "fixed_plans[0]");
  EXPECT_MESSAGE_HAS(refused([](reducer_options& o) {
                       o.automatic.link_sizes = {4096, 1026};
                     }),
                     "link_sizes[1] = 1026 bytes");
  EXPECT_MESSAGE_HAS(refused([](reducer_options& o) { o.automatic.link_sizes = {1 * MiB}; }),
                     "up to the model's 402124 bytes");
  EXPECT_MESSAGE_HAS(refused([](reducer_options& o) {
                       o.automatic.link_sizes = {8192, 4096};
                     }),
                     "sizes must grow");
  EXPECT_MESSAGE_HAS(refused([](reducer_options& o) { o.codec = codec_kind::bf16; }),
                     "reducer_options::codec = bf16 with automatic.enabled");
  EXPECT_MESSAGE_HAS(refused([](reducer_options& o) { o.automatic.policy = static_cast<codec_policy>(7); }),
                     "policy = 7");
  // Without enabled, the automatic options are not looked at.
  reducer_options off;
  off.automatic.learn_steps = 0;
  reducer r(ranks[0], sizes, off);
  EXPECT_FALSE(r.learning());
  EXPECT_FALSE(r.auto_result().has_value());
}

}  // namespace
}  // namespace ferry::comm
