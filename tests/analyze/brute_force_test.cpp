// The analyzer's interval arithmetic against a microsecond-by-microsecond count: on random timelines whose
// events start and end on whole microseconds, each step's time per GPU category and the idle time each
// thread's innermost activity covered must equal what walking every microsecond finds.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "analyze/builder.hpp"
#include "ferry/analyze/analyze.hpp"
#include "ferry/core/error.hpp"

using namespace ferry::trace;
using namespace ferry::trace::test_traces;

namespace {

constexpr std::int64_t steps = 3;
constexpr std::int64_t period_us = 400;
constexpr std::int64_t horizon_us = steps * period_us + 100;  // some activity after the last span

// A random timeline: step spans on the main thread, kernels (some NCCL), copies and memsets on two
// streams, and on two threads nested annotations, API calls (some blocking), profiler operators, and
// events of zero length; everything on whole microseconds.
builder random_timeline(std::uint32_t seed) {
  std::mt19937 rng(seed);
  const auto pick = [&](std::int64_t lo, std::int64_t hi) {
    return std::uniform_int_distribution<std::int64_t>(lo, hi)(rng);
  };
  const auto interval = [&](std::int64_t max_len) {
    const std::int64_t s = pick(0, horizon_us - 1);
    const std::int64_t len = pick(0, 9) == 0 ? 0 : pick(1, max_len);
    return std::pair<double, double>(static_cast<double>(s),
                                     static_cast<double>(std::min(s + len, horizon_us)));
  };
  builder b;
  b.steps(static_cast<int>(steps), period_us);
  b.t.thread_names[worker_tid] = "worker";
  const std::uint32_t op_domain = b.t.strings.intern("pytorch.op");
  for (int i = 0, n = static_cast<int>(pick(5, 40)); i < n; ++i) {
    const auto [s, e] = interval(60);
    switch (pick(0, 4)) {
      case 0: b.kernel(s, e, 7); break;
      case 1: b.kernel(s, e, 8, pick(0, 1) ? "ncclKernel_AllReduce" : "gemm"); break;
      case 2: b.copy(copy_kind::h2d, s, e, 1000, mem_kind::pinned, true, 8); break;
      case 3: b.copy(copy_kind::d2h, s, e, 1000, mem_kind::pageable, false, 7); break;
      default: {
        event& m = b.add(activity::memset, "memset", s, e);
        m.device = 0;
        m.stream = 7;
      }
    }
  }
  static const char* const names[] = {"load", "decode", "step work", "post"};
  for (const std::uint64_t thread : {main_tid, worker_tid}) {
    for (int i = 0, n = static_cast<int>(pick(5, 30)); i < n; ++i) {
      const auto [s, e] = interval(200);
      switch (pick(0, 3)) {
        case 0: b.range(names[pick(0, 3)], s, e, thread); break;
        case 1:
          b.api(pick(0, 1) ? "cudaLaunchKernel" : "cudaStreamSynchronize", s, e,
                pick(0, 1) ? sync_kind::stream : sync_kind::none, thread);
          break;
        case 2: b.range(pick(0, 1) ? "aten::copy_" : "aten::mm", s, e, thread).domain = op_domain; break;
        default: b.range("bench level", s, e, thread);
      }
    }
  }
  return b;
}

struct expected {
  std::vector<std::array<std::int64_t, 6>> per_step;  // compute, comm, d2d, h2d, d2h, idle (us)
  std::map<std::tuple<std::uint64_t, std::string, bool>, std::int64_t>
      idle_by;  // (thread, activity, blocking)
  std::int64_t total_idle = 0;
};

// What walking every microsecond of the analysis' steps finds.
expected count_every_microsecond(const timeline& t, const analysis& a) {
  expected x;
  const auto covers = [](const event& e, std::int64_t ns) { return e.start_ns <= ns && ns < e.end_ns; };
  // The outermost profiler operators of each thread, as the analyzer keeps them: in order of start, then
  // end, each that does not start inside the one kept before it.
  std::vector<std::size_t> order(t.events.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&t](std::size_t i, std::size_t j) {
    return std::tie(t.events[i].start_ns, t.events[i].end_ns, i) <
           std::tie(t.events[j].start_ns, t.events[j].end_ns, j);
  });
  std::map<std::uint64_t, std::vector<std::size_t>> outer_ops;
  std::map<std::uint64_t, std::int64_t> kept_until;
  for (const std::size_t i : order) {
    const event& e = t.events[i];
    if (e.kind != activity::range || t.domain_of(e) != "pytorch.op" || e.end_ns <= e.start_ns) continue;
    auto [it, fresh] = kept_until.try_emplace(e.thread, e.end_ns);
    if (!fresh && e.start_ns < it->second) continue;
    it->second = e.end_ns;
    outer_ops[e.thread].push_back(i);
  }
  for (const step_breakdown& s : a.steps) {
    std::array<std::int64_t, 6> cat{};
    for (std::int64_t ns = s.start_ns; ns < s.end_ns; ns += us) {
      int best = 5;
      for (const event& e : t.events) {
        if (!e.on_gpu() || !covers(e, ns)) continue;
        int c = 0;
        if (e.kind == activity::kernel)
          c = t.name_of(e).find("nccl") != std::string_view::npos ? 1 : 0;
        else if (e.kind == activity::memset)
          c = 2;
        else
          c = e.copy == copy_kind::h2d ? 3 : 4;
        best = std::min(best, c);
      }
      ++cat[static_cast<std::size_t>(best)];
      if (best != 5) continue;
      ++x.total_idle;
      for (const std::uint64_t thread : {main_tid, worker_tid}) {
        // The innermost activity: the latest start, then the earliest end, then the later event.
        const event* inner = nullptr;
        for (const event& e : t.events) {
          const bool cpu = e.kind == activity::api || (e.kind == activity::range && e.domain == 0);
          const std::string_view n = t.name_of(e);
          if (!cpu || e.thread != thread || !covers(e, ns) || n == "bench level" ||
              n.starts_with("ProfilerStep#"))
            continue;
          if (inner == nullptr ||
              std::make_tuple(e.start_ns, -e.end_ns) >= std::make_tuple(inner->start_ns, -inner->end_ns))
            inner = &e;
        }
        if (inner != nullptr) {
          const bool blocking = inner->kind == activity::api && inner->sync == sync_kind::stream;
          ++x.idle_by[{thread, std::string(t.name_of(*inner)), blocking}];
          continue;
        }
        for (const std::size_t i : outer_ops[thread])
          if (covers(t.events[i], ns)) ++x.idle_by[{thread, std::string(t.name_of(t.events[i])), false}];
      }
    }
    x.per_step.push_back(cat);
  }
  return x;
}

}  // namespace

