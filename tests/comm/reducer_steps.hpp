// What the reducer's tests share, on any backend: parameters of mixed sizes, a deterministic fill per
// (step, parameter, rank), one step of a rank, and the check of every reduced element against the exact
// mean within its bucket's codec bound, read through the stream finish() ordered.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <span>
#include <vector>

#include "ferry/comm/f32_ops.hpp"
#include "ferry/comm/reducer.hpp"
#include "ferry/core/units.hpp"

namespace ferry::comm::testing {

// Parameters of mixed sizes: tiny ones, one above the cap (70000 floats = 273 KiB), and sizes that are
// not multiples of the alignment.
inline const std::vector<std::size_t> sizes{1000, 37, 5000, 64, 70'000, 1, 4096, 333, 20'000};

inline reducer_options small_buckets(codec_kind c = codec_kind::none) {
  reducer_options o;
  o.plan.first_bucket_bytes = 4 * KiB;
  o.plan.bucket_cap_bytes = 64 * KiB;
  o.codec = c;
  return o;
}

// The fill of parameter p's gradient on rank `rank` in step `step`; ranks use consecutive seeds, so
// with ranks = n the formula is the exact mean.
inline f32_fill fill_of(std::uint64_t step, std::size_t p, int rank) {
  return f32_fill{0.1F * static_cast<float>(p % 5) - 0.2F, 1.0F + static_cast<float>(p % 3),
                  step * 1'000'003 + p * 1009 + static_cast<std::uint64_t>(rank), 1};
}

inline std::vector<float> read_floats(device& dev, mem_view v, stream_view s) {
  const buffer host = dev.alloc_pinned(v.bytes);
  dev.copy(host.view(), v, s);
  std::vector<float> out(v.bytes / sizeof(float));
  std::memcpy(out.data(), host.host_bytes(), v.bytes);
  return out;
}

// Reads every gradient through `s` (so the reads are ordered only by finish()'s wait) and checks each
// element against the exact mean of the ranks' fills within the bound of its bucket's codec.
inline void expect_reduced(reducer& r, std::uint64_t step, int ranks, stream_view s) {
  device& dev = r.comm().dev();
  for (std::size_t p = 0; p < r.param_count(); ++p) {
    const codec_kind c = r.codecs()[r.plan().places[p].bucket];
    const std::vector<float> got = read_floats(dev, r.grad(p), s);
    for (std::size_t i = 0; i < got.size(); ++i) {
      double exact = 0;
      double m = 0;
      for (int k = 0; k < ranks; ++k) {
        const double x = fill_of(step, p, k).value(i);
        exact += x;
        m = std::max(m, std::fabs(x));
      }
      exact /= ranks;
      const double err = std::fabs(static_cast<double>(got[i]) - exact);
      if (err > error_bound(c, ranks, m)) {
        ADD_FAILURE() << "rank " << r.comm().rank() << ", step " << step << ", param " << p << " element "
                      << i << " (" << to_string(c) << "): got " << got[i] << ", exact mean " << exact
                      << ", bound " << error_bound(c, ranks, m);
        return;
      }
    }
  }
}

// One step on one rank: fill every gradient on `producer`, mark them in `order`, finish on `s`.
inline void run_step(reducer& r, std::uint64_t step, std::span<const std::size_t> order, stream_view producer,
                     stream_view s) {
  r.begin_step();
  const int rank = r.comm().rank();
  for (const std::size_t p : order) {
    fill_f32_async(r.grad(p), r.plan().places[p].elements, fill_of(step, p, rank), producer);
    r.mark_ready(p, producer);
  }
  r.finish(s);
}

// Ten steps on one rank of a group: gradients filled in a shuffled order (seeded by the rank) on two
// producer streams, every element checked against the exact mean after each step, and before step 6 a
// chooser's plan between steps: a codec per bucket (none, fp16, bf16 in turn, the same on every rank),
// which must keep the layout and its views. Returns the rank's final flat buffer, which every rank must
// hold byte for byte.
inline std::vector<float> ten_steps_with_every_codec(reducer& r, int ranks) {
  device& dev = r.comm().dev();
  const int rank = r.comm().rank();
  const stream a = dev.make_stream();
  const stream b = dev.make_stream();
  const stream optimizer = dev.make_stream();
  std::mt19937 rng(static_cast<unsigned>(100 + rank));
  std::uint64_t generation = 0;
  for (std::uint64_t step = 1; step <= 10; ++step) {
    if (step == 6) {
      std::vector<codec_kind> codecs(r.plan().buckets.size());
      for (std::size_t k = 0; k < codecs.size(); ++k) codecs[k] = static_cast<codec_kind>(k % 3);
      r.set_plan(r.plan(), codecs);
      generation = r.generation();
    }
    const void* view = r.grad(0).data;
    r.begin_step();
    if (step == 6) {
      EXPECT_EQ(r.generation(), generation);  // new codecs alone keep the layout and its views
      EXPECT_EQ(r.grad(0).data, view);
      EXPECT_EQ(r.codecs()[1], codec_kind::fp16);
    }
    std::vector<std::size_t> order(r.param_count());
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    for (const std::size_t p : order) {
      const stream& s = p % 2 == 0 ? a : b;
      fill_f32_async(r.grad(p), r.plan().places[p].elements, fill_of(step, p, rank), s);
      r.mark_ready(p, s);
    }
    r.finish(optimizer);
    expect_reduced(r, step, ranks, optimizer);
  }
  return read_floats(dev, r.flat(), optimizer);
}

inline std::vector<std::size_t> reverse_order(std::size_t n) {
  std::vector<std::size_t> o(n);
  std::iota(o.rbegin(), o.rend(), 0);
  return o;
}

}  // namespace ferry::comm::testing
