// Hand-built timelines for the analyzer's tests: times in microseconds, so expected numbers can be checked
// by hand.
#pragma once

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <string_view>

#include "ferry/analyze/analyze.hpp"
#include "ferry/trace/timeline.hpp"

namespace ferry::trace::test_traces {

inline constexpr std::int64_t us = 1000;
inline constexpr std::uint64_t main_tid = 100;
inline constexpr std::uint64_t worker_tid = 200;

// Builds timelines event by event; times in microseconds.
struct builder {
  timeline t;
  builder() {
    t.source = "test";
    t.device_name = "test gpu";
    t.thread_names[main_tid] = "main";
  }
  event& add(activity kind, std::string_view name, double start_us, double end_us) {
    event e;
    e.kind = kind;
    e.name = t.strings.intern(name);
    e.start_ns = static_cast<std::int64_t>(start_us * us);
    e.end_ns = static_cast<std::int64_t>(end_us * us);
    t.events.push_back(e);
    return t.events.back();
  }
  event& kernel(double s, double e, std::uint64_t stream = 7, std::string_view name = "gemm") {
    event& k = add(activity::kernel, name, s, e);
    k.device = 0;
    k.stream = stream;
    return k;
  }
  event& copy(copy_kind dir, double s, double e, std::uint64_t bytes, mem_kind host, bool async,
              std::uint64_t stream = 7) {
    event& c = add(activity::memcpy, "memcpy", s, e);
    c.device = 0;
    c.stream = stream;
    c.copy = dir;
    c.bytes = bytes;
    c.async = async;
    c.src = dir == copy_kind::h2d ? host : mem_kind::device;
    c.dst = dir == copy_kind::d2h ? host : mem_kind::device;
    return c;
  }
  event& range(std::string_view name, double s, double e, std::uint64_t thread = main_tid) {
    event& r = add(activity::range, name, s, e);
    r.thread = thread;
    return r;
  }
  event& api(std::string_view name, double s, double e, sync_kind sync = sync_kind::none,
             std::uint64_t thread = main_tid) {
    event& a = add(activity::api, name, s, e);
    a.thread = thread;
    a.sync = sync;
    return a;
  }
  // `n` steps of `period` us named `name` on the main thread, starting at 0.
  void steps(int n, double period, std::string_view name = "ProfilerStep#") {
    for (int i = 0; i < n; ++i)
      range(name == "ProfilerStep#" ? fmt::format("ProfilerStep#{}", i) : std::string(name), i * period,
            (i + 1) * period);
  }
  analysis run(const analyze_options& o = {}) {
    t.sort();
    return analyze(t, o);
  }
};

inline const finding* find_rule(const analysis& a, std::string_view rule) {
  for (const finding& f : a.findings)
    if (f.rule == rule) return &f;
  return nullptr;
}

// A compute-bound base: 4 steps of 1000 us with 950 us of kernels each.
inline builder busy_steps(int n = 4) {
  builder b;
  b.steps(n, 1000);
  for (int i = 0; i < n; ++i) b.kernel(i * 1000 + 25, i * 1000 + 975);
  return b;
}

// Data-parallel steps of 1000 us: forward (0..300) and backward (300..800) kernels on the compute stream 7,
// an all-reduce kernel on stream 9 from `comm_start` to `comm_end` us into each step, and the optimizer's
// kernel (40 us), which waits for the backward and the all-reduce.
inline builder ddp_steps(double comm_start, double comm_end, int n = 4) {
  builder b;
  b.steps(n, 1000);
  b.t.stream_names[7] = "compute";
  b.t.stream_names[9] = "comm";
  for (int i = 0; i < n; ++i) {
    const double t0 = i * 1000.0;
    b.kernel(t0, t0 + 300, 7, "forward");
    b.kernel(t0 + 300, t0 + 800, 7, "backward");
    b.kernel(t0 + comm_start, t0 + comm_end, 9, "ncclDevKernel_AllReduce_Sum_f32_RING_LL");
    const double opt = t0 + std::max(800.0, comm_end);
    b.kernel(opt, opt + 40, 7, "optimizer");
  }
  return b;
}

/// A file of the tests' trace data: tests/<folder>/data/<name>.
inline std::filesystem::path test_data(std::string_view folder, std::string_view name) {
  return std::filesystem::path(FERRY_TESTS_DIR) / folder / "data" / name;
}

}  // namespace ferry::trace::test_traces
