// The NCCL backend. nccl_checks run everywhere (argument checks before NCCL is touched); nccl_gpu needs two
// GPUs (ctest `comm_nccl`, label multigpu) and checks the bytes every rank ends with, and that a missing
// rank, abort() or a destroyed group ends a stuck collective instead of hanging.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "ferry/comm/communicator.hpp"
#include "ferry/comm/float16.hpp"
#include "ferry/core/error.hpp"
#include "ferry/cuda/cuda.hpp"
#include "host_ranks.hpp"

namespace ferry::comm {
namespace {

using testing::on_every_rank;
using clock_type = std::chrono::steady_clock;

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

TEST(nccl_checks, make_nccl_group_refuses_emulated_devices_and_bad_options_before_touching_nccl) {
  const auto host = make_host_device();
  std::vector<device*> devs{host.get()};
  try {
    static_cast<void>(make_nccl_group(devs));
    ADD_FAILURE() << "no logic_error";
  } catch (const logic_error& e) {
    // A build without the CUDA toolkit has no NCCL backend at all, and says that instead.
    EXPECT_TRUE(has(e.what(), "device 0 is on the host backend") ||
                has(e.what(), "ferry was built without the CUDA toolkit"))
        << e.what();
  }
  EXPECT_THROW(static_cast<void>(make_nccl_group({})), logic_error);
}

TEST(nccl_checks, nccl_available_says_why_not_when_it_is_not) {
  std::string reason;
  const bool ok = nccl_available(&reason);
  EXPECT_EQ(ok, reason.empty()) << reason;
  if (!ok) std::cout << "NCCL not available: " << reason << "\n";
}

// ---- on GPUs -----------------------------------------------------------------------------------

// Every GPU of the machine, one rank each, or a skip (fewer than 2 GPUs) with the reason.
struct gpu_group {
  std::vector<std::unique_ptr<device>> devices;
  std::vector<std::unique_ptr<communicator>> comms;

