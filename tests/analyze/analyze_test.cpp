// The analyzer on hand-built timelines (times in microseconds below, so the expected numbers can be
// checked by hand), and on the two PyTorch profiler fixtures recorded on an H200.
#include "ferry/analyze/analyze.hpp"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "analyze/builder.hpp"
#include "ferry/core/error.hpp"
#include "ferry/trace/trace_io.hpp"
#include "support/test_support.hpp"

using namespace ferry::trace;
using namespace ferry::trace::test_traces;

namespace {

// ---- steps ----

TEST(analyze_steps, profiler_steps_win_over_ferry_steps_and_gpu_track_copies_are_ignored) {
  builder b;
  b.steps(3, 100);
  b.range("step", 0, 300);  // ferry's name, ignored while ProfilerStep# spans exist
  event& gpu_dup = b.range("ProfilerStep#9", 0, 50, 0);
  gpu_dup.device = 0;  // a GPU-track annotation: device, no thread
  b.kernel(10, 90);
  const analysis a = b.run();
  EXPECT_EQ(a.step_prefix, "ProfilerStep#");
  ASSERT_EQ(a.steps.size(), 3u);
  EXPECT_DOUBLE_EQ(a.steps[0].wall_ms, 0.1);
  EXPECT_EQ(a.main_thread, "main");
}

TEST(analyze_steps, ferry_default_takes_step_and_step_n_but_not_step_underscore) {
  builder b;
  b.range("step", 0, 100);
  b.range("step 2", 100, 200);
  b.range("step_x", 200, 300);
  b.range("train step", 200, 300);
  b.kernel(10, 290);
  const analysis a = b.run();
  EXPECT_EQ(a.step_prefix, "step");
  ASSERT_EQ(a.steps.size(), 2u);
  // The last step extends to the end of the GPU work queued in the trace.
  EXPECT_DOUBLE_EQ(a.steps[1].wall_ms, 0.19);
}

TEST(analyze_steps, an_explicit_prefix_is_used) {
  builder b;
  b.range("iter 0", 0, 100);
  b.range("iter 1", 100, 200);
  b.range("step", 0, 200);
  b.kernel(10, 190);
  analyze_options o;
  o.step_prefix = "iter";
  const analysis a = b.run(o);
  EXPECT_EQ(a.step_prefix, "iter");
  EXPECT_EQ(a.steps.size(), 2u);
}

TEST(analyze_steps, without_steps_the_gpu_span_is_one_step) {
  builder b;
  b.kernel(100, 200);
  b.kernel(300, 400);
  b.api("cudaLaunchKernel", 90, 95);
  const analysis a = b.run();
  EXPECT_EQ(a.step_prefix, "");
  ASSERT_EQ(a.steps.size(), 1u);
  EXPECT_DOUBLE_EQ(a.steps[0].wall_ms, 0.3);
  EXPECT_DOUBLE_EQ(a.steps[0].idle_ms, 0.1);
  EXPECT_EQ(a.main_thread, "main");  // the thread issuing the API calls
}

// The CPU runs ahead of the GPU (ingest L3 with a deep launch queue): each 100 us step span launches the
// next batch's copy on its own stream, which runs at once, and three 100 us kernels that queue behind the
// kernels of earlier steps, so they run 800 us after their launch. The trace holds the last of those
// earlier kernels (500..800 us), linked to no call of a step: launched before the first span (`how`
// "before"), or with no call in the trace at all (launched before recording began, `how` "unrecorded").
builder cpu_runs_ahead(std::string_view how) {
  builder b;
  b.steps(3, 100);
  std::uint64_t correlation = 1;
  const auto launch = [&](std::string_view call, double at) {
    b.api(call, at, at + 2).correlation = correlation;
    return correlation++;
  };
  for (int j = 0; j < 3; ++j) {
    const std::uint64_t c = how == "before" ? launch("cudaLaunchKernel", -60 + 10 * j) : 0;
    b.kernel(500 + 100 * j, 600 + 100 * j).correlation = c;
  }
  for (int i = 0; i < 3; ++i) {
    const double t0 = 100.0 * i;
    const std::uint64_t c = launch("cudaMemcpyAsync", t0 + 10);
    b.copy(copy_kind::h2d, t0 + 12, t0 + 22, 1 << 20, mem_kind::pinned, true, 13).correlation = c;
    for (int j = 0; j < 3; ++j) {
      const std::uint64_t k = launch("cudaLaunchKernel", t0 + 20 + 10 * j);
      b.kernel(800 + 300 * i + 100 * j, 900 + 300 * i + 100 * j).correlation = k;
    }
  }
  b.api("cudaDeviceSynchronize", 300, 1700, sync_kind::device);
  return b;
}

TEST(analyze_steps, when_the_cpu_runs_ahead_each_step_starts_with_its_first_work_that_does_not_run_ahead) {
  for (const std::string_view how : {"before", "unrecorded"}) {
    SCOPED_TRACE(how);
    const analysis a = cpu_runs_ahead(how).run();
    ASSERT_EQ(a.steps.size(), 3u);
    for (std::size_t k = 0; k < 3; ++k) {
      // The step's kernels, not its copy of the next batch (which ran 800 us earlier).
      EXPECT_EQ(a.steps[k].start_ns, static_cast<std::int64_t>(800 + 300 * k) * us) << "step " << k;
      EXPECT_EQ(a.steps[k].end_ns, static_cast<std::int64_t>(1100 + 300 * k) * us) << "step " << k;
      EXPECT_DOUBLE_EQ(a.steps[k].compute_ms, 0.3);
      EXPECT_DOUBLE_EQ(a.steps[k].idle_ms, 0);
      EXPECT_EQ(a.steps[k].h2d_bytes, 1u << 20) << "the copy counts in the step that launched it";
    }
    EXPECT_EQ(a.bottleneck(), "compute_bound") << format_text(a);
    EXPECT_EQ(find_rule(a, "gpu_idle"), nullptr);
  }
}

TEST(analyze_steps, without_run_ahead_each_step_starts_with_the_first_gpu_work_its_span_launched) {
  // Each step: a blocking copy, then a kernel; the copy of step k + 1 starts after the kernel of step k.
  builder b;
  b.steps(3, 100);
  std::uint64_t correlation = 1;
  for (int i = 0; i < 3; ++i) {
    const double t0 = 100.0 * i;
    b.api("cudaMemcpy", t0 + 30, t0 + 45, sync_kind::copy).correlation = correlation;
    b.copy(copy_kind::h2d, t0 + 32, t0 + 44, 4096, mem_kind::pageable, false).correlation = correlation++;
    b.api("cudaLaunchKernel", t0 + 46, t0 + 48).correlation = correlation;
    b.kernel(t0 + 50, t0 + 120).correlation = correlation++;
  }
  const analysis a = b.run();
  ASSERT_EQ(a.steps.size(), 3u);
  for (std::size_t k = 0; k < 3; ++k) {
    EXPECT_EQ(a.steps[k].start_ns, static_cast<std::int64_t>(32 + 100 * k) * us) << "step " << k;
    EXPECT_EQ(a.steps[k].h2d_bytes, 4096u);
  }
  EXPECT_EQ(a.steps[2].end_ns, 320 * us) << "the last step ends with the work it launched";
}

TEST(analyze_steps, a_timeline_without_gpu_activity_is_refused_naming_what_it_holds) {
  builder b;
  b.range("step", 0, 100);
  b.api("cudaStreamSynchronize", 10, 20, sync_kind::stream);
  const std::string msg = ferry::testing::message_of<ferry::input_error>([&] { (void)b.run(); });
  EXPECT_MESSAGE_HAS(msg, "no GPU activity");
  EXPECT_MESSAGE_HAS(msg, "2 events (1 API calls, 0 syncs, 1 ranges");
  const timeline empty;
  EXPECT_MESSAGE_HAS(ferry::testing::message_of<ferry::input_error>([&] { (void)analyze(empty); }),
                     "holds 0 events");
}

TEST(analyze_steps, gpu_events_of_zero_length_outside_the_steps_are_refused_not_read_past_the_end) {
  builder b;
  b.range("step", 0, 100);
  b.kernel(200, 200);  // no length: covers no time, so the GPU's busy span is empty
  const std::string msg = ferry::testing::message_of<ferry::input_error>([&] { (void)b.run(); });
  EXPECT_MESSAGE_HAS(msg, "none inside its 1 'step' step spans");
  EXPECT_MESSAGE_HAS(msg, "all of zero length");
}

TEST(analyze_steps, bad_options_are_refused) {
  builder b = busy_steps();
  analyze_options o;
  o.idle_threshold = 1.5;
  EXPECT_THROW((void)b.run(o), ferry::logic_error);
}

// ---- breakdown ----

TEST(analyze_breakdown, categories_are_exclusive_in_priority_order) {
  builder b;
  b.range("ProfilerStep#0", 0, 100);
  b.kernel(10, 50);                                                 // compute 40
  b.copy(copy_kind::h2d, 40, 60, 1000, mem_kind::pinned, true, 8);  // 10 under the kernel, 10 alone
  b.copy(copy_kind::d2h, 70, 80, 500, mem_kind::pinned, true, 8);   // d2h 10
  event& ms = b.add(activity::memset, "memset", 80, 85);            // d2d 5
  ms.device = 0;
  b.kernel(85, 90, 9, "ncclDevKernel_AllReduce");                // comm 5
  b.copy(copy_kind::h2d, 88, 92, 0, mem_kind::pinned, true, 8);  // 2 under comm, 2 alone
  const analysis a = b.run();
  ASSERT_EQ(a.steps.size(), 1u);
  const step_breakdown& s = a.steps[0];
  EXPECT_DOUBLE_EQ(s.wall_ms, 0.100);
  EXPECT_DOUBLE_EQ(s.compute_ms, 0.040);
  EXPECT_DOUBLE_EQ(s.comm_ms, 0.005);
  EXPECT_DOUBLE_EQ(s.d2d_ms, 0.005);
  EXPECT_DOUBLE_EQ(s.h2d_ms, 0.012);
  EXPECT_DOUBLE_EQ(s.d2h_ms, 0.010);
  EXPECT_DOUBLE_EQ(s.idle_ms, 0.028);
  EXPECT_DOUBLE_EQ(s.utilization, 0.72);
  // Copies ran 34 us, 12 of them while a kernel ran.
  EXPECT_DOUBLE_EQ(s.copy_overlap, 12.0 / 34.0);
  EXPECT_EQ(s.h2d_bytes, 1000u);
  EXPECT_EQ(s.d2h_bytes, 500u);
  EXPECT_EQ(a.mean.index, -1);
  EXPECT_DOUBLE_EQ(a.mean.idle_ms, 0.028);
}

TEST(analyze_breakdown, communication_kernels_count_as_comm_whatever_the_case_of_nccl) {
  builder b;
  b.range("ProfilerStep#0", 0, 100);
  b.kernel(0, 10, 7, "ncclDevKernel_AllReduce");  // NCCL's own spelling
  b.kernel(10, 30, 7, "NCCL AllGather");          // a profiler's annotation of it
  b.kernel(30, 60, 7, "nCcL_custom_reduce");      // any case
  b.kernel(60, 100, 7, "gemm_nc_cl");             // not the word: compute
  const analysis a = b.run();
  EXPECT_DOUBLE_EQ(a.steps[0].comm_ms, 0.060);
  EXPECT_DOUBLE_EQ(a.steps[0].compute_ms, 0.040);
}

TEST(analyze_breakdown, events_are_clipped_to_steps_and_averaged) {
  builder b;
  b.steps(2, 100);
  b.kernel(50, 150);  // half in each step
  const analysis a = b.run();
  ASSERT_EQ(a.steps.size(), 2u);
  EXPECT_DOUBLE_EQ(a.steps[0].compute_ms, 0.05);
  EXPECT_DOUBLE_EQ(a.steps[1].compute_ms, 0.05);
  EXPECT_DOUBLE_EQ(a.mean.idle_ms, 0.05);
  EXPECT_DOUBLE_EQ(a.mean.utilization, 0.5);
}

// ---- idle attribution ----

TEST(analyze_idle, attribution_takes_the_innermost_activity_of_each_thread) {
  builder b;
  b.steps(1, 1000);
  b.kernel(900, 1000);
  b.range("prepare", 0, 800);
  b.range("decode", 100, 300);                                              // inside "prepare"
  b.api("cudaStreamSynchronize", 850, 880, sync_kind::stream);              // blocking, idle 850..880
  b.range("pytorch op", 0, 900).domain = b.t.strings.intern("pytorch.op");  // only where nothing else is
  b.range("bench level", 0, 1000);                                          // covers everything: skipped
  b.range("worker job", 0, 400, worker_tid);
  const analysis a = b.run();
  ASSERT_GE(a.idle.size(), 5u);
  EXPECT_DOUBLE_EQ(a.mean.idle_ms, 0.9);
  EXPECT_EQ(a.idle[0].activity, "prepare");  // 0..100 and 300..800
  EXPECT_DOUBLE_EQ(a.idle[0].idle_ms, 0.6);
  EXPECT_TRUE(a.idle[0].main_thread);
  EXPECT_DOUBLE_EQ(a.idle[0].fraction_of_idle, 0.6 / 0.9);
  EXPECT_EQ(a.idle[1].activity, "worker job");
  EXPECT_EQ(a.idle[1].thread, fmt::format("thread {}", worker_tid));
  EXPECT_FALSE(a.idle[1].main_thread);
  EXPECT_EQ(a.idle[2].activity, "decode");
  EXPECT_DOUBLE_EQ(a.idle[2].idle_ms, 0.2);
  // A profiler operator counts only where no annotation or call of its thread covers the idle:
  // 800..850 and 880..900.
  EXPECT_EQ(a.idle[3].activity, "pytorch op");
  EXPECT_DOUBLE_EQ(a.idle[3].idle_ms, 0.07);
  EXPECT_EQ(a.idle[4].activity, "cudaStreamSynchronize");
  EXPECT_TRUE(a.idle[4].blocking);
  EXPECT_DOUBLE_EQ(a.idle[4].idle_ms, 0.03);
  for (const idle_attribution& x : a.idle) {
    EXPECT_NE(x.activity, "bench level");
    EXPECT_NE(x.activity, "ProfilerStep#0");
  }
}

// ---- rules ----

// Naive ingest: the main thread makes each batch (600 us) while the GPU idles, then a pageable async copy
// (100 us) + stream sync, then 250 us of kernels.
builder naive_ingest(std::string_view cpu_work = "make batch") {
  builder b;
  b.steps(4, 1000);
  for (int i = 0; i < 4; ++i) {
    const double t0 = i * 1000.0;
    b.range(cpu_work, t0, t0 + 600);
    b.api("cudaMemcpyAsync", t0 + 600, t0 + 700);
    b.copy(copy_kind::h2d, t0 + 600, t0 + 700, 4'000'000, mem_kind::pageable, true);
    b.api("cudaStreamSynchronize", t0 + 700, t0 + 710, sync_kind::stream);
    b.kernel(t0 + 720, t0 + 970);
  }
  return b;
}

TEST(analyze_rules, gpu_idle_names_the_main_threads_activity_and_its_fix) {
  const analysis a = naive_ingest().run();
  EXPECT_EQ(a.bottleneck(), "gpu_idle");
  const finding& f = a.findings.front();
  EXPECT_DOUBLE_EQ(f.cost_ms_per_step, 0.65);  // 0..600, 700..720, 970..1000
  EXPECT_DOUBLE_EQ(f.numbers.at("idle_fraction"), 0.65);
  EXPECT_DOUBLE_EQ(f.numbers.at("attributed_ms_per_step"), 0.6);
  EXPECT_EQ(f.title, "GPU idle 65% of each step while the main thread is in 'make batch'");
  EXPECT_NE(f.fix.find("ferry::ingest::loader"), std::string::npos) << f.fix;
  EXPECT_NE(find_rule(a, "pageable_async_copy"), nullptr);

  const analysis out = naive_ingest("process output").run();
  EXPECT_NE(out.findings.front().fix.find("ferry::egress::pipeline's sinks"), std::string::npos);
}

// A launch-bound PyTorch step: forward launches 5 us kernels from the main thread, then backward launches
// them from the autograd engine's thread while the main thread waits on a condition variable. As in a real
// recording, the engine thread's launch calls are short (3 us of every 30: its work between them is not
// recorded) and it waits on its own condition variable while the main thread runs forward. With
// `autograd_launches` false that thread recorded no launch; with `autograd_asleep` it waits through the
// main thread's wait too (it does not run the work the main thread waits for).
builder backward_on_another_thread(bool autograd_launches,
                                   std::string_view wait = "pthread_cond_wait (libstdc++.so.6)",
                                   bool autograd_asleep = false, double launch_period = 30) {
  constexpr std::uint64_t autograd_tid = 300;
  builder b;
  b.t.thread_processes[main_tid] = main_tid;
  b.t.thread_processes[autograd_tid] = main_tid;
  b.t.thread_names[autograd_tid] = "pt_autograd_0";
  b.steps(4, 1000);
  for (int i = 0; i < 4; ++i) {
    const double t0 = i * 1000.0;
    for (double l = t0; l + 30 <= t0 + 300; l += 30) {
      b.api("cudaLaunchKernel", l, l + 20);
      b.kernel(l + 20, l + 25);
    }
    b.range("pthread_cond_wait (libstdc++.so.6)", t0, t0 + 300, autograd_tid);
    b.range(wait, t0 + 300, t0 + 990);
    if (autograd_asleep) b.range("pthread_cond_wait (libstdc++.so.6)", t0 + 300, t0 + 990, autograd_tid);
    for (double l = t0 + 300; l + 30 <= t0 + 990; l += 30) {
      if (autograd_launches && std::fmod(l - t0 - 300, launch_period) == 0)
        b.api("cudaLaunchKernel", l, l + 3, sync_kind::none, autograd_tid);
      b.kernel(l + 20, l + 25);
    }
  }
  return b;
}

TEST(analyze_rules, gpu_idle_names_the_thread_the_main_thread_waits_for) {
  analyze_options o;
  o.wording = fix_wording::pytorch;
  const analysis a = backward_on_another_thread(true).run(o);
  ASSERT_EQ(a.bottleneck(), "gpu_idle");
  const finding& f = a.findings.front();
  EXPECT_EQ(
      f.title,
      "GPU idle 84% of each step while the main thread waits in 'pthread_cond_wait (libstdc++.so.6)' for "
      "thread pt_autograd_0, which launches the GPU's work");
  EXPECT_NE(f.evidence.find("thread pt_autograd_0 was awake (in no wait of its own) through 100% of the idle "
                            "inside those waits and launched 23 calls per step in them (its most covering: "
                            "'cudaLaunchKernel'"),
            std::string::npos)
      << f.evidence;
  EXPECT_EQ(f.cause, "launch");
  EXPECT_TRUE(f.fix.find("CUDA graphs") != std::string::npos &&
              f.fix.find("autograd engine") != std::string::npos)
      << f.fix;
  // The wait is not host work of its own: host_bound does not count it.
  EXPECT_EQ(find_rule(a, "host_bound"), nullptr);

  // Without the other thread's launches the wait is all the trace shows, and is named.
  const std::string waits =
      "GPU idle 84% of each step while the main thread is in 'pthread_cond_wait (libstdc++.so.6)'";
  const analysis alone = backward_on_another_thread(false).run(o);
  EXPECT_EQ(alone.findings.front().title, waits);
  EXPECT_NE(find_rule(alone, "host_bound"), nullptr);
  // Nor when the other thread launches seldom (one launch a step: a producer whose CPU work, which the
  // trace does not name, bounds the GPU; 600 us between launches, against 200 us at most).
  EXPECT_EQ(backward_on_another_thread(true, "pthread_cond_wait (libstdc++.so.6)", false, 1000)
                .run(o)
                .findings.front()
                .title,
            waits);
  // Nor when the launching thread sleeps through the main thread's wait too.
  EXPECT_EQ(backward_on_another_thread(true, "pthread_cond_wait (libstdc++.so.6)", true)
                .run(o)
                .findings.front()
                .title,
            waits);

  // A wait for other processes (a DataLoader's queue) is the main thread's own, whatever else launches.
  const analysis polled = backward_on_another_thread(true, "poll (python3)").run(o);
  EXPECT_EQ(polled.findings.front().title,
            "GPU idle 84% of each step while the main thread is in 'poll (python3)'");
  EXPECT_NE(find_rule(polled, "host_bound"), nullptr);
  // Nor is the main thread waiting for a thread of another process.
  builder other = backward_on_another_thread(true);
  other.t.thread_processes[300] = 999;
  EXPECT_EQ(other.run(o).findings.front().title, waits);
}

TEST(analyze_rules, gpu_idle_stays_quiet_at_the_threshold) {
  builder b = busy_steps();  // 50 of 1000 us idle: 5%
  EXPECT_EQ(find_rule(b.run(), "gpu_idle"), nullptr);
  analyze_options o;
  o.idle_threshold = 0.04;
  EXPECT_NE(find_rule(b.run(o), "gpu_idle"), nullptr);
}

TEST(analyze_rules, pageable_async_copy_counts_bytes_and_cost_against_the_link) {
  builder b = naive_ingest();
  b.t.link_h2d_gbps = 50;  // 4 MB at 50 GB/s: 80 us; the copies took 100 us
  const analysis a = b.run();
  const finding* f = find_rule(a, "pageable_async_copy");
  ASSERT_NE(f, nullptr);
  EXPECT_DOUBLE_EQ(f->numbers.at("count_per_step"), 1);
  EXPECT_DOUBLE_EQ(f->numbers.at("h2d_bytes_per_step"), 4e6);
  EXPECT_DOUBLE_EQ(f->numbers.at("h2d_gbps"), 40);
  EXPECT_NEAR(f->cost_ms_per_step, 0.02, 1e-12);
  EXPECT_NE(f->evidence.find("40.0 GB/s"), std::string::npos) << f->evidence;
  // Without a link: 3/4 of the copy time.
  EXPECT_NEAR(find_rule(naive_ingest().run(), "pageable_async_copy")->cost_ms_per_step, 0.075, 1e-12);
}

TEST(analyze_rules, pinned_async_copies_are_not_pageable) {
  builder b = busy_steps();
  b.copy(copy_kind::h2d, 0, 25, 1 << 20, mem_kind::pinned, true, 8);
  EXPECT_EQ(find_rule(b.run(), "pageable_async_copy"), nullptr);
}

// Blocking pageable copies (no CPU work to speak of): 300 us copy, then 650 us of kernels.
builder blocking_copies(bool async_and_sync) {
  builder b;
  b.steps(4, 1000);
  for (int i = 0; i < 4; ++i) {
    const double t0 = i * 1000.0;
    if (async_and_sync) {
      b.copy(copy_kind::h2d, t0 + 10, t0 + 310, 1'000'000, mem_kind::pinned, true);
      b.api("cudaStreamSynchronize", t0 + 5, t0 + 330, sync_kind::stream);  // 20 us after the copy
    } else {
      b.copy(copy_kind::h2d, t0 + 10, t0 + 310, 1'000'000, mem_kind::pageable, false);
      b.api("cudaMemcpy", t0 + 5, t0 + 330, sync_kind::copy);
    }
    b.kernel(t0 + 340, t0 + 990);
  }
  return b;
}

TEST(analyze_rules, sync_copy_leads_for_blocking_copies) {
  for (bool async_and_sync : {false, true}) {
    SCOPED_TRACE(async_and_sync);
    const analysis a = blocking_copies(async_and_sync).run();
    EXPECT_EQ(a.bottleneck(), "sync_copy") << format_text(a);
    const finding& f = a.findings.front();
    // 300 us of copy no kernel overlapped + 20 us the GPU idled while the CPU still waited.
    EXPECT_DOUBLE_EQ(f.cost_ms_per_step, 0.32);
    EXPECT_DOUBLE_EQ(f.numbers.at("count_per_step"), 1);
    EXPECT_DOUBLE_EQ(f.numbers.at("blocked_ms_per_step"), 0.325);
    EXPECT_DOUBLE_EQ(f.numbers.at("h2d_bytes_per_step"), 1e6);
  }
}

TEST(analyze_rules, sync_copy_needs_the_wait_to_hold_back_the_launch) {
  builder late = blocking_copies(true);  // the wait ends 20 us after the copy; move it 100 us later
  for (event& e : late.t.events)
    if (e.kind == activity::api) e.end_ns += 80 * us;
  EXPECT_EQ(find_rule(late.run(), "sync_copy"), nullptr);
  builder overlapped = blocking_copies(true);  // the next kernel starts before the wait returns
  for (event& e : overlapped.t.events)
    if (e.kind == activity::kernel) e.start_ns -= 30 * us;
  EXPECT_EQ(find_rule(overlapped.run(), "sync_copy"), nullptr);
}

TEST(analyze_rules, device_sync_in_half_the_steps) {
  builder b = busy_steps();
  b.api("cudaDeviceSynchronize", 960, 1000, sync_kind::device);  // idle 975..1000: 25 us
  b.api("cudaDeviceSynchronize", 2960, 3000, sync_kind::device);
  const analysis a = b.run();
  const finding* f = find_rule(a, "device_sync");
  ASSERT_NE(f, nullptr);
  EXPECT_DOUBLE_EQ(f->numbers.at("steps_with_sync"), 2);
  EXPECT_DOUBLE_EQ(f->numbers.at("count_per_step"), 0.5);
  EXPECT_DOUBLE_EQ(f->cost_ms_per_step, 0.0125);
  EXPECT_EQ(a.bottleneck(), "compute_bound");  // 12.5 us of a 1 ms step is not what bounds it
}

TEST(analyze_rules, device_sync_in_one_of_four_steps_is_quiet) {
  builder b = busy_steps();
  b.api("cudaDeviceSynchronize", 960, 1000, sync_kind::device);
  EXPECT_EQ(find_rule(b.run(), "device_sync"), nullptr);
}

// Pinned async copy on the compute stream, then the kernels: 200 us of copy per 1000 us step.
builder serialized(std::uint64_t copy_stream) {
  builder b;
  b.steps(4, 1000);
  b.t.stream_names[7] = "compute";
  for (int i = 0; i < 4; ++i) {
    const double t0 = i * 1000.0;
    b.copy(copy_kind::h2d, t0 + 10, t0 + 210, 8'000'000, mem_kind::pinned, true, copy_stream);
    b.kernel(t0 + 210, t0 + 990);
  }
  return b;
}

TEST(analyze_rules, serialized_copy_leads_for_copies_on_the_compute_stream) {
  const analysis a = serialized(7).run();
  EXPECT_EQ(a.bottleneck(), "serialized_copy") << format_text(a);
  const finding& f = a.findings.front();
  EXPECT_DOUBLE_EQ(f.cost_ms_per_step, 0.2);
  EXPECT_DOUBLE_EQ(f.numbers.at("stream"), 7);
  EXPECT_DOUBLE_EQ(f.numbers.at("copy_overlap"), 0);
  EXPECT_NE(f.evidence.find("stream 7 ('compute')"), std::string::npos) << f.evidence;
}

TEST(analyze_rules, serialized_copy_is_quiet_when_copies_overlap_or_have_their_own_stream) {
  EXPECT_EQ(find_rule(serialized(8).run(), "serialized_copy"), nullptr);
  builder b = serialized(7);
  b.kernel(0, 40, 9);  // a kernel on another stream covers 30 of the 200 us copy: 15% overlap
  b.kernel(1000, 1040, 9);
  b.kernel(2000, 2040, 9);
  b.kernel(3000, 3040, 9);
  EXPECT_EQ(find_rule(b.run(), "serialized_copy"), nullptr);
}

TEST(analyze_rules, exposed_comm_costs_the_all_reduce_that_runs_after_backward) {
  // One bucket after backward: the all-reduce (800..950) starts when the backward ends; nothing hides it.
  const analysis a = ddp_steps(800, 950).run();
  EXPECT_EQ(a.bottleneck(), "exposed_comm") << format_text(a);
  const finding& f = a.findings.front();
  EXPECT_DOUBLE_EQ(f.cost_ms_per_step, 0.15);
  EXPECT_DOUBLE_EQ(f.numbers.at("comm_ms_per_step"), 0.15);
  EXPECT_DOUBLE_EQ(f.numbers.at("hidden_fraction"), 0);
  EXPECT_DOUBLE_EQ(f.numbers.at("longest_exposed_ms_per_step"), 0.15);
  EXPECT_DOUBLE_EQ(f.numbers.at("comm_per_step"), 1);
  EXPECT_DOUBLE_EQ(a.mean.comm_ms, 0.15);  // the breakdown's exclusive comm time is the cost
  EXPECT_EQ(find_rule(a, "gpu_idle"), nullptr) << format_text(a);  // the GPU communicates: not idle
  // Nothing hidden: the all-reduce starts too late, so the bucket plan comes first, then codec and link.
  EXPECT_TRUE(f.fix.starts_with("start the all-reduce while backward still runs: smaller gradient buckets"))
      << f.fix;
  EXPECT_NE(f.fix.find("bf16 or fp16"), std::string::npos) << f.fix;
  EXPECT_NE(f.fix.find("NCCL_P2P_DISABLE=1"), std::string::npos) << f.fix;
  EXPECT_NE(f.fix.find("`ferry probe`"), std::string::npos) << f.fix;
}

TEST(analyze_rules, exposed_comm_counts_only_what_backward_did_not_hide) {
  // Buckets launched during backward (500..850): 300 of the 350 us run beside the backward's kernels.
  const analysis a = ddp_steps(500, 850).run();
  const finding* f = find_rule(a, "exposed_comm");
  ASSERT_NE(f, nullptr) << format_text(a);
  EXPECT_DOUBLE_EQ(f->cost_ms_per_step, 0.05);
  EXPECT_DOUBLE_EQ(f->numbers.at("comm_ms_per_step"), 0.35);
  EXPECT_DOUBLE_EQ(f->numbers.at("hidden_fraction"), 300.0 / 350.0);
  EXPECT_NE(f->evidence.find("hid 86% of it"), std::string::npos) << f->evidence;
  // Mostly hidden yet longer than the backward: fewer bytes (a codec) or a faster link come first.
  EXPECT_TRUE(f->fix.starts_with("halve the bytes on the wire with a 16-bit codec")) << f->fix;
  EXPECT_NE(f->fix.find("smaller gradient buckets"), std::string::npos) << f->fix;
}

TEST(analyze_rules, exposed_comm_is_quiet_when_backward_hides_the_all_reduce) {
  const analysis hidden = ddp_steps(400, 780).run();
  EXPECT_EQ(find_rule(hidden, "exposed_comm"), nullptr) << format_text(hidden);
  EXPECT_DOUBLE_EQ(hidden.mean.comm_ms, 0);
  // 5 us of 1000 alone is below 1% of the step: a barrier's worth, not a finding.
  EXPECT_EQ(find_rule(ddp_steps(700, 805).run(), "exposed_comm"), nullptr);
  // Without communication there is nothing to expose.
  EXPECT_EQ(find_rule(busy_steps().run(), "exposed_comm"), nullptr);
}

TEST(analyze_rules, exposed_comm_counts_an_all_reduce_that_keeps_the_next_forward_waiting) {
  // The all-reduce (900..1100) outlasts the step; the next forward starts only when it ends.
  builder b;
  b.steps(4, 1000);
  for (int i = 0; i < 4; ++i) {
    const double t0 = i * 1000.0;
    b.kernel(t0 + 100, t0 + 400, 7, "forward");
    b.kernel(t0 + 400, t0 + 900, 7, "backward");
    b.kernel(t0 + 900, t0 + 1100, 9, "ncclDevKernel_AllReduce_Sum_f32_RING_LL");
  }
  const analysis a = b.run();
  const finding* f = find_rule(a, "exposed_comm");
  ASSERT_NE(f, nullptr) << format_text(a);
  // 800 us alone over 4 steps, whichever step each piece falls in (the last step runs to 4100).
  EXPECT_DOUBLE_EQ(f->cost_ms_per_step, 0.2);
  // Longest stretch alone per step: 100, 100, 100 and 200 (3900..4100).
  EXPECT_DOUBLE_EQ(f->numbers.at("longest_exposed_ms_per_step"), 0.125);
  EXPECT_DOUBLE_EQ(f->numbers.at("hidden_fraction"), 0);
}

TEST(analyze_rules, low_copy_bandwidth_against_the_link) {
  builder b = serialized(8);
  analyze_options o;
  o.link_h2d_gbps = 100;  // 8 MB in 200 us is 40 GB/s: below half of 100
  const analysis a = b.run(o);
  const finding* f = find_rule(a, "low_copy_bandwidth");
  ASSERT_NE(f, nullptr);
  EXPECT_DOUBLE_EQ(f->numbers.at("achieved_gbps"), 40);
  EXPECT_DOUBLE_EQ(f->numbers.at("link_gbps"), 100);
  EXPECT_DOUBLE_EQ(f->cost_ms_per_step, 0.12);  // 200 us - 8 MB / 100 GB/s
  EXPECT_NE(f->evidence.find("pinned -> device x4"), std::string::npos) << f->evidence;
  o.link_h2d_gbps = 79;  // 40 is above half of 79
  EXPECT_EQ(find_rule(b.run(o), "low_copy_bandwidth"), nullptr);
  EXPECT_EQ(find_rule(b.run(), "low_copy_bandwidth"), nullptr);  // no link known
}

TEST(analyze_rules, pageable_async_copy_leads_when_the_issuing_call_blocks) {
  // Egress L3/L4 with a pool that is not pinned: the async copy blocks in its own call; no later wait.
  builder b;
  b.steps(4, 1000);
  b.t.link_d2h_gbps = 50;
  for (int i = 0; i < 4; ++i) {
    const double t0 = i * 1000.0;
    b.kernel(t0 + 5, t0 + 700);
    b.api("cudaMemcpyAsync", t0 + 10, t0 + 990, sync_kind::copy);
    b.copy(copy_kind::d2h, t0 + 700, t0 + 985, 4'000'000, mem_kind::pageable, true, 8);
  }
  const analysis a = b.run();
  EXPECT_EQ(a.bottleneck(), "pageable_async_copy") << format_text(a);
  EXPECT_EQ(find_rule(a, "sync_copy"), nullptr);
  EXPECT_DOUBLE_EQ(a.findings.front().cost_ms_per_step, 0.205);  // 285 us - 80 us at the link
}

TEST(analyze_rules, compute_bound_leads_when_nothing_costs_five_percent) {
  builder b = busy_steps();
  b.copy(copy_kind::h2d, 100, 400, 8'000'000, mem_kind::pinned, true, 8);  // hidden under kernels
  const analysis a = b.run();
  ASSERT_FALSE(a.findings.empty());
  EXPECT_EQ(a.bottleneck(), "compute_bound");
  EXPECT_EQ(a.findings.front().title, "the GPU computes 95% of each step; transfers are hidden");
  EXPECT_DOUBLE_EQ(a.findings.front().numbers.at("copy_overlap"), 1);
  // A material finding removes it.
  EXPECT_EQ(find_rule(serialized(7).run(), "compute_bound"), nullptr);
}

// ---- output ----

TEST(analyze_output, json_and_text_carry_the_analysis) {
  builder b = naive_ingest();
  b.t.dropped = 3;
  const analysis a = b.run();
  const auto j = nlohmann::json::parse(to_json(a));
  EXPECT_EQ(j.at("source"), "test");
  EXPECT_EQ(j.at("dropped"), 3);
  EXPECT_EQ(j.at("bottleneck"), "gpu_idle");
  EXPECT_EQ(j.at("steps").size(), 4u);
  EXPECT_DOUBLE_EQ(j.at("mean").at("idle_ms").get<double>(), 0.65);
  EXPECT_EQ(j.at("idle").at(0).at("activity"), "make batch");
  EXPECT_EQ(j.at("findings").at(0).at("rule"), "gpu_idle");
  EXPECT_TRUE(j.at("findings").at(0).at("numbers").contains("idle_fraction"));
  const std::string text = format_text(a);
  EXPECT_NE(text.find("dropped 3 events"), std::string::npos) << text;
  EXPECT_NE(text.find("1. [gpu_idle]"), std::string::npos) << text;
  EXPECT_NE(text.find("'make batch'"), std::string::npos) << text;
}

TEST(analyze_output, long_traces_show_ten_steps) {
  builder b;
  b.steps(12, 100);
  for (int i = 0; i < 12; ++i) b.kernel(i * 100 + 1, i * 100 + 99);
  EXPECT_NE(format_text(b.run()).find("... 2 more steps"), std::string::npos);
}

// ---- PyTorch profiler fixtures ----

std::filesystem::path fixture(const char* name) { return test_data("trace", name); }

TEST(analyze_kineto, naive_ingest_idles_in_make_batch) {
  const analysis a = analyze(read_trace(fixture("kineto_naive.json")));
  EXPECT_EQ(a.step_prefix, "ProfilerStep#");
  EXPECT_EQ(a.steps.size(), 5u);
  ASSERT_EQ(a.bottleneck(), "gpu_idle") << format_text(a);
  EXPECT_NE(a.findings.front().title.find("'make batch'"), std::string::npos) << a.findings.front().title;
  EXPECT_GT(a.findings.front().numbers.at("idle_fraction"), 0.6);
  EXPECT_NE(find_rule(a, "pageable_async_copy"), nullptr);
  EXPECT_EQ(a.mean.h2d_bytes, 25165824u + 256u);
}

TEST(analyze_kineto, prefetch_hides_its_copies) {
  const analysis a = analyze(read_trace(fixture("kineto_prefetch.json")));
  EXPECT_EQ(a.steps.size(), 5u);
  EXPECT_EQ(a.bottleneck(), "compute_bound") << format_text(a);
  EXPECT_EQ(find_rule(a, "gpu_idle"), nullptr);
  EXPECT_EQ(find_rule(a, "pageable_async_copy"), nullptr);
  EXPECT_GT(a.mean.copy_overlap, 0.9);
}

}  // namespace

