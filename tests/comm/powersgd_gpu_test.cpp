// PowerSGD on GPUs (cuBLAS through ferry::shim, ferry's kernels) against the host implementation on the
// same inputs: n ranks over NCCL (one GPU each; FERRY_TEST_GPUS=n, default 1) and n host ranks, six steps
// at ranks 1 and 2 (warm start and error feedback carried between steps), every element of every rank's
// result and error-feedback buffer within fp32 tolerance of the host's; on the GPUs, every rank ends
// each step with the same bytes and the residual is what the approximation left out. Labelled gpu
// (ctest comm_powersgd_cuda; cuBLAS and NCCL found through LD_LIBRARY_PATH).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "ferry/comm/communicator.hpp"
#include "ferry/comm/detail/codec_math.hpp"
#include "ferry/comm/powersgd.hpp"
#include "ferry/comm/powersgd_codec.hpp"
#include "ferry/comm/reducer.hpp"
#include "ferry/core/units.hpp"
#include "ferry/cuda/cuda.hpp"
#include "host_ranks.hpp"

namespace ferry::comm {
namespace {

using testing::host_ranks;
using testing::on_every_rank;
using testing::unmodelled;

int gpus_under_test() {
  const char* env = std::getenv("FERRY_TEST_GPUS");
  return env != nullptr && *env != '\0' ? std::atoi(env) : 1;
}

struct nccl_ranks {
  std::vector<std::unique_ptr<device>> devices;
  std::vector<std::unique_ptr<communicator>> comms;

