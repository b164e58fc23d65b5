// PowerSGD over the host communicator: a mean of rank-r matrices comes back exactly; error feedback holds
// each rank's residual (E + result = G + E_before) and keeps the sum over steps exact (sum of results +
// mean residual = sum of mean gradients); every rank ends each step with the same bytes; small and 1-D
// tensors travel whole and come back as the exact mean.
#include "ferry/comm/powersgd.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "ferry/comm/codec.hpp"
#include "ferry/comm/detail/codec_math.hpp"
#include "host_ranks.hpp"
#include "support/test_support.hpp"

namespace ferry::comm {
namespace {

using ferry::testing::message_of;
using testing::host_ranks;
using testing::on_every_rank;
using testing::unmodelled;

// Two 64x32 matrices (one shape group), a 40x50 one, a 1-D tensor and a 3x3 one (too small to compress).
const std::vector<matrix_shape> shapes{{64, 32}, {100, 1}, {64, 32}, {3, 3}, {40, 50}};
const std::vector<std::size_t> offsets{0, 2048, 2148 + 12, 4208, 4217 + 3};
constexpr std::size_t bucket_elements = 4220 + 2000 + 5;

std::vector<float> download(device& dev, mem_view v, stream_view s) {
  const buffer host = dev.alloc_pinned(v.bytes);
  dev.copy(host.view(), v, s);
  std::vector<float> out(v.bytes / 4);
  std::memcpy(out.data(), host.host_bytes(), v.bytes);
  return out;
}

void upload(device& dev, mem_view dst, const std::vector<float>& values, stream_view s) {
  const buffer host = dev.alloc_pinned(values.size() * 4);
  std::memcpy(host.host_bytes(), values.data(), values.size() * 4);
  dev.copy(dst, host.view(), s);
}

bool in_matrix(std::size_t i) {
  for (std::size_t k = 0; k < shapes.size(); ++k) {
    if (i >= offsets[k] && i < offsets[k] + shapes[k].elements()) return true;
  }
  return false;
}

bool in_compressed(const powersgd& c, std::size_t i) {
  for (std::size_t k = 0; k < shapes.size(); ++k) {
    if (c.compressed(k) && i >= offsets[k] && i < offsets[k] + shapes[k].elements()) return true;
  }
  return false;
}

TEST(powersgd, small_and_one_dimensional_tensors_travel_whole) {
  host_ranks ranks(1, unmodelled(std::chrono::seconds(20)), 1);
  const powersgd c(ranks[0], shapes, offsets, bucket_elements, {.rank = 2});
  EXPECT_TRUE(c.compressed(0));
  EXPECT_FALSE(c.compressed(1));  // 1-D
  EXPECT_TRUE(c.compressed(2));
  EXPECT_FALSE(c.compressed(3));  // (3 + 3) * 2 * 2 >= 9
  EXPECT_TRUE(c.compressed(4));
  // P: (64 + 64 + 40) * 2, Q: (32 + 32 + 50) * 2, whole: 100 + 9.
  EXPECT_EQ(c.wire_elements(), 168U * 2 + 114U * 2 + 109U);
}

TEST(powersgd, the_mean_of_rank_r_matrices_comes_back_exactly) {
  const int n = 3;
  host_ranks ranks(n, unmodelled(std::chrono::seconds(20)), 2);
  // Every rank's compressed matrix k is sum_{c<2} u_{k,c} v_{r,k,c}^T: the mean is of rank 2.
  auto value = [](int rank, std::size_t k, std::size_t i, std::size_t j) {
    double x = 0;
    for (std::size_t c = 0; c < 2; ++c) {
      x += static_cast<double>(detail::unit_noise(1000 + k * 10 + c, i)) *
           detail::unit_noise(2000 + k * 10 + c + 100 * static_cast<std::size_t>(rank), j);
    }
    return static_cast<float>(x);
  };
  std::vector<std::vector<float>> results(n);
  on_every_rank(n, [&](int rank) {
    device& dev = ranks.dev(rank);
    const stream s = dev.make_stream();
    powersgd c(ranks[rank], shapes, offsets, bucket_elements, {.rank = 2, .seed = 5});
    const buffer bucket = dev.alloc_device(bucket_elements * 4);
    std::vector<float> g(bucket_elements, 0.0F);
    for (std::size_t k = 0; k < shapes.size(); ++k) {
      for (std::size_t i = 0; i < shapes[k].rows; ++i) {
        for (std::size_t j = 0; j < shapes[k].cols; ++j) {
          g[offsets[k] + i * shapes[k].cols + j] =
              c.compressed(k) ? value(rank, k, i, j)
                              : detail::unit_noise(77 + static_cast<std::uint64_t>(rank), i * 7 + j);
        }
      }
    }
    upload(dev, bucket.view(), g, s);
    c.reduce_async(bucket.view(), s);
    results[static_cast<std::size_t>(rank)] = download(dev, bucket.view(), s);
  });
  for (std::size_t k = 0; k < shapes.size(); ++k) {
    for (std::size_t i = 0; i < shapes[k].rows; ++i) {
      for (std::size_t j = 0; j < shapes[k].cols; ++j) {
        const std::size_t at = offsets[k] + i * shapes[k].cols + j;
        double mean = 0;
        double m = 0;
        for (int r = 0; r < n; ++r) {
          const double x = k == 1 || k == 3
                               ? detail::unit_noise(77 + static_cast<std::uint64_t>(r), i * 7 + j)
                               : value(r, k, i, j);
          mean += x;
          m = std::max(m, std::fabs(x));
        }
        mean /= n;
        const double tol = k == 1 || k == 3 ? error_bound(codec_kind::none, n, m) : 2e-5;
        ASSERT_NEAR(results[0][at], mean, tol) << "matrix " << k << " (" << i << ", " << j << ")";
      }
    }
  }
  for (int r = 1; r < n; ++r) {
    EXPECT_EQ(
        std::memcmp(results[static_cast<std::size_t>(r)].data(), results[0].data(), bucket_elements * 4), 0)
        << "rank " << r;
  }
}

TEST(powersgd, error_feedback_carries_the_residual_and_keeps_the_sum_over_steps) {
  const int n = 3;
  const int steps = 6;
  host_ranks ranks(n, unmodelled(std::chrono::seconds(20)), 3);
  // Per rank: the sum of its results, of its gradients, and its last residual.
  std::vector<std::vector<double>> sum_results(n, std::vector<double>(bucket_elements, 0.0));
  std::vector<std::vector<double>> sum_grads(n, std::vector<double>(bucket_elements, 0.0));
  std::vector<std::vector<float>> last_error(n);
  std::vector<std::vector<std::vector<float>>> results(n);
  on_every_rank(n, [&](int rank) {
    device& dev = ranks.dev(rank);
    const stream s = dev.make_stream();
    powersgd c(ranks[rank], shapes, offsets, bucket_elements, {.rank = 1, .seed = 9});
    const buffer bucket = dev.alloc_device(bucket_elements * 4);
    auto& sr = sum_results[static_cast<std::size_t>(rank)];
    auto& sg = sum_grads[static_cast<std::size_t>(rank)];
    for (int t = 0; t < steps; ++t) {
      std::vector<float> g(bucket_elements);
      for (std::size_t i = 0; i < bucket_elements; ++i) {
        // The gaps between matrices are padding, zero as in the reducer's buffer.
        g[i] = in_matrix(i) ? detail::fill_value(0.1F, 1.0F, static_cast<std::uint64_t>(1000 * t + rank), i)
                            : 0.0F;
        sg[i] += g[i];
      }
      const std::vector<float> e_before = download(dev, c.error(), s);
      upload(dev, bucket.view(), g, s);
      c.reduce_async(bucket.view(), s);
      const std::vector<float> result = download(dev, bucket.view(), s);
      const std::vector<float> e_after = download(dev, c.error(), s);
      for (std::size_t i = 0; i < bucket_elements; ++i) {
        sr[i] += result[i];
        if (!in_compressed(c, i)) {
          EXPECT_EQ(e_after[i], 0.0F) << "element " << i << " travels whole: no feedback";
          continue;
        }
        // The residual is exactly what the approximation left out of G + E_before.
        const double m = static_cast<double>(g[i]) + e_before[i];
        const double tol = 4e-7 * (std::fabs(m) + std::fabs(result[i])) + 1e-30;
        ASSERT_NEAR(static_cast<double>(e_after[i]) + result[i], m, tol)
            << "rank " << rank << ", step " << t << ", element " << i;
      }
      // A rank-1 approximation of random matrices drops something: the feedback is not empty.
      double e_norm = 0;
      for (const float x : e_after) e_norm += static_cast<double>(x) * x;
      EXPECT_GT(e_norm, 1.0);
      results[static_cast<std::size_t>(rank)].push_back(result);
    }
    last_error[static_cast<std::size_t>(rank)] = download(dev, c.error(), s);
  });
  // Same bytes on every rank at every step.
  for (int r = 1; r < n; ++r) {
    for (int t = 0; t < steps; ++t) {
      EXPECT_EQ(std::memcmp(results[static_cast<std::size_t>(r)][static_cast<std::size_t>(t)].data(),
                            results[0][static_cast<std::size_t>(t)].data(), bucket_elements * 4),
                0)
          << "rank " << r << ", step " << t;
    }
  }
  // Delayed, not lost: sum_t result_t + mean_r E_r = sum_t mean_r G_r,t.
  double worst = 0;
  for (std::size_t i = 0; i < bucket_elements; ++i) {
    double mean_grads = 0;
    double mean_error = 0;
    for (int r = 0; r < n; ++r) {
      mean_grads += sum_grads[static_cast<std::size_t>(r)][i] / n;
      mean_error += static_cast<double>(last_error[static_cast<std::size_t>(r)][i]) / n;
    }
    worst = std::max(worst, std::fabs(sum_results[0][i] + mean_error - mean_grads));
  }
  EXPECT_LT(worst, 1e-4) << "the sum over steps drifted";
}

TEST(powersgd, refuses_bad_shapes_and_options_naming_the_value) {
  host_ranks ranks(1, unmodelled(std::chrono::seconds(20)), 4);
  const std::vector<matrix_shape> two{{4, 4}, {4, 4}};
  EXPECT_MESSAGE_HAS(message_of<logic_error>([&] {
                       powersgd c(ranks[0], two, std::vector<std::size_t>{0, 16}, 32, {.rank = 0});
                     }),
                     "rank = 0");
  EXPECT_MESSAGE_HAS(message_of<logic_error>([&] {
                       powersgd c(ranks[0], two, std::vector<std::size_t>{0, 10}, 32);
                     }),
                     "matrix 1 at element 10 overlaps");
  EXPECT_MESSAGE_HAS(message_of<logic_error>([&] {
                       powersgd c(ranks[0], two, std::vector<std::size_t>{0, 20}, 32);
                     }),
                     "ends past the bucket's 32 elements");
  EXPECT_MESSAGE_HAS(
      message_of<logic_error>([&] { powersgd c(ranks[0], two, std::vector<std::size_t>{0}, 32); }),
      "2 shapes and 1 offsets");
  powersgd c(ranks[0], two, std::vector<std::size_t>{0, 16}, 32);
  const buffer small = ranks.dev(0).alloc_device(64);
  const stream s = ranks.dev(0).make_stream();
  EXPECT_MESSAGE_HAS(message_of<logic_error>([&] { c.reduce_async(small.view(), s); }),
                     "smaller than the 32");
}

}  // namespace
}  // namespace ferry::comm
