// The analyzer on what PyTorch profiler traces of real loops look like: which thread runs the loop, what
// kind of CPU work covered the GPU's idle time (and so which fix applies), idle that no recorded op
// covers, host-bound pipelines, and costs that agree with their evidence. The small Kineto traces in
// tests/analyze/data are described in its README.md.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "analyze/builder.hpp"
#include "ferry/analyze/analyze.hpp"
#include "ferry/trace/trace_io.hpp"

using namespace ferry::trace;
using namespace ferry::trace::test_traces;

namespace {

bool has(const std::string& text, std::string_view part) { return text.find(part) != std::string::npos; }

analysis analyze_file(std::string_view name) { return analyze(read_trace(test_data("analyze", name))); }

// ---- the main thread ----

TEST(analyze_main_thread, without_steps_the_thread_whose_id_is_the_pid_wins_over_the_autograd_thread) {
  // pt_autograd_0 issues twice the main thread's launches; the main thread waits in the DataLoader.
  const analysis a = analyze_file("training_no_steps.json");
  EXPECT_TRUE(has(a.main_thread, "pt_main_thread")) << a.main_thread;
  EXPECT_EQ(a.main_thread_rule, "tid_is_pid");
  ASSERT_EQ(a.bottleneck(), "gpu_idle") << format_text(a);
  const finding& f = a.findings.front();
  EXPECT_TRUE(has(f.title, "DataLoader")) << f.title;
  EXPECT_TRUE(has(f.evidence, "pt_main_thread")) << f.evidence;
  // A PyTorch profiler trace: the fix in PyTorch's words, not ferry's C++ classes.
  EXPECT_TRUE(has(f.fix, "DataLoader(num_workers=..., pin_memory=True)")) << f.fix;
  EXPECT_TRUE(has(f.fix, "ferry.torch.Prefetcher")) << f.fix;
  EXPECT_FALSE(has(f.fix, "ferry::")) << f.fix;
  EXPECT_TRUE(
      has(format_text(a), "main thread: thread 1000 (pt_main_thread) (its thread id is its process id)"))
      << format_text(a);
  EXPECT_EQ(nlohmann::json::parse(to_json(a)).at("main_thread_rule"), "tid_is_pid");
}

// Without step spans or process ids: the thread with most annotations, then most API calls; an autograd
// thread only when nothing else qualifies.
TEST(analyze_main_thread, annotations_then_api_calls_and_autograd_threads_last) {
  static constexpr std::uint64_t autograd_tid = 300;
  const auto base = [] {
    builder b;
    b.t.thread_names[autograd_tid] = "pt_autograd_0";
    b.kernel(0, 100);
    b.kernel(200, 300);
    for (int i = 0; i < 5; ++i)
      b.api("cudaLaunchKernel", 10.0 * i, 10.0 * i + 5, sync_kind::none, autograd_tid);
    return b;
  };
  {
    builder b = base();
    b.api("cudaLaunchKernel", 150, 155, sync_kind::none, worker_tid);
    b.range("load", 100, 200);  // main: one annotation, no API call
    const analysis a = b.run();
    EXPECT_EQ(a.main_thread, "main");
    EXPECT_EQ(a.main_thread_rule, "most_annotations");
  }
  {
    builder b = base();
    b.api("cudaLaunchKernel", 150, 155, sync_kind::none, worker_tid);
    const analysis a = b.run();
    EXPECT_EQ(a.main_thread, fmt::format("thread {}", worker_tid));
    EXPECT_EQ(a.main_thread_rule, "most_api_calls");
  }
  {
    builder b = base();  // the autograd thread alone
    const analysis a = b.run();
    EXPECT_EQ(a.main_thread, "pt_autograd_0");
    EXPECT_EQ(a.main_thread_rule, "autograd_only");
  }
  {
    builder b = base();  // step spans decide whatever the counts
    b.range("ProfilerStep#0", 0, 300, worker_tid);
    const analysis a = b.run();
    EXPECT_EQ(a.main_thread_rule, "step_spans");
    EXPECT_EQ(a.main_thread, fmt::format("thread {}", worker_tid));
  }
}

// ---- what covered the idle, and the advice ----

struct work_case {
  const char* activity;
  bool blocking;
  const char* work;
  const char* in_fix;  // a phrase the gpu_idle fix must hold
};

// Every class of the table, with names seen in real traces. Only data, output and user work is told to
// move off the launching thread.
const std::vector<work_case> work_cases{
    {"enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", false, "data", "ferry::ingest::loader"},
    {"make batch", false, "data", "ferry::ingest::loader"},
    {"wait for batch", false, "data", "ferry::ingest::loader"},
    {"process output", false, "output", "ferry::egress::pipeline's sinks"},
    {"## RecMetricModule:update ##", false, "user", "move '## RecMetricModule:update ##' off the thread"},
    {"compute_metrics", false, "user", "move 'compute_metrics' off the thread"},
    {"## backward ##", false, "framework", "CPU-overhead bound"},
    {"DistributedDataParallel.forward", false, "framework", "CPU-overhead bound"},
    {"Optimizer.step#Adam.step", false, "framework", "torch.compile"},
    {"aten::batch_norm", false, "framework", "CUDA graphs"},
    {"cudaLaunchKernel", false, "launch", "launch-bound"},
    {"cuLaunchKernel", false, "launch", "CUDA graphs"},
    {"cudaGraphLaunch", false, "launch", "launch-bound"},
    {"cudaFree", false, "allocator", "PYTORCH_CUDA_ALLOC_CONF"},
    {"cudaMalloc", false, "allocator", "empty_cache"},
    {"CUDACachingAllocator::malloc", false, "allocator", "caching allocator"},
    {"cudaHostAlloc", false, "allocator", "allocate staging buffers once"},
    {"cudaMemcpyAsync", false, "copy", "sync_copy and pageable_async_copy"},
    {"cudaMemcpy", true, "copy", "pinned buffers and non-blocking copies"},
    {"cudaStreamSynchronize", true, "sync", "the sync_copy finding"},
    {"cudaDeviceSynchronize", true, "sync", "device_sync"},
    {"aten::item", false, "sync", "read values back"},
    {"Queue.get", false, "host_wait", "host_bound"},
    {"pthread_cond_wait", false, "host_wait", "more workers"},
    {"time.sleep", false, "host_wait", "host_bound"},
    {"cudaStreamCreateWithFlags", false, "runtime", "hoist it out of the loop"},
    {"cuCtxGetDevice", false, "runtime", "hoist it out of the loop"},
};

TEST(analyze_work_class, the_table_sorts_activity_and_only_movable_work_is_told_to_move) {
  for (const work_case& c : work_cases) {
    SCOPED_TRACE(c.activity);
    // 600 of 1000 us idle per step, covered by the activity on the main thread.
    builder b;
    b.steps(4, 1000);
    for (int i = 0; i < 4; ++i) {
      const double t0 = i * 1000.0;
      b.api(c.activity, t0 + 100, t0 + 700, c.blocking ? sync_kind::stream : sync_kind::none).kind =
          c.blocking ? activity::api : activity::range;
      b.kernel(t0 + 700, t0 + 1000);
      b.kernel(t0, t0 + 100);
    }
    const analysis a = b.run();
    ASSERT_FALSE(a.idle.empty());
    EXPECT_EQ(a.idle.front().activity, c.activity);
    EXPECT_EQ(a.idle.front().work, c.work);
    EXPECT_EQ(nlohmann::json::parse(to_json(a)).at("idle").at(0).at("work"), c.work);
    const std::string w = c.work;
    const finding* f = find_rule(a, w == "host_wait" ? "host_bound" : "gpu_idle");
    ASSERT_NE(f, nullptr) << format_text(a);
    if (w != "host_wait") {
      EXPECT_TRUE(has(f->fix, c.in_fix)) << f->fix;
    }
    const bool told_to_move =
        has(f->fix, "off the thread that launches GPU work") || has(f->fix, "worker threads");
    EXPECT_EQ(told_to_move, w == "data" || w == "output" || w == "user") << f->fix;
  }
}

// The same table in PyTorch's words: no class's advice names a C++ class of ferry's, and the classes whose
// C++ advice does say what to do in PyTorch instead.
TEST(analyze_work_class, each_classs_advice_speaks_pytorch_for_a_pytorch_trace) {
  const std::map<std::string, std::string> torch_phrase{
      {"data", "DataLoader(num_workers=..., pin_memory=True)"},
      {"output", "ferry.torch.Egress(sink)"},
      {"user", "the DataLoader's workers"},
      {"copy", ".to(device, non_blocking=True)"},
      {"sync", "ferry.torch."},
      {"host_wait", "num_workers=..."}};
  for (const work_case& c : work_cases) {
    SCOPED_TRACE(c.activity);
    builder b;
    b.steps(4, 1000);
    for (int i = 0; i < 4; ++i) {
      const double t0 = i * 1000.0;
      b.api(c.activity, t0 + 100, t0 + 700, c.blocking ? sync_kind::stream : sync_kind::none).kind =
          c.blocking ? activity::api : activity::range;
      b.kernel(t0 + 700, t0 + 1000);
      b.kernel(t0, t0 + 100);
    }
    analyze_options o;
    o.wording = fix_wording::pytorch;
    const analysis a = b.run(o);
    const std::string w = c.work;
    const finding* f = find_rule(a, w == "host_wait" ? "host_bound" : "gpu_idle");
    ASSERT_NE(f, nullptr) << format_text(a);
    EXPECT_FALSE(has(f->fix, "ferry::")) << f->fix;
    if (const auto it = torch_phrase.find(w); it != torch_phrase.end()) {
      EXPECT_TRUE(has(f->fix, it->second)) << f->fix;
    } else {
      EXPECT_TRUE(has(f->fix, c.in_fix)) << f->fix;  // framework, launch, allocator, runtime: as in C++
    }
  }
}

// ---- idle that no recorded op covers ----

TEST(analyze_uncovered, idle_in_plain_python_is_said_as_such_with_what_came_before_and_after) {
  // Per 10 ms step: 3 ms kernel, a blocking D2H into pageable memory, then 6 ms of output processing in
  // plain Python that the profiler does not record.
  const analysis a = analyze_file("uncovered_output.json");
  EXPECT_GT(a.uncovered.fraction_of_idle, 0.9);
  EXPECT_GE(a.uncovered.gaps, 4u);  // at least one stretch per step
  ASSERT_FALSE(a.uncovered.before.empty());
  ASSERT_FALSE(a.uncovered.after.empty());
  EXPECT_EQ(a.uncovered.after.front().activity, "cudaLaunchKernel");
  ASSERT_EQ(a.bottleneck(), "gpu_idle") << format_text(a);
  const finding& f = a.findings.front();
  EXPECT_TRUE(has(f.title, "runs code the trace did not record")) << f.title;
  EXPECT_TRUE(has(f.evidence, "just before them it was in")) << f.evidence;
  EXPECT_TRUE(has(f.evidence, "'cudaMemcpyAsync'")) << f.evidence;
  EXPECT_TRUE(has(f.fix, "record_function")) << f.fix;
  EXPECT_TRUE(has(f.fix, "with_stack=True")) << f.fix;
  EXPECT_NEAR(f.numbers.at("uncovered_fraction"), a.uncovered.fraction_of_idle, 1e-12);
}

TEST(analyze_uncovered, no_finding_names_an_activity_that_covers_little_of_the_idle) {
  for (const char* name : {"uncovered_output.json", "training_no_steps.json", "blocking_readback.json"}) {
    SCOPED_TRACE(name);
    const analysis a = analyze_file(name);
    for (const finding& f : a.findings) {
      if (f.rule != "gpu_idle" || !f.numbers.contains("attributed_fraction")) continue;
      EXPECT_GE(f.numbers.at("attributed_fraction"), 0.2) << f.title;
    }
    for (const idle_attribution& x : a.idle)
      if (x.fraction_of_idle < 0.2)
        for (const finding& f : a.findings)
          if (f.rule == "gpu_idle") {
            EXPECT_FALSE(has(f.title, "'" + x.activity + "'")) << f.title;
          }
  }
}

// ---- host-bound pipelines ----

TEST(analyze_host_bound, a_producer_waiting_for_a_free_buffer_is_host_bound) {
  builder b;
  b.steps(4, 1000);
  b.t.thread_names[worker_tid] = "sink 0";
  for (int i = 0; i < 4; ++i) {
    const double t0 = i * 1000.0;
    b.kernel(t0, t0 + 400);
    b.range("wait for a free buffer", t0 + 400, t0 + 950);  // the pool is empty: the sinks are slow
    b.range("process output", t0, t0 + 1000, worker_tid);
  }
  const analysis a = b.run();
  ASSERT_EQ(a.bottleneck(), "host_bound") << format_text(a);
  const finding& f = a.findings.front();
  EXPECT_DOUBLE_EQ(f.cost_ms_per_step, 0.55);
  EXPECT_TRUE(has(f.evidence, "'wait for a free buffer'")) << f.evidence;
  EXPECT_TRUE(has(f.fix, "more sink workers")) << f.fix;
  EXPECT_EQ(find_rule(a, "gpu_idle"), nullptr) << format_text(a);  // host_bound explains that idle
}

TEST(analyze_host_bound, a_backlog_after_the_last_gpu_work_is_host_bound_a_short_tail_is_not) {
  builder b = busy_steps();  // 4 compute-bound steps of 1 ms
  b.t.thread_names[worker_tid] = "sink 0";
  b.range("process output", 100, 7000, worker_tid);  // the host drains for 3 ms after the last step
  const analysis a = b.run();
  ASSERT_EQ(a.bottleneck(), "host_bound") << format_text(a);
  const finding& f = a.findings.front();
  // 3 ms after the GPU's last work; beyond one step's worth (1 ms): 2 ms over 4 steps.
  EXPECT_NEAR(f.numbers.at("tail_ms"), 3.0, 1e-9);
  EXPECT_NEAR(f.cost_ms_per_step, 0.5, 1e-9);
  EXPECT_TRUE(has(f.title, "the GPU finishes early")) << f.title;
  EXPECT_EQ(find_rule(a, "drain_tail"), nullptr);

  builder short_tail = busy_steps();
  short_tail.range("process output", 3900, 4800, worker_tid);
  const analysis s = short_tail.run();
  EXPECT_EQ(s.bottleneck(), "compute_bound") << format_text(s);
  EXPECT_EQ(find_rule(s, "host_bound"), nullptr);
  EXPECT_NE(find_rule(s, "drain_tail"), nullptr);
}

// ---- costs agree with their evidence ----

TEST(analyze_costs, a_read_back_that_blocks_for_most_of_the_step_costs_what_the_gpu_idled_meanwhile) {
  // cudaMemcpyAsync of 704 bytes into pageable memory waits 78 ms per step; the GPU idles 76 ms of it.
  const analysis a = analyze_file("blocking_readback.json");
  ASSERT_EQ(a.bottleneck(), "sync_copy") << format_text(a);  // gpu_idle gives way to what explains it
  const finding& f = a.findings.front();
  EXPECT_GT(f.cost_ms_per_step, 70.0) << format_text(a);
  EXPECT_NEAR(f.numbers.at("blocking_async_calls_per_step"), 1, 1e-12);
  EXPECT_EQ(find_rule(a, "gpu_idle"), nullptr) << format_text(a);
  const finding* p = find_rule(a, "pageable_async_copy");
  ASSERT_NE(p, nullptr) << format_text(a);
  EXPECT_NEAR(p->numbers.at("blocked_ms_per_step"), 78.0, 1e-6);
  EXPECT_TRUE(has(p->fix, ".item()")) << p->fix;
  // 704 bytes read back are a value, not an output: no output pipeline is offered for them.
  for (const finding& g : a.findings) {
    EXPECT_TRUE(has(g.fix, ".item()")) << g.rule << ": " << g.fix;
    EXPECT_FALSE(has(g.fix, "Egress")) << g.rule << ": " << g.fix;
  }
}

// Every test trace: each finding's cost is the sum of its cost_* numbers, each of which its evidence (or
// title) quotes; no cost exceeds the mean step; findings come costliest first (a leading fallback aside).
std::vector<std::pair<std::string, analysis>> every_test_trace() {
  std::vector<std::pair<std::string, analysis>> out;
  for (const char* folder : {"analyze", "trace"})
    for (const auto& e : std::filesystem::directory_iterator(test_data(folder, "")))
      if (e.path().extension() == ".json")
        out.emplace_back(e.path().filename().string(), analyze(read_trace(e.path())));
  for (const work_case& c : work_cases) {
    builder b;
    b.steps(2, 1000);
    b.range(c.activity, 100, 700);
    b.kernel(700, 1000);
    b.kernel(1700, 2000);
    out.emplace_back(c.activity, b.run());
  }
  builder tail = busy_steps();
  tail.range("process output", 100, 9000, worker_tid);
  out.emplace_back("long tail", tail.run());
  out.emplace_back("ddp, one bucket after backward", ddp_steps(800, 950).run());
  out.emplace_back("ddp, buckets during backward", ddp_steps(500, 850).run());
  return out;
}

TEST(analyze_costs, every_cost_is_the_sum_its_evidence_quotes_bounded_by_the_step_and_sorted) {
  const auto traces = every_test_trace();
  ASSERT_GE(traces.size(), 5u + work_cases.size());
  for (const auto& [name, a] : traces) {
    SCOPED_TRACE(name);
    double previous = 1e300;
    for (std::size_t i = 0; i < a.findings.size(); ++i) {
      const finding& f = a.findings[i];
      SCOPED_TRACE(f.rule);
      EXPECT_FALSE(f.fix.empty());
      EXPECT_FALSE(f.evidence.empty() || f.evidence.starts_with(";")) << f.evidence;
      EXPECT_GE(f.cost_ms_per_step, 0);
      EXPECT_LE(f.cost_ms_per_step, a.mean.wall_ms * (1 + 1e-9)) << format_text(a);
      if (i > 0 || f.cost_ms_per_step > 0) {
        EXPECT_LE(f.cost_ms_per_step, previous * (1 + 1e-12)) << format_text(a);
        previous = f.cost_ms_per_step;
      }
      if (f.cost_ms_per_step <= 0) continue;
      double sum = 0;
      for (const auto& [key, v] : f.numbers) {
        if (!key.starts_with("cost_")) continue;
        sum += v;
        if (v > 0) {
          EXPECT_TRUE(has(f.evidence, fmt::format("{:.2f} ms", v)) ||
                      has(f.title, fmt::format("{:.2f} ms", v)))
              << key << " = " << v << " not quoted: " << f.evidence;
        }
      }
      EXPECT_NEAR(sum, f.cost_ms_per_step, 1e-9 * std::max(1.0, f.cost_ms_per_step)) << f.evidence;
    }
  }
}

}  // namespace