// ---- drain tail ----

namespace {

TEST(analyze_drain_tail, names_the_work_that_trails_the_last_step_without_costing_the_steps) {
  builder b = busy_steps();  // the last step ends at 4000 us
  b.t.thread_names[worker_tid] = "sink 0";
  b.range("process output", 3900, 4800, worker_tid);  // 800 us past it: 1/6 of the 4800 us traced
  b.api("cudaEventSynchronize", 4000, 4700, sync_kind::event, main_tid);  // a wait: not work
  const analysis a = b.run();
  ASSERT_FALSE(a.findings.empty());
  EXPECT_EQ(a.bottleneck(), "compute_bound") << format_text(a);  // the steps themselves are not slower
  const finding* f = find_rule(a, "drain_tail");
  ASSERT_NE(f, nullptr) << format_text(a);
  EXPECT_DOUBLE_EQ(f->cost_ms_per_step, 0.0);
  EXPECT_NEAR(f->numbers.at("tail_ms"), 0.8, 1e-9);
  EXPECT_NEAR(f->numbers.at("tail_fraction"), 800.0 / 4800.0, 1e-9);
  EXPECT_NEAR(f->numbers.at("activity_ms"), 0.8, 1e-9);
  EXPECT_NE(f->title.find("sink 0 in 'process output'"), std::string::npos) << f->title;
  EXPECT_NE(f->fix.find("ferry::egress::pipeline"), std::string::npos) << f->fix;
  EXPECT_EQ(a.findings.back().rule, "drain_tail");  // after everything that costs per step
}

TEST(analyze_drain_tail, what_covered_the_tail_counts_only_time_inside_it) {
  builder b = busy_steps();  // the last step ends at 4000 us
  b.t.thread_names[worker_tid] = "sink 0";
  b.range("process output", 3900, 4800, worker_tid);                  // the tail: 4000..4800
  b.api("cudaMemcpyAsync", 4100, 4600, sync_kind::none, worker_tid);  // 500 us of it
  b.api("cudaMemcpyAsync", 5800, 5900, sync_kind::none, worker_tid);  // after it: no part of it
  const analysis a = b.run();
  const finding* f = find_rule(a, "drain_tail");
  ASSERT_NE(f, nullptr) << format_text(a);
  EXPECT_NEAR(f->numbers.at("tail_ms"), 0.8, 1e-9);
  EXPECT_NEAR(f->numbers.at("activity_ms"), 0.5, 1e-9);
  EXPECT_NE(f->title.find("'cudaMemcpyAsync'"), std::string::npos) << f->title;
}

TEST(analyze_drain_tail, stays_quiet_for_a_short_tail_or_a_wait) {
  builder small = busy_steps();
  small.range("process output", 3900, 4100, worker_tid);  // 100 us past the last step: under 3% of 4100
  EXPECT_EQ(find_rule(small.run(), "drain_tail"), nullptr);

  builder wait = busy_steps();
  wait.api("cudaDeviceSynchronize", 3980, 4900, sync_kind::device);  // waiting is not work left to do
  EXPECT_EQ(find_rule(wait.run(), "drain_tail"), nullptr);

  // Nor is another thread parked on a condition variable until the process exits (ferry trace records
  // blocking calls as ranges: an idle pool thread, PyTorch's autograd engine thread).
  builder parked = busy_steps();
  parked.range("pthread_cond_wait (libstdc++.so.6)", 3900, 4800, worker_tid);
  EXPECT_EQ(find_rule(parked.run(), "drain_tail"), nullptr);
  // The main thread's wait still is: it may be the only record of a tail whose work went unrecorded.
  builder joined = busy_steps();
  joined.range("pthread_join (python3)", 3990, 4800, main_tid);
  const analysis joined_analysis = joined.run();
  const finding* f = find_rule(joined_analysis, "drain_tail");
  ASSERT_NE(f, nullptr);
  EXPECT_NE(f->title.find("'pthread_join (python3)'"), std::string::npos) << f->title;
}

}  // namespace