TEST(analyze_brute_force, breakdown_and_idle_attribution_match_a_count_of_every_microsecond) {
  int analyzed = 0;
  for (std::uint32_t seed = 1; seed <= 60; ++seed) {
    SCOPED_TRACE(::testing::Message() << "seed " << seed);
    builder b = random_timeline(seed);
    b.t.sort();
    analysis a;
    try {
      a = analyze(b.t, {});
    } catch (const ferry::input_error&) {
      continue;  // no GPU activity inside the steps: refused, as another test checks
    }
    ++analyzed;
    const expected x = count_every_microsecond(b.t, a);
    ASSERT_EQ(a.steps.size(), x.per_step.size());
    for (std::size_t k = 0; k < a.steps.size(); ++k) {
      const step_breakdown& s = a.steps[k];
      const auto& c = x.per_step[k];
      EXPECT_NEAR(s.compute_ms, static_cast<double>(c[0]) / 1000, 1e-9) << "step " << k;
      EXPECT_NEAR(s.comm_ms, static_cast<double>(c[1]) / 1000, 1e-9) << "step " << k;
      EXPECT_NEAR(s.d2d_ms, static_cast<double>(c[2]) / 1000, 1e-9) << "step " << k;
      EXPECT_NEAR(s.h2d_ms, static_cast<double>(c[3]) / 1000, 1e-9) << "step " << k;
      EXPECT_NEAR(s.d2h_ms, static_cast<double>(c[4]) / 1000, 1e-9) << "step " << k;
      EXPECT_NEAR(s.idle_ms, static_cast<double>(c[5]) / 1000, 1e-9) << "step " << k;
    }
    std::map<std::tuple<std::uint64_t, std::string, bool>, std::int64_t> got;
    for (const idle_attribution& i : a.idle)
      got[{i.thread_id, i.activity, i.blocking}] = static_cast<std::int64_t>(i.idle_ms * 1000 + 0.5);
    EXPECT_EQ(got, x.idle_by);
  }
  EXPECT_GE(analyzed, 50);
}
