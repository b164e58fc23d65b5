// The reducer with powersgd_kind over 2-3 host ranks: gradients whose mean is of rank r come back
// exactly (and the tensors PowerSGD sends whole as the exact mean); over several steps each rank's
// error feedback holds what the approximation left out and the sum over steps is kept; every rank ends
// every step with the same bytes; set_plan mixes powersgd with other codecs per bucket and keeps the
// state while the buckets and codecs stay.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "ferry/comm/codec.hpp"
#include "ferry/comm/detail/codec_math.hpp"
#include "ferry/comm/powersgd_codec.hpp"
#include "ferry/comm/reducer.hpp"
#include "host_ranks.hpp"
#include "reducer_steps.hpp"
#include "support/test_support.hpp"

namespace ferry::comm {
namespace {

using ferry::testing::message_of;
using testing::host_ranks;
using testing::on_every_rank;
using testing::read_floats;
using testing::reverse_order;

// Two 64x32 matrices, a bias, a 40x50 matrix, a 3x3 one (too small to compress at rank <= 2) and a 1-D
// tensor.
const std::vector<matrix_shape> shapes{{64, 32}, {32, 1}, {40, 50}, {3, 3}, {64, 32}, {200, 1}};

bool compressible(std::size_t p, int r) {
  const matrix_shape& m = shapes[p];
  return m.rows >= 2 && m.cols >= 2 && (m.rows + m.cols) * static_cast<std::size_t>(r) * 2 < m.elements();
}

reducer_options options(int rank) {
  reducer_options o;
  o.plan.first_bucket_bytes = 4 * KiB;
  o.plan.bucket_cap_bytes = 16 * KiB;
  o.codec = powersgd_kind;
  o.codec_options[powersgd_kind] = powersgd_options{.rank = rank, .seed = 3};
  o.rebuild = false;
  return o;
}

void upload(device& dev, mem_view dst, const std::vector<float>& values, stream_view s) {
  const buffer host = dev.alloc_pinned(values.size() * 4);
  std::memcpy(host.host_bytes(), values.data(), values.size() * 4);
  dev.copy(dst, host.view(), s);
}

// Rank `rank`'s gradient of parameter p: for compressible matrices sum_{c<2} u_{p,c} v_{rank,p,c}^T (the
// mean over ranks is of rank 2), else noise.
float low_rank_value(int rank, std::size_t p, std::size_t i, std::size_t j) {
  if (!compressible(p, 2))
    return detail::unit_noise(77 + static_cast<std::uint64_t>(rank), p * 1000 + i * 7 + j);
  double x = 0;
  for (std::size_t c = 0; c < 2; ++c) {
    x += static_cast<double>(detail::unit_noise(1000 + p * 10 + c, i)) *
         detail::unit_noise(2000 + p * 10 + c + 100 * static_cast<std::size_t>(rank), j);
  }
  return static_cast<float>(x);
}

TEST(reducer_powersgd, rank_r_means_come_back_exactly_whole_tensors_as_the_mean_and_ranks_agree) {
  const int n = 3;
  host_ranks ranks(n, testing::unmodelled(), 41);
  std::vector<std::vector<float>> flats(n);
  std::vector<std::vector<std::vector<float>>> grads(n);
  on_every_rank(n, [&](int rank) {
    device& dev = ranks.dev(rank);
    const stream producer = dev.make_stream();
    const stream s = dev.make_stream();
    reducer red(ranks[rank], shapes, options(2));
    ASSERT_GE(red.plan().buckets.size(), 2U) << red.plan().describe();
    red.begin_step();
    for (const std::size_t p : reverse_order(shapes.size())) {
      std::vector<float> g(shapes[p].elements());
      for (std::size_t i = 0; i < shapes[p].rows; ++i) {
        for (std::size_t j = 0; j < shapes[p].cols; ++j)
          g[i * shapes[p].cols + j] = low_rank_value(rank, p, i, j);
      }
      upload(dev, red.grad(p), g, producer);
      red.mark_ready(p, producer);
    }
    red.finish(s);
    for (std::size_t p = 0; p < shapes.size(); ++p)
      grads[static_cast<std::size_t>(rank)].push_back(read_floats(dev, red.grad(p), s));
    flats[static_cast<std::size_t>(rank)] = read_floats(dev, red.flat(), s);
    // Less on the wire than the gradients: P and Q instead of the compressed matrices.
    const reducer_stats st = red.stats();
    EXPECT_LT(st.wire_bytes, st.gradient_bytes / 2);
    for (std::size_t b = 0; b < red.plan().buckets.size(); ++b)
      EXPECT_NE(powersgd_state(red.codec(b)), nullptr);
  });
  for (std::size_t p = 0; p < shapes.size(); ++p) {
    for (std::size_t i = 0; i < shapes[p].rows; ++i) {
      for (std::size_t j = 0; j < shapes[p].cols; ++j) {
        double mean = 0;
        double m = 0;
        for (int r = 0; r < n; ++r) {
          const double x = low_rank_value(r, p, i, j);
          mean += x;
          m = std::max(m, std::fabs(x));
        }
        mean /= n;
        const double tol = compressible(p, 2) ? 2e-5 : error_bound(codec_kind::none, n, m);
        ASSERT_NEAR(grads[0][p][i * shapes[p].cols + j], mean, tol)
            << "param " << p << " (" << i << ", " << j << ")";
      }
    }
  }
  for (int r = 1; r < n; ++r) {
    EXPECT_EQ(std::memcmp(flats[static_cast<std::size_t>(r)].data(), flats[0].data(), flats[0].size() * 4), 0)
        << "rank " << r;
  }
}

TEST(reducer_powersgd, error_feedback_carries_the_residual_and_the_sum_over_steps_is_kept) {
  const int n = 2;
  const int steps = 5;
  host_ranks ranks(n, testing::unmodelled(), 42);
  std::vector<std::vector<std::vector<float>>> flats(n);  // [rank][step]
  std::vector<std::vector<double>> sum_results(n);
  std::vector<std::vector<double>> sum_grads(n);
  std::vector<std::vector<float>> last_error(n);  // in the flat layout
  on_every_rank(n, [&](int rank) {
    const auto rk = static_cast<std::size_t>(rank);
    device& dev = ranks.dev(rank);
    const stream producer = dev.make_stream();
    const stream s = dev.make_stream();
    reducer red(ranks[rank], shapes, options(1));
    const std::size_t total = red.plan().total_elements;
    sum_results[rk].assign(total, 0.0);
    sum_grads[rk].assign(total, 0.0);
    // The error feedback of every bucket, in the flat layout.
    auto errors = [&] {
      std::vector<float> e(total, 0.0F);
      for (std::size_t b = 0; b < red.plan().buckets.size(); ++b) {
        const std::vector<float> eb = read_floats(dev, powersgd_state(red.codec(b))->error(), s);
        std::copy(eb.begin(), eb.end(),
                  e.begin() + static_cast<std::ptrdiff_t>(red.plan().buckets[b].offset));
      }
      return e;
    };
    for (int t = 0; t < steps; ++t) {
      const std::vector<float> e_before = errors();
      std::vector<float> g(total, 0.0F);  // the gradients in the flat layout (padding stays 0)
      red.begin_step();
      for (const std::size_t p : reverse_order(shapes.size())) {
        const std::size_t at = red.plan().places[p].offset;
        std::vector<float> gp(shapes[p].elements());
        for (std::size_t i = 0; i < gp.size(); ++i) {
          gp[i] = detail::fill_value(0.1F, 1.0F, static_cast<std::uint64_t>(100 * t + rank), p * 100'000 + i);
          g[at + i] = gp[i];
        }
        upload(dev, red.grad(p), gp, producer);
        red.mark_ready(p, producer);
      }
      red.finish(s);
      const std::vector<float> result = read_floats(dev, red.flat(), s);
      const std::vector<float> e_after = errors();
      for (std::size_t p = 0; p < shapes.size(); ++p) {
        const std::size_t at = red.plan().places[p].offset;
        for (std::size_t i = 0; i < shapes[p].elements(); ++i) {
          const std::size_t k = at + i;
          if (!compressible(p, 1)) {
            ASSERT_EQ(e_after[k], 0.0F) << "param " << p << " travels whole: no feedback";
            continue;
          }
          const double m = static_cast<double>(g[k]) + e_before[k];
          ASSERT_NEAR(static_cast<double>(e_after[k]) + result[k], m,
                      4e-7 * (std::fabs(m) + std::fabs(result[k])) + 1e-30)
              << "rank " << rank << ", step " << t << ", param " << p << " element " << i;
        }
      }
      double e_norm = 0;
      for (const float x : e_after) e_norm += static_cast<double>(x) * x;
      EXPECT_GT(e_norm, 1.0) << "a rank-1 approximation of noise drops something";
      for (std::size_t k = 0; k < total; ++k) {
        sum_results[rk][k] += result[k];
        sum_grads[rk][k] += g[k];
      }
      flats[rk].push_back(result);
    }
    last_error[rk] = errors();
  });
  for (int r = 1; r < n; ++r) {
    for (int t = 0; t < steps; ++t) {
      const auto& a = flats[static_cast<std::size_t>(r)][static_cast<std::size_t>(t)];
      EXPECT_EQ(std::memcmp(a.data(), flats[0][static_cast<std::size_t>(t)].data(), a.size() * 4), 0)
          << "rank " << r << ", step " << t;
    }
  }
  // Delayed, not lost: sum_t result_t + mean_r E_r = sum_t mean_r G_r,t.
  double worst = 0;
  for (std::size_t k = 0; k < sum_results[0].size(); ++k) {
    double mean_grads = 0;
    double mean_error = 0;
    for (int r = 0; r < n; ++r) {
      mean_grads += sum_grads[static_cast<std::size_t>(r)][k] / n;
      mean_error += static_cast<double>(last_error[static_cast<std::size_t>(r)][k]) / n;
    }
    worst = std::max(worst, std::fabs(sum_results[0][k] + mean_error - mean_grads));
  }
  EXPECT_LT(worst, 1e-4) << "the sum over steps drifted";
}

TEST(reducer_powersgd, set_plan_mixes_codecs_per_bucket_and_keeps_the_state_while_they_stay) {
  const int n = 2;
  host_ranks ranks(n, testing::unmodelled(), 43);
  on_every_rank(n, [&](int rank) {
    device& dev = ranks.dev(rank);
    const stream producer = dev.make_stream();
    const stream s = dev.make_stream();
    reducer_options o = options(1);
    o.codec = codec_kind::none;
    reducer red(ranks[rank], shapes, o);
    const std::size_t buckets = red.plan().buckets.size();
    ASSERT_GE(buckets, 2U);
    for (std::size_t b = 0; b < buckets; ++b) EXPECT_EQ(powersgd_state(red.codec(b)), nullptr);
    std::vector<codec_kind> codecs(buckets, codec_kind::bf16);
    codecs[0] = powersgd_kind;
    red.set_plan(red.plan(), codecs);
    auto step = [&](std::uint64_t t) {
      red.begin_step();
      for (const std::size_t p : reverse_order(shapes.size())) {
        fill_f32_async(red.grad(p), shapes[p].elements(), testing::fill_of(t, p, rank), producer);
        red.mark_ready(p, producer);
      }
      red.finish(s);
    };
    step(1);
    EXPECT_EQ(red.generation(), 0U) << "new codecs on the same buckets keep the layout";
    const powersgd* state = powersgd_state(red.codec(0));
    ASSERT_NE(state, nullptr);
    for (std::size_t b = 1; b < buckets; ++b) EXPECT_EQ(powersgd_state(red.codec(b)), nullptr);
    // The bf16 buckets' parameters are within bf16's bound of the mean.
    for (std::size_t p = 0; p < shapes.size(); ++p) {
      if (red.plan().places[p].bucket == 0) continue;
      const std::vector<float> got = read_floats(dev, red.grad(p), s);
      for (std::size_t i = 0; i < got.size(); ++i) {
        double mean = 0;
        double m = 0;
        for (int r = 0; r < n; ++r) {
          const double x = testing::fill_of(1, p, r).value(i);
          mean += x / n;
          m = std::max(m, std::fabs(x));
        }
        ASSERT_NEAR(got[i], mean, error_bound(codec_kind::bf16, n, m)) << "param " << p << " element " << i;
      }
    }
    red.set_plan(red.plan(), codecs);  // the same: nothing changes
    step(2);
    EXPECT_EQ(powersgd_state(red.codec(0)), state) << "the same codecs keep bucket 0's feedback and Q";
    codecs[0] = codec_kind::none;
    red.set_plan(red.plan(), codecs);
    step(3);
    EXPECT_EQ(powersgd_state(red.codec(0)), nullptr);
  });
}

TEST(reducer_powersgd, refuses_bad_options_and_element_wise_calls_naming_the_value) {
  host_ranks ranks(1, testing::unmodelled(), 44);
  reducer_options o = options(0);
  EXPECT_MESSAGE_HAS(message_of<logic_error>([&] { reducer red(ranks[0], shapes, o); }),
                     "powersgd_options::rank = 0");
  EXPECT_EQ(parse_codec("powersgd"), powersgd_kind);
  EXPECT_EQ(to_string(powersgd_kind), "powersgd");
  EXPECT_TRUE(lossy(powersgd_kind));
  device& dev = ranks.dev(0);
  const buffer a = dev.alloc_device(64);
  const stream s = dev.make_stream();
  EXPECT_MESSAGE_HAS(
      message_of<logic_error>([&] { encode_async(powersgd_kind, a.view(), a.view(), 4, 1, s); }),
      "not an element-wise codec");
  EXPECT_MESSAGE_HAS(message_of<logic_error>([&] { static_cast<void>(error_bound(powersgd_kind, 2, 1.0)); }),
                     "not an element-wise codec");
}

}  // namespace
}  // namespace ferry::comm