// ---- the fixes speak the trace's language ----

namespace {

bool has(const std::string& text, std::string_view part) { return text.find(part) != std::string::npos; }

// A timeline that fires each rule whose fix names something to use (compute_bound's says to speed up the
// model), as the rules' own tests build them.
std::vector<std::pair<std::string, builder>> rule_scenarios() {
  std::vector<std::pair<std::string, builder>> out;
  out.emplace_back("gpu_idle in data work", naive_ingest());
  out.emplace_back("gpu_idle in output work", naive_ingest("process output"));
  out.emplace_back("sync_copy", blocking_copies(false));
  out.emplace_back("sync_copy, async and a wait", blocking_copies(true));
  builder sync = busy_steps();
  sync.api("cudaDeviceSynchronize", 960, 1000, sync_kind::device);
  sync.api("cudaDeviceSynchronize", 2960, 3000, sync_kind::device);
  out.emplace_back("device_sync", std::move(sync));
  out.emplace_back("serialized_copy", serialized(7));
  builder slow = serialized(8);
  slow.t.link_h2d_gbps = 100;
  out.emplace_back("low_copy_bandwidth", std::move(slow));
  builder pageable;
  pageable.steps(4, 1000);
  pageable.t.link_d2h_gbps = 50;
  for (int i = 0; i < 4; ++i) {
    const double t0 = i * 1000.0;
    pageable.kernel(t0 + 5, t0 + 700);
    pageable.api("cudaMemcpyAsync", t0 + 10, t0 + 990, sync_kind::copy);
    pageable.copy(copy_kind::d2h, t0 + 700, t0 + 985, 4'000'000, mem_kind::pageable, true, 8);
  }
  out.emplace_back("pageable_async_copy", std::move(pageable));
  builder host;
  host.steps(4, 1000);
  for (int i = 0; i < 4; ++i) {
    const double t0 = i * 1000.0;
    host.kernel(t0, t0 + 400);
    host.range("wait for a free buffer", t0 + 400, t0 + 950);
    host.range("process output", t0, t0 + 1000, worker_tid);
  }
  out.emplace_back("host_bound", std::move(host));
  out.emplace_back("exposed_comm", ddp_steps(800, 950));
  builder tail = busy_steps();
  tail.range("process output", 3900, 4800, worker_tid);
  out.emplace_back("drain_tail", std::move(tail));
  return out;
}

TEST(analyze_wording, a_pytorch_trace_gets_pytorch_fixes_and_a_ferry_trace_cpp_ones) {
  std::set<std::string> fired;
  for (auto& [name, b] : rule_scenarios()) {
    SCOPED_TRACE(name);
    for (const fix_wording w : {fix_wording::cpp, fix_wording::pytorch}) {
      analyze_options o;
      o.wording = w;
      const analysis a = b.run(o);
      for (const finding& f : a.findings) {
        SCOPED_TRACE(f.rule);
        if (f.rule == "compute_bound") continue;
        fired.insert(f.rule);
        if (w == fix_wording::pytorch) {
          EXPECT_FALSE(has(f.fix, "ferry::")) << f.fix;
          EXPECT_FALSE(has(f.fix, "ingest L") || has(f.fix, "egress L") || has(f.fix, "ladder")) << f.fix;
          EXPECT_TRUE(has(f.fix, "DataLoader") || has(f.fix, ".to(device") || has(f.fix, "ferry.torch.") ||
                      has(f.fix, "torch.cuda") || has(f.fix, "DistributedDataParallel"))
              << f.fix;
        } else {
          EXPECT_FALSE(has(f.fix, "ferry.torch") || has(f.fix, "DataLoader(")) << f.fix;
          if (f.rule != "exposed_comm") {
            EXPECT_TRUE(has(f.fix, "ferry::")) << f.fix;
          }
        }
      }
    }
  }
  // Every rule but the verdict was seen: a new rule needs a scenario here.
  for (const std::string& rule : rule_ids()) {
    if (rule != "compute_bound") {
      EXPECT_TRUE(fired.contains(rule)) << rule;
    }
  }
}

TEST(analyze_wording, the_trace_s_origin_picks_the_wording) {
  EXPECT_EQ(wording_for("pytorch profiler (Kineto)"), fix_wording::pytorch);
  EXPECT_EQ(wording_for("chrome trace"), fix_wording::pytorch);
  EXPECT_EQ(wording_for("ferry host"), fix_wording::cpp);
  EXPECT_EQ(wording_for("ferry cuda (CUPTI)"), fix_wording::cpp);
  // Read back from files: a PyTorch profiler export, and a trace ferry wrote.
  const analysis kineto = analyze(read_trace(fixture("kineto_naive.json")));
  ASSERT_EQ(kineto.bottleneck(), "gpu_idle");
  EXPECT_TRUE(has(kineto.findings.front().fix, "ferry.torch.Prefetcher")) << kineto.findings.front().fix;
  for (const finding& f : kineto.findings) EXPECT_FALSE(has(f.fix, "ferry::")) << f.fix;
  builder b = naive_ingest();
  b.t.source = "ferry host";
  b.t.sort();
  const analysis ferry_trace = analyze(parse_trace(to_chrome_json(b.t), "ferry trace"));
  EXPECT_EQ(ferry_trace.source, "ferry host");
  ASSERT_EQ(ferry_trace.bottleneck(), "gpu_idle");
  EXPECT_TRUE(has(ferry_trace.findings.front().fix, "ferry::ingest::loader"))
      << ferry_trace.findings.front().fix;
  // `ferry trace` of a Python program: its automatic annotation (domain "ferry.python") says PyTorch.
  builder py = naive_ingest();
  py.t.source = "ferry trace";
  py.range("forward (ResNet)", 700, 720).domain = py.t.strings.intern("ferry.python");
  const analysis traced_python = py.run();
  ASSERT_EQ(traced_python.bottleneck(), "gpu_idle");
  EXPECT_TRUE(has(traced_python.findings.front().fix, "DataLoader")) << traced_python.findings.front().fix;
  EXPECT_FALSE(has(traced_python.findings.front().fix, "ferry::")) << traced_python.findings.front().fix;
  // An explicit wording wins over the origin.
  analyze_options o;
  o.wording = fix_wording::cpp;
  EXPECT_TRUE(has(analyze(read_trace(fixture("kineto_naive.json")), o).findings.front().fix, "ferry::"));
}

// `ferry trace` records programs of any language: each GPU process gets the words of its own (a Python
// program PyTorch's, even recorded without its annotation; ferry's C++ benches ferry's C++ API).
TEST(analyze_wording, a_ferry_trace_recording_gets_the_words_of_each_process_language) {
  const auto first_fix = [](const std::string& command) {
    builder b = naive_ingest();
    b.t.source = "ferry trace";
    process_info p;
    p.pid = main_tid;
    p.name = p.command = command;
    p.started = "exec";
    p.gpu = true;
    p.end_ns = 5'000'000;
    b.t.processes[main_tid] = p;
    b.t.thread_processes[main_tid] = main_tid;
    b.t.stream_processes[7] = main_tid;
    b.t.sort();
    const session_analysis s = analyze_session(b.t, {});
    EXPECT_EQ(s.ranks.size(), 1u) << command;
    return s.ranks.empty() || s.ranks[0].result.findings.empty() ? std::string()
                                                                 : s.ranks[0].result.findings.front().fix;
  };
  for (const std::string command :
       {"/usr/bin/python3.12 train.py --epochs 1", "python -m torch.distributed.run x.py"}) {
    const std::string fix = first_fix(command);
    EXPECT_TRUE(has(fix, "DataLoader")) << command << ": " << fix;
    EXPECT_FALSE(has(fix, "ferry::")) << command << ": " << fix;
  }
  const std::string cpp = first_fix("/opt/ferry/bin/ferry bench ingest --levels L1");
  EXPECT_TRUE(has(cpp, "ferry::ingest::loader")) << cpp;
}

// ---- findings that cost nothing ----

TEST(analyze_findings, a_finding_that_costs_the_steps_nothing_is_not_listed) {
  // 8 MB H2D copies at 26.7 GB/s against a 100 GB/s link, in every step: slow, but hidden under the
  // kernels they cost nothing; started before the kernels, 25 us of each 300 us copy runs alone.
  const auto with_copies = [](double start) {
    builder b = busy_steps();
    b.t.link_h2d_gbps = 100;
    for (int i = 0; i < 4; ++i)
      b.copy(copy_kind::h2d, i * 1000 + start, i * 1000 + start + 300, 8'000'000, mem_kind::pinned, true, 8);
    return b.run();
  };
  const analysis hidden = with_copies(100);
  EXPECT_EQ(find_rule(hidden, "low_copy_bandwidth"), nullptr) << format_text(hidden);
  EXPECT_EQ(format_text(hidden).find("low_copy_bandwidth"), std::string::npos);
  const analysis exposed = with_copies(0);
  const finding* f = find_rule(exposed, "low_copy_bandwidth");
  ASSERT_NE(f, nullptr) << format_text(exposed);
  EXPECT_NEAR(f->cost_ms_per_step, 0.22 * 25.0 / 300.0, 1e-9);  // 220 us beyond the link, 1/12 exposed
  // The verdict and the drain tail cost nothing per step by design, and stay.
  EXPECT_EQ(hidden.bottleneck(), "compute_bound");
}

TEST(analyze_findings, rule_ids_are_the_rules_in_ranking_order) {
  const std::vector<std::string>& ids = rule_ids();
  ASSERT_FALSE(ids.empty());
  EXPECT_EQ(ids.front(), "compute_bound");
  for (const char* r : {"gpu_idle", "sync_copy", "pageable_async_copy", "device_sync", "serialized_copy",
                        "exposed_comm", "low_copy_bandwidth", "host_bound", "drain_tail"})
    EXPECT_NE(std::find(ids.begin(), ids.end(), r), ids.end()) << r;
}

}  // namespace