  explicit gpu_group(int n, const comm_options& options) {
    std::vector<device*> raw;
    for (int r = 0; r < n; ++r) {
      devices.push_back(make_cuda_device(r));
      raw.push_back(devices.back().get());
    }
    comms = make_nccl_group(raw, options);
  }
  gpu_group(const gpu_group&) = delete;
  gpu_group& operator=(const gpu_group&) = delete;
  ~gpu_group() { comms.clear(); }
  communicator& operator[](int r) { return *comms[static_cast<std::size_t>(r)]; }
  device& dev(int r) { return *devices[static_cast<std::size_t>(r)]; }
};

// The number of GPUs to run on, or 0 when the test must skip (the reason is in `why`). Two GPUs without a
// loadable NCCL is a failure: that machine is where these tests must run.
int gpus_for_test(std::string& why) {
  const int n = cuda_device_count();
  if (n < 2) {
    why = "needs 2 GPUs; the CUDA runtime sees " + std::to_string(n) +
          (n == 0 ? " (" + cuda_unavailable_reason() + ")" : std::string());
    return 0;
  }
  std::string reason;
  if (!nccl_available(&reason)) {
    ADD_FAILURE() << n << " GPUs but NCCL does not load: " << reason
                  << " (set LD_LIBRARY_PATH to the nvidia-nccl package's lib folder)";
    why = reason;
    return 0;
  }
  return n;
}

#define FERRY_NEED_GPUS(n)                  \
  std::string skip_reason;                  \
  const int n = gpus_for_test(skip_reason); \
  if (n == 0) GTEST_SKIP() << skip_reason;

float value(int rank, std::size_t i) {
  return static_cast<float>(static_cast<int>((i * 7 + rank * 13) % 61) - 30);
}

// Writes `values` as `t` into device memory `dst` through a pinned buffer (synchronously).
void upload(device& d, mem_view dst, dtype t, const std::vector<float>& values, stream_view s) {
  const buffer pinned = d.alloc_pinned(values.size() * size_of(t));
  std::byte* p = pinned.host_bytes();
  for (std::size_t i = 0; i < values.size(); ++i) {
    if (t == dtype::f32) {
      std::memcpy(p + i * 4, &values[i], 4);
    } else {
      const std::uint16_t h = t == dtype::f16 ? float_to_f16(values[i]) : float_to_bf16(values[i]);
      std::memcpy(p + i * 2, &h, 2);
    }
  }
  d.copy(dst.subview(0, pinned.size()), pinned, s);
}

std::vector<float> download(device& d, mem_view src, dtype t, std::size_t count, stream_view s) {
  const buffer pinned = d.alloc_pinned(count * size_of(t));
  d.copy(pinned, src.subview(0, pinned.size()), s);
  std::vector<float> out(count);
  const std::byte* p = pinned.host_bytes();
  for (std::size_t i = 0; i < count; ++i) {
    if (t == dtype::f32) {
      std::memcpy(&out[i], p + i * 4, 4);
    } else {
      std::uint16_t h = 0;
      std::memcpy(&h, p + i * 2, 2);
      out[i] = t == dtype::f16 ? f16_to_float(h) : bf16_to_float(h);
    }
  }
  return out;
}

comm_options gpu_options(std::chrono::milliseconds timeout = std::chrono::seconds(60)) {
  comm_options o;
  o.timeout = timeout;
  return o;
}

// Sums of integers in [-30, 30] over the ranks are exact in every dtype; so are their averages over a
// power-of-two number of ranks (checked within one rounding otherwise).
TEST(nccl_gpu, all_reduce_sums_and_averages_every_dtype_in_place_and_out_of_place) {
  FERRY_NEED_GPUS(n);
  gpu_group g(n, gpu_options());
  constexpr std::size_t count = (std::size_t{1} << 20) + 7;
  for (const dtype t : {dtype::f32, dtype::f16, dtype::bf16}) {
    for (const reduce_op op : {reduce_op::sum, reduce_op::avg}) {
      for (const bool in_place : {false, true}) {
        on_every_rank(n, [&](int r) {
          device& d = g.dev(r);
          const stream s = d.make_stream();
          std::vector<float> mine(count);
          for (std::size_t i = 0; i < count; ++i) mine[i] = value(r, i);
          const buffer send = d.alloc_device(count * size_of(t));
          const buffer recv = d.alloc_device(count * size_of(t));
          upload(d, send, t, mine, s);
          d.memset_async(recv, 0xA5, s);
          const mem_view out = in_place ? send.view() : recv.view();
          g[r].all_reduce(send, out, count, t, op, s).synchronize();
          const std::vector<float> got = download(d, out, t, count, s);
          const double bound = (n & (n - 1)) == 0 || op == reduce_op::sum ? 0.0 : 1.0 / 128;
          int wrong = 0;
          for (std::size_t i = 0; i < count; ++i) {
            double exact = 0;
            for (int k = 0; k < n; ++k) exact += value(k, i);
            if (op == reduce_op::avg) exact /= n;
            if (std::abs(got[i] - exact) > std::abs(exact) * bound && wrong++ < 5)
              ADD_FAILURE() << "rank " << r << " " << to_string(t) << " " << to_string(op) << " element " << i
                            << ": " << got[i] << ", expected " << exact;
          }
          EXPECT_EQ(wrong, 0) << "rank " << r << " " << to_string(t) << " " << to_string(op)
                              << (in_place ? " in place" : " out of place");
        });
      }
    }
  }
}

// Integer element i of rank r (above 2^53, so a sum over the ranks wraps past the top), and the bytes of
// `v` as dtype `t` (i32 keeps the low 32 bits).
std::uint64_t int_value(int rank, std::size_t i) {
  return 0xF000'0000'0000'0000ULL + i * 0x1'0000'0001ULL +
         static_cast<std::uint64_t>(rank) * 0x0123'4567'89AB'CDEFULL;
}
std::vector<std::byte> int_bytes(dtype t, const std::vector<std::uint64_t>& v) {
  std::vector<std::byte> out(v.size() * size_of(t));
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (t == dtype::i32) {
      const auto w = static_cast<std::uint32_t>(v[i]);
      std::memcpy(out.data() + i * 4, &w, 4);
    } else {
      std::memcpy(out.data() + i * 8, &v[i], 8);
    }
  }
  return out;
}
std::vector<std::byte> bytes_of(device& d, mem_view src, std::size_t bytes, stream_view s) {
  const buffer pinned = d.alloc_pinned(bytes);
  d.copy(pinned, src.subview(0, bytes), s);
  return {pinned.host_bytes(), pinned.host_bytes() + bytes};
}

// Integer dtypes map to ncclInt32/ncclInt64/ncclUint64: sums exact modulo 2^bits, gathers and broadcasts
// bit for bit (the host backend's host_collectives test checks the same bytes).
TEST(nccl_gpu, integer_dtypes_sum_gather_and_broadcast_exactly) {
  FERRY_NEED_GPUS(n);
  gpu_group g(n, gpu_options());
  constexpr std::size_t count = 100'003;
  for (const dtype t : {dtype::i32, dtype::i64, dtype::u64}) {
    on_every_rank(n, [&](int r) {
      device& d = g.dev(r);
      const stream s = d.make_stream();
      const std::size_t part = count * size_of(t);
      std::vector<std::uint64_t> mine(count), sum(count), roots(count), all;
      for (std::size_t i = 0; i < count; ++i) {
        mine[i] = int_value(r, i);
        roots[i] = int_value(n - 1, i);
        for (int k = 0; k < n; ++k) sum[i] += int_value(k, i);
      }
      for (int k = 0; k < n; ++k)
        for (std::size_t i = 0; i < count; ++i) all.push_back(int_value(k, i));
      const std::vector<std::byte> own = int_bytes(t, mine);
      const buffer pinned = d.alloc_pinned(part);
      std::memcpy(pinned.host_bytes(), own.data(), part);
      const buffer a = d.alloc_device(part);
      const buffer b = d.alloc_device(part * static_cast<std::size_t>(n));
      d.copy(a, pinned, s);
      g[r].all_reduce(a, a, count, t, reduce_op::sum, s).synchronize();
      ASSERT_EQ(bytes_of(d, a, part, s), int_bytes(t, sum)) << to_string(t) << " sum on rank " << r;
      d.copy(a, pinned, s);
      g[r].all_gather(a, b, count, t, s).synchronize();
      ASSERT_EQ(bytes_of(d, b, part * static_cast<std::size_t>(n), s), int_bytes(t, all))
          << to_string(t) << " gather on rank " << r;
      g[r].broadcast(a, a, count, t, n - 1, s).synchronize();
      ASSERT_EQ(bytes_of(d, a, part, s), int_bytes(t, roots)) << to_string(t) << " broadcast on rank " << r;
    });
  }
}

TEST(nccl_gpu, all_gather_and_broadcast_from_every_root_deliver_every_element) {
  FERRY_NEED_GPUS(n);
  gpu_group g(n, gpu_options());
  constexpr std::size_t count = 300'001;
  on_every_rank(n, [&](int r) {
    device& d = g.dev(r);
    const stream s = d.make_stream();
    std::vector<float> mine(count);
    for (std::size_t i = 0; i < count; ++i) mine[i] = value(r, i);
    const buffer send = d.alloc_device(count * 4);
    const buffer recv = d.alloc_device(count * 4 * static_cast<std::size_t>(n));
    upload(d, send, dtype::f32, mine, s);
    g[r].all_gather(send, recv, count, dtype::f32, s).synchronize();
    const std::vector<float> all = download(d, recv, dtype::f32, count * static_cast<std::size_t>(n), s);
    for (int k = 0; k < n; ++k)
      for (std::size_t i = 0; i < count; ++i)
        ASSERT_EQ(all[static_cast<std::size_t>(k) * count + i], value(k, i)) << "rank " << r << " part " << k;
    for (int root = 0; root < n; ++root) {
      d.memset_async(recv, 0xA5, s);
      g[r].broadcast(r == root ? send.view() : mem_view{}, recv, count, dtype::f32, root, s).synchronize();
      const std::vector<float> got = download(d, recv, dtype::f32, count, s);
      for (std::size_t i = 0; i < count; ++i)
        ASSERT_EQ(got[i], value(root, i)) << "rank " << r << " root " << root;
    }
  });
}

TEST(nccl_gpu, a_barrier_completes_on_a_rank_only_after_every_rank_reached_it) {
  FERRY_NEED_GPUS(n);
  gpu_group g(n, gpu_options());
  std::atomic<int> reached{0};
  std::atomic<int> seen{-1};
  on_every_rank(n, [&](int r) {
    device& d = g.dev(r);
    const stream s = d.make_stream();
    if (r != 0) {
      d.spin_async(std::chrono::milliseconds(50), s);
      d.launch_host_func(s, [&] { reached.fetch_add(1); });
    }
    g[r].barrier(s);
    if (r == 0) d.launch_host_func(s, [&] { seen = reached.load(); });
    s.synchronize();
  });
  EXPECT_EQ(seen.load(), n - 1);
}

// Runs one all-reduce on every rank, so the communicators are connected.
void warm_up(gpu_group& g, int n) {
  on_every_rank(n, [&](int r) {
    device& d = g.dev(r);
    const stream s = d.make_stream();
    const buffer buf = d.alloc_device(1024);
    g[r].all_reduce(buf, buf, 256, dtype::f32, reduce_op::sum, s).synchronize();
  });
}

// Issues rank 0's all-reduce (catching a comm_error NCCL's enqueue may already raise), then waits for the
// group to abort; returns how long that took. The stream must drain afterwards: nothing is left stuck.
std::chrono::milliseconds lone_all_reduce_until_aborted(gpu_group& g) {
  device& d = g.dev(0);
  const stream s = d.make_stream();
  const buffer buf = d.alloc_device(1 << 20);
  const auto start = clock_type::now();
  try {
    static_cast<void>(g[0].all_reduce(buf, buf, 1 << 18, dtype::f32, reduce_op::sum, s));
  } catch (const comm_error& e) {
    EXPECT_EQ(e.rank(), 0);
    EXPECT_EQ(e.op(), collective::all_reduce);
  }
  while (!g[0].aborted() && clock_type::now() - start < std::chrono::seconds(120))
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(clock_type::now() - start);
  EXPECT_TRUE(g[0].aborted()) << "not aborted after " << took.count() << " ms";
  try {
    s.synchronize();
  } catch (const std::exception& e) {
    std::cout << "synchronize after the abort: " << e.what() << "\n";
  }
  return took;
}

TEST(nccl_gpu, a_rank_that_never_calls_aborts_the_group_within_the_timeout_naming_it) {
  FERRY_NEED_GPUS(n);
  gpu_group g(2, gpu_options(std::chrono::seconds(3)));
  warm_up(g, 2);
  const auto took = lone_all_reduce_until_aborted(g);
  const std::string why = g[0].abort_reason();
  std::cout << "aborted after " << took.count() << " ms: " << why << "\n";
  EXPECT_TRUE(has(why, "all_reduce #1 on rank 0 of 2")) << why;
  EXPECT_TRUE(has(why, "rank 1 had not issued it")) << why;
  // Later calls refuse at once, naming the rank and the operation.
  device& d = g.dev(1);
  const stream s = d.make_stream();
  try {
    static_cast<void>(g[1].barrier(s));
    ADD_FAILURE() << "no comm_error";
  } catch (const comm_error& e) {
    EXPECT_EQ(e.rank(), 1);
    EXPECT_EQ(e.op(), collective::barrier);
    EXPECT_TRUE(has(e.what(), "barrier on rank 1 of 2: the group was aborted")) << e.what();
  }
}

TEST(nccl_gpu, a_rank_that_never_calls_its_first_collective_aborts_the_group_too) {
  FERRY_NEED_GPUS(n);
  gpu_group g(2, gpu_options(std::chrono::seconds(3)));
  const auto took = lone_all_reduce_until_aborted(g);
  const std::string why = g[0].abort_reason();
  std::cout << "aborted after " << took.count() << " ms: " << why << "\n";
  EXPECT_TRUE(has(why, "all_reduce #0 on rank 0 of 2")) << why;
  EXPECT_TRUE(has(why, "rank 1 had not issued it")) << why;
}

TEST(nccl_gpu, abort_from_another_thread_ends_a_stuck_collective) {
  FERRY_NEED_GPUS(n);
  gpu_group g(2, gpu_options());  // 60 s: only abort() can end it soon
  warm_up(g, 2);
  std::thread stopper([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    g[1].abort("the job was cancelled");
  });
  const auto took = lone_all_reduce_until_aborted(g);
  stopper.join();
  EXPECT_LT(took, std::chrono::seconds(30));
  EXPECT_EQ(g[0].abort_reason(), "abort() on rank 1: the job was cancelled");
}

TEST(nccl_gpu, destroying_the_group_with_a_collective_in_flight_does_not_hang) {
  FERRY_NEED_GPUS(n);
  auto g = std::make_unique<gpu_group>(2, gpu_options());
  warm_up(*g, 2);
  device& d = g->dev(0);
  const auto start = clock_type::now();
  {
    const stream s = d.make_stream();
    const buffer buf = d.alloc_device(4096);
    static_cast<void>((*g)[0].all_reduce(buf, buf, 1024, dtype::f32, reduce_op::sum, s));
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    g->comms.clear();  // rank 1 never joined; its collective on rank 0 is aborted
    try {
      s.synchronize();
    } catch (const std::exception& e) {
      std::cout << "synchronize after destroying the group: " << e.what() << "\n";
    }
  }
  EXPECT_LT(clock_type::now() - start, std::chrono::seconds(30));
}

}  // namespace
}  // namespace ferry::comm