  explicit nccl_ranks(int n) {
    std::vector<device*> raw;
    for (int r = 0; r < n; ++r) {
      devices.push_back(make_cuda_device(r));
      raw.push_back(devices.back().get());
    }
    comm_options o;
    o.timeout = std::chrono::seconds(60);
    comms = make_nccl_group(raw, o);
  }
  nccl_ranks(const nccl_ranks&) = delete;
  nccl_ranks& operator=(const nccl_ranks&) = delete;
  ~nccl_ranks() { comms.clear(); }
};

// Three 96x40 matrices (one shape group of 3, at unevenly spaced offsets), a 1-D tensor, a 3x3 one
// (whole), a 130x70 one and a 33x257 one.
const std::vector<matrix_shape> shapes{{96, 40}, {200, 1}, {96, 40}, {3, 3}, {130, 70}, {96, 40}, {33, 257}};
std::vector<std::size_t> offsets_of(const std::vector<matrix_shape>& s) {
  std::vector<std::size_t> out;
  std::size_t at = 0;
  for (std::size_t k = 0; k < s.size(); ++k) {
    out.push_back(at);
    at += s[k].elements() + 4 * k + 1;  // uneven gaps (padding)
  }
  return out;
}
const std::vector<std::size_t> offsets = offsets_of(shapes);
const std::size_t bucket_elements = offsets.back() + shapes.back().elements() + 7;

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

// Rank `rank`'s gradient at step t: a rank-3 part plus noise, so rank 1 and 2 drop something.
std::vector<float> gradient(int rank, int t) {
  std::vector<float> g(bucket_elements, 0.0F);
  for (std::size_t i = 0; i < bucket_elements; ++i) {
    if (!in_matrix(i)) continue;
    g[i] = detail::fill_value(0.05F, 1.0F, static_cast<std::uint64_t>(1000 * t + rank), i) +
           2.0F * detail::unit_noise(7, i % 97) * detail::unit_noise(8, i % 89);
  }
  return g;
}

struct run {
  std::vector<std::vector<std::vector<float>>> results;  // [rank][step]
  std::vector<std::vector<std::vector<float>>> errors;   // [rank][step]
};

// Six steps of PowerSGD with `options` on the ranks of `comm_of`.
template <typename CommOf>
run run_steps(int n, int steps, const powersgd_options& options, CommOf comm_of) {
  run out;
  out.results.resize(n);
  out.errors.resize(n);
  on_every_rank(n, [&](int rank) {
    communicator& comm = comm_of(rank);
    device& dev = comm.dev();
    const stream s = dev.make_stream();
    powersgd c(comm, shapes, offsets, bucket_elements, options);
    const buffer bucket = dev.alloc_device(bucket_elements * 4);
    for (int t = 0; t < steps; ++t) {
      upload(dev, bucket.view(), gradient(rank, t), s);
      c.reduce_async(bucket.view(), s);
      out.results[static_cast<std::size_t>(rank)].push_back(download(dev, bucket.view(), s));
      out.errors[static_cast<std::size_t>(rank)].push_back(download(dev, c.error(), s));
    }
  });
  return out;
}

TEST(powersgd_gpu, cuda_matches_the_host_implementation_step_by_step) {
  const int n = gpus_under_test();
  ASSERT_GE(n, 1);
  ASSERT_LE(n, cuda_device_count()) << "FERRY_TEST_GPUS=" << n;
  std::string why;
  ASSERT_TRUE(nccl_available(&why)) << why;
  const int steps = 6;
  for (const int r : {1, 2}) {
    for (const bool warm : {true, false}) {
      const powersgd_options options{.rank = r, .warm_start = warm, .seed = 11};
      host_ranks hr(n, unmodelled(std::chrono::seconds(60)), 5);
      const run host = run_steps(n, steps, options, [&](int rank) -> communicator& { return hr[rank]; });
      nccl_ranks gr(n);
      const run gpu =
          run_steps(n, steps, options, [&](int rank) -> communicator& { return *gr.comms[rank]; });
      for (int rank = 0; rank < n; ++rank) {
        const auto rk = static_cast<std::size_t>(rank);
        for (int t = 0; t < steps; ++t) {
          const auto tk = static_cast<std::size_t>(t);
          const std::vector<float>& hres = host.results[rk][tk];
          const std::vector<float>& gres = gpu.results[rk][tk];
          const std::vector<float>& herr = host.errors[rk][tk];
          const std::vector<float>& gerr = gpu.errors[rk][tk];
          const std::vector<float> g = gradient(rank, t);
          const std::vector<float> e_before =
              t == 0 ? std::vector<float>(bucket_elements, 0.0F) : gpu.errors[rk][tk - 1];
          for (std::size_t i = 0; i < bucket_elements; ++i) {
            // Products in fp32 (cuBLAS) against fp64 accumulation (host): a few ulps of the largest terms,
            // grown a little by the orthogonalization and over the steps.
            const double tol = 1e-4 * (1.0 + std::fabs(herr[i]) + std::fabs(hres[i]));
            ASSERT_NEAR(gres[i], hres[i], tol) << "rank " << rank << " step " << t << " element " << i
                                               << " (r = " << r << ", warm " << warm << ")";
            ASSERT_NEAR(gerr[i], herr[i], tol)
                << "error feedback, rank " << rank << " step " << t << " element " << i << " (r = " << r
                << ", warm " << warm << ")";
            // On the GPU too, the residual is what the approximation left out of G + E_before (0 for
            // the tensors that travel whole).
            if (gerr[i] != 0.0F) {
              const double m = static_cast<double>(g[i]) + e_before[i];
              ASSERT_NEAR(static_cast<double>(gerr[i]) + gres[i], m,
                          4e-7 * (std::fabs(m) + std::fabs(gres[i])) + 1e-30)
                  << "rank " << rank << " step " << t << " element " << i;
            }
          }
          if (rank > 0) {
            EXPECT_EQ(std::memcmp(gres.data(), gpu.results[0][tk].data(), bucket_elements * 4), 0)
                << "rank " << rank << " step " << t;
          }
        }
      }
    }
  }
}

// The reducer with powersgd_kind (rank 2, two buckets, the second fp32 after set_plan) on the
// GPUs and on host ranks, the same gradients: every step's buffer within fp32 tolerance of the host's,
// the same bytes on every GPU rank.
TEST(powersgd_gpu, the_reducer_on_gpus_matches_the_host_reducer_and_ranks_agree) {
  const int n = gpus_under_test();
  ASSERT_LE(n, cuda_device_count()) << "FERRY_TEST_GPUS=" << n;
  std::string why;
  ASSERT_TRUE(nccl_available(&why)) << why;
  const std::vector<matrix_shape> params{{256, 128}, {128, 1}, {96, 40}, {3, 3},
                                         {96, 40},   {300, 1}, {512, 64}};
  const int steps = 5;
  reducer_options o;
  o.plan.first_bucket_bytes = 64 * KiB;
  o.plan.bucket_cap_bytes = 160 * KiB;
  o.codec = powersgd_kind;
  o.codec_options[powersgd_kind] = powersgd_options{.rank = 2};
  o.rebuild = false;
  auto run_reducer = [&](auto comm_of) {
    std::vector<std::vector<std::vector<float>>> flats(n);  // [rank][step]
    on_every_rank(n, [&](int rank) {
      communicator& comm = comm_of(rank);
      device& dev = comm.dev();
      const stream producer = dev.make_stream();
      const stream s = dev.make_stream();
      reducer red(comm, params, o);
      ASSERT_GE(red.plan().buckets.size(), 2U) << red.plan().describe();
      for (int t = 0; t < steps; ++t) {
        if (t == 2) {
          std::vector<codec_kind> codecs(red.plan().buckets.size(), powersgd_kind);
          codecs[1] = codec_kind::none;
          red.set_plan(red.plan(), codecs);
        }
        red.begin_step();
        for (std::size_t p = params.size(); p-- > 0;) {
          std::vector<float> g(params[p].elements());
          for (std::size_t i = 0; i < g.size(); ++i)
            g[i] = detail::fill_value(0.0F, 1.0F, static_cast<std::uint64_t>(100 * t + rank),
                                      p * 1'000'000 + i) +
                   detail::unit_noise(5, p * 1000 + i % 61) * detail::unit_noise(6, p * 1000 + i % 53);
          upload(dev, red.grad(p), g, producer);
          red.mark_ready(p, producer);
        }
        red.finish(s);
        flats[static_cast<std::size_t>(rank)].push_back(download(dev, red.flat(), s));
      }
    });
    return flats;
  };
  host_ranks hr(n, unmodelled(std::chrono::seconds(60)), 6);
  const auto host = run_reducer([&](int rank) -> communicator& { return hr[rank]; });
  nccl_ranks gr(n);
  const auto gpu = run_reducer([&](int rank) -> communicator& { return *gr.comms[rank]; });
  for (int rank = 0; rank < n; ++rank) {
    const auto rk = static_cast<std::size_t>(rank);
    for (int t = 0; t < steps; ++t) {
      const auto tk = static_cast<std::size_t>(t);
      ASSERT_EQ(gpu[rk][tk].size(), host[rk][tk].size());
      for (std::size_t i = 0; i < gpu[rk][tk].size(); ++i) {
        ASSERT_NEAR(gpu[rk][tk][i], host[rk][tk][i], 1e-4 * (1.0 + std::fabs(host[rk][tk][i])))
            << "rank " << rank << " step " << t << " element " << i;
      }
      if (rank > 0) {
        EXPECT_EQ(std::memcmp(gpu[rk][tk].data(), gpu[0][tk].data(), gpu[0][tk].size() * 4), 0)
            << "rank " << rank << " step " << t;
      }
    }
  }
}

}  // namespace
}  // namespace ferry::comm
