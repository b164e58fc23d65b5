#include "ferry/trace/trace_io.hpp"
#include "ferry/trace/process_trace.hpp"

#include <gtest/gtest.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "ferry/core/error.hpp"
#include "trace/timeline_compare.hpp"

namespace {

using namespace ferry::trace;
namespace fs = std::filesystem;

const fs::path data_dir = fs::path(FERRY_TESTS_DIR) / "trace" / "data";
const fs::path corpus_dir = fs::path(FERRY_TESTS_DIR) / "fuzz" / "corpus" / "trace_import";

// A timeline that exercises every field: each activity, copy directions, memory kinds, sync kinds,
// domains, names that need escaping, and timestamps whose nanoseconds a double of microseconds loses.
timeline sample_timeline() {
  timeline t;
  t.source = "ferry host";
  t.device_name = "NVIDIA H200 \"emulated\"";
  t.dropped = 3;
  t.link_h2d_gbps = 53.27;
  t.link_d2h_gbps = 1.0 / 3.0;
  t.thread_names = {{101, "main"}, {102, "egress sink 0"}};
  t.stream_names = {{7, "compute"}, {13, "ingest copy"}};
  t.metadata = {{"bench", "ingest"}, {"command", "ferry bench ingest --level 3\n\tquoted \"x\" \\ ü"}};
  const std::uint32_t ferry = t.strings.intern("ferry");
  const std::int64_t base = 8'999'999'999'999'123;  // ~104 days of uptime, odd nanoseconds
  auto add = [&](event e, std::int64_t start, std::int64_t dur) {
    e.start_ns = base + start;
    e.end_ns = base + start + dur;
    t.events.push_back(e);
  };
  event k;
  k.kind = activity::kernel;
  k.name = t.strings.intern("void gemm<float>(float const*, float*) \"tile\"");
  k.device = 0;
  k.stream = 7;
  k.correlation = 41;
  add(k, 0, 1'234'567);
  event h2d;
  h2d.kind = activity::memcpy;
  h2d.device = 0;
  h2d.stream = 13;
  h2d.copy = copy_kind::h2d;
  h2d.src = mem_kind::pinned;
  h2d.dst = mem_kind::device;
  h2d.bytes = 25'165'824;
  h2d.async = true;
  h2d.correlation = 42;
  add(h2d, 1, 458'049);  // unnamed: the writer shows "Memcpy HtoD (Pinned -> Device)"
  event d2h = h2d;
  d2h.copy = copy_kind::d2h;
  d2h.src = mem_kind::device;
  d2h.dst = mem_kind::pageable;
  d2h.async = false;
  d2h.bytes = 4;
  d2h.name = t.strings.intern("ferry egress copy");
  add(d2h, 2, 1);
  event p2p = h2d;
  p2p.copy = copy_kind::p2p;
  p2p.device = 1;
  p2p.src = mem_kind::device;
  p2p.dst = mem_kind::managed;
  add(p2p, 3, 10);
  event ms;
  ms.kind = activity::memset;
  ms.device = 1;
  ms.stream = 0;
  ms.bytes = 1ull << 40;
  ms.dst = mem_kind::device;
  add(ms, 4, 0);
  event sync;
  sync.kind = activity::sync;
  sync.sync = sync_kind::stream;
  sync.thread = 101;
  sync.stream = 7;
  sync.name = t.strings.intern("stream::synchronize");
  add(sync, 5, 999);
  event api;
  api.kind = activity::api;
  api.thread = 102;
  api.correlation = 42;
  api.sync = sync_kind::copy;
  api.name = t.strings.intern("cudaMemcpy");
  add(api, 6, 7);
  event range;
  range.kind = activity::range;
  range.thread = 101;
  range.domain = t.strings.intern("my domain");
  range.name = t.strings.intern("step 3 \xe2\x9c\x93");
  add(range, 7, 5'000'000);
  event stage;
  stage.kind = activity::stage;
  stage.thread = std::uint64_t{1} << 40;
  stage.domain = ferry;
  stage.name = t.strings.intern("egress.stage");
  add(stage, 8, 12);
  event wait;
  wait.kind = activity::sync;
  wait.sync = sync_kind::stream_wait;
  wait.thread = 101;
  wait.device = 0;
  add(wait, 9, 0);
  t.sort();
  return t;
}

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// The message of the input_error `f` throws; fails the test when it throws nothing or something else.
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const ferry::input_error& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected input_error, got another exception: " << e.what();
    return {};
  }
  ADD_FAILURE() << "expected input_error, nothing was thrown";
  return {};
}

std::string parse_error(std::string_view text, const read_limits& limits = {}) {
  return error_of([&] { (void)parse_trace(text, "t.json", limits); });
}

struct temp_dir {
  fs::path path = fs::temp_directory_path() / ("ferry_trace_io_" + std::to_string(::getpid()));
  temp_dir() { fs::create_directories(path); }
  ~temp_dir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

// --- writing and round trip ----------------------------------------------------------------------

TEST(TraceIo, round_trip_keeps_every_field) {
  const timeline t = sample_timeline();
  const timeline back = parse_trace(to_chrome_json(t), "round trip");
  EXPECT_EQ(ferry::test::timeline_difference(t, back), "");
}

TEST(TraceIo, round_trip_through_a_file) {
  temp_dir dir;
  const timeline t = sample_timeline();
  write_chrome_trace(t, dir.path / "t.json");
  const timeline back = read_trace(dir.path / "t.json");
  EXPECT_EQ(ferry::test::timeline_difference(t, back), "");
  // Writing again replaces the file rather than appending to it.
  write_chrome_trace(t, dir.path / "t.json");
  EXPECT_EQ(ferry::test::timeline_difference(t, read_trace(dir.path / "t.json")), "");
}

TEST(TraceIo, round_trip_of_an_empty_timeline) {
  const timeline t;
  const timeline back = parse_trace(to_chrome_json(t), "empty");
  EXPECT_EQ(ferry::test::timeline_difference(t, back), "");
}

TEST(TraceIo, comparison_sees_a_changed_field) {
  // The round-trip tests are only as good as the comparison: it must notice one changed field.
  const timeline t = sample_timeline();
  timeline u = parse_trace(to_chrome_json(t), "x");
  u.events[3].bytes += 1;
  EXPECT_NE(ferry::test::timeline_difference(t, u), "");
  u = parse_trace(to_chrome_json(t), "x");
  u.events[0].end_ns += 1;
  EXPECT_NE(ferry::test::timeline_difference(t, u), "");
}

TEST(TraceIo, chrome_json_has_tracks_categories_and_colours) {
  const timeline t = sample_timeline();
  const auto doc = nlohmann::json::parse(to_chrome_json(t));
  EXPECT_EQ(doc.at("displayTimeUnit"), "ns");
  EXPECT_EQ(doc.at("ferry").at("source"), "ferry host");
  EXPECT_EQ(doc.at("ferry").at("format"), 1);
  std::map<std::string, std::string> process_names;  // pid -> name
  std::map<std::string, std::string> thread_names;   // "pid/tid" -> name
  std::set<std::string> cats;
  std::map<std::string, std::string> cname_of_cat;
  std::size_t complete = 0;
  for (const auto& e : doc.at("traceEvents")) {
    const std::string ph = e.at("ph");
    const std::string key = e.at("pid").dump() + "/" + e.at("tid").dump();
    if (ph == "M") {
      if (e.at("name") == "process_name") process_names[e.at("pid").dump()] = e.at("args").at("name");
      if (e.at("name") == "thread_name") thread_names[key] = e.at("args").at("name");
      continue;
    }
    ASSERT_EQ(ph, "X");
    ++complete;
    cats.insert(e.at("cat").get<std::string>());
    EXPECT_TRUE(e.at("ts").is_number() && e.at("dur").is_number());
    ASSERT_TRUE(process_names.count(e.at("pid").dump())) << "no process_name for " << e.dump();
    ASSERT_TRUE(thread_names.count(key)) << "no thread_name for " << e.dump();
    const std::string cat = e.at("cat");
    if (cat != "memcpy") cname_of_cat[cat] = e.at("cname");
  }
  EXPECT_EQ(complete, t.events.size());
  EXPECT_EQ(cats, (std::set<std::string>{"kernel", "memcpy", "memset", "sync", "api", "range", "stage"}));
  EXPECT_EQ(process_names["1"], "CPU");
  EXPECT_EQ(process_names["1000"], "GPU 0 NVIDIA H200 \"emulated\"");
  EXPECT_EQ(process_names["1001"], "GPU 1 NVIDIA H200 \"emulated\"");
  EXPECT_EQ(thread_names["1000/7"], "compute");
  EXPECT_EQ(thread_names["1000/13"], "ingest copy");
  EXPECT_EQ(thread_names["1001/0"], "stream 0");
  EXPECT_EQ(thread_names["1/101"], "main");
  EXPECT_EQ(thread_names["1/1099511627776"], "thread 1099511627776");
  // Kernels and copies are told apart by colour, H2D and D2H too.
  std::map<std::string, std::string> copy_colour;  // name -> cname
  for (const auto& e : doc.at("traceEvents"))
    if (e.at("ph") == "X" && e.at("cat") == "memcpy") copy_colour[e.at("name")] = e.at("cname");
  ASSERT_TRUE(copy_colour.count("Memcpy HtoD (Pinned -> Device)"));
  EXPECT_EQ(copy_colour["Memcpy HtoD (Pinned -> Device)"], "rail_response");
  EXPECT_EQ(copy_colour["ferry egress copy"], "rail_animation");
  EXPECT_EQ(cname_of_cat["kernel"], "thread_state_running");
  EXPECT_NE(cname_of_cat["kernel"], copy_colour["Memcpy HtoD (Pinned -> Device)"]);
}

TEST(TraceIo, timestamps_are_microseconds_with_three_decimals) {
  timeline t;
  event e;
  e.kind = activity::kernel;
  e.start_ns = 4'510'785'932'383'927;
  e.end_ns = e.start_ns + 1'376;
  t.events.push_back(e);
  const std::string json = to_chrome_json(t);
  EXPECT_NE(json.find(R"("ts":4510785932383.927,"dur":1.376)"), std::string::npos) << json;
}

TEST(TraceIo, writing_to_a_missing_directory_names_the_path) {
  try {
    write_chrome_trace(timeline{}, "/nonexistent-ferry-dir/t.json");
    FAIL() << "expected std::system_error";
  } catch (const std::system_error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent-ferry-dir/t.json"), std::string::npos) << e.what();
  }
}

// --- Kineto import -------------------------------------------------------------------------------

struct counts {
  std::map<activity, std::size_t> by_kind;
  std::map<std::string, std::size_t> by_name;
};

counts count(const timeline& t) {
  counts c;
  for (const event& e : t.events) {
    ++c.by_kind[e.kind];
    ++c.by_name[std::string(t.name_of(e))];
  }
  return c;
}

TEST(TraceIo, kineto_naive_imports_kernels_copies_and_steps) {
  const timeline t = read_trace(data_dir / "kineto_naive.json");
  EXPECT_EQ(t.source, "pytorch profiler (Kineto)");
  EXPECT_EQ(t.device_name, "NVIDIA H200");
  EXPECT_TRUE(std::is_sorted(t.events.begin(), t.events.end(),
                             [](const event& a, const event& b) { return a.start_ns < b.start_ns; }));
  const counts c = count(t);
  EXPECT_EQ(c.by_kind.at(activity::kernel), 200u);
  EXPECT_EQ(c.by_kind.at(activity::memcpy), 15u);
  EXPECT_EQ(c.by_kind.at(activity::memset), 30u);
  EXPECT_EQ(c.by_kind.at(activity::api), 401u + 5u);
  EXPECT_EQ(c.by_kind.count(activity::sync), 0u);  // this Kineto records no cuda_sync activity

  std::size_t big_h2d = 0;
  std::size_t small_h2d = 0;
  std::size_t d2h = 0;
  for (const event& e : t.events) {
    if (e.kind != activity::memcpy) continue;
    EXPECT_EQ(e.device, 0);
    EXPECT_EQ(e.stream, 7u);
    EXPECT_TRUE(e.async) << "every copy of this trace came from cudaMemcpyAsync";
    EXPECT_NE(e.correlation, 0u);
    EXPECT_GT(e.end_ns, e.start_ns);
    if (e.copy == copy_kind::h2d) {
      EXPECT_EQ(e.src, mem_kind::pageable);
      EXPECT_EQ(e.dst, mem_kind::device);
      if (e.bytes == 25'165'824) ++big_h2d;
      if (e.bytes == 256) ++small_h2d;
    } else {
      EXPECT_EQ(e.copy, copy_kind::d2h);
      EXPECT_EQ(e.src, mem_kind::device);
      EXPECT_EQ(e.dst, mem_kind::pinned);
      EXPECT_EQ(e.bytes, 4u);
      ++d2h;
    }
  }
  EXPECT_EQ(big_h2d, 5u);
  EXPECT_EQ(small_h2d, 5u);
  EXPECT_EQ(d2h, 5u);

  // Steps: ProfilerStep#3..#7 once each as CPU ranges in the "pytorch" domain (the GPU-side copies of
  // the annotations are skipped).
  for (int step = 3; step <= 7; ++step) {
    const std::string name = "ProfilerStep#" + std::to_string(step);
    std::size_t n = 0;
    for (const event& e : t.events)
      if (t.name_of(e) == name) {
        ++n;
        EXPECT_EQ(e.kind, activity::range);
        EXPECT_EQ(t.domain_of(e), "pytorch");
        EXPECT_EQ(e.thread, 412u);
        EXPECT_GT(e.duration_ns(), 40'000'000);
      }
    EXPECT_EQ(n, 1u) << name;
  }
  EXPECT_EQ(c.by_name.count("ProfilerStep#2"), 0u);
  EXPECT_EQ(c.by_name.at("train step"), 5u);

  // Runtime calls carry the wait they stand for.
  std::map<std::string, sync_kind> sync_of;
  for (const event& e : t.events)
    if (e.kind == activity::api) {
      sync_of[std::string(t.name_of(e))] = e.sync;
      EXPECT_TRUE(e.thread == 412u || e.thread == 439u) << e.thread;
    }
  EXPECT_EQ(sync_of.at("cudaStreamSynchronize"), sync_kind::stream);
  EXPECT_EQ(sync_of.at("cudaDeviceSynchronize"), sync_kind::device);
  EXPECT_EQ(sync_of.at("cudaMemcpyAsync"), sync_kind::none);
  EXPECT_EQ(sync_of.at("cudaLaunchKernel"), sync_kind::none);

  // The exact timestamp of the first kernel: 4510777093564.041 us.
  const auto first_kernel = std::find_if(t.events.begin(), t.events.end(),
                                         [](const event& e) { return e.kind == activity::kernel; });
  ASSERT_NE(first_kernel, t.events.end());
  EXPECT_EQ(first_kernel->start_ns, 4'510'777'093'564'041);

  EXPECT_EQ(t.stream_names.at(7), "stream 7");
  EXPECT_EQ(t.thread_names.at(412), "thread 412 (python3)");
  EXPECT_EQ(t.thread_names.count(7), 0u);
}

TEST(TraceIo, kineto_prefetch_pinned_copies_on_a_side_stream) {
  const timeline t = read_trace(data_dir / "kineto_prefetch.json");
  std::size_t copies = 0;
  std::size_t on_copy_stream = 0;
  std::size_t without_launch = 0;
  for (const event& e : t.events) {
    if (e.kind != activity::memcpy) continue;
    ++copies;
    EXPECT_EQ(e.copy, copy_kind::h2d);
    EXPECT_EQ(e.src, mem_kind::pinned);
    EXPECT_EQ(e.dst, mem_kind::device);
    if (e.bytes == 25'165'824) {
      EXPECT_EQ(e.stream, 13u);
      EXPECT_TRUE(e.async);
      ++on_copy_stream;
    }
    // Correlation 645: its cudaMemcpyAsync fell before the capture window, so nothing says it was async.
    if (e.correlation == 645) {
      EXPECT_FALSE(e.async);
      ++without_launch;
    }
  }
  EXPECT_EQ(copies, 11u);
  EXPECT_EQ(on_copy_stream, 5u);
  EXPECT_EQ(without_launch, 1u);
  std::size_t waits = 0;
  for (const event& e : t.events)
    if (e.kind == activity::api && t.name_of(e) == "cudaStreamWaitEvent") {
      EXPECT_EQ(e.sync, sync_kind::stream_wait);
      ++waits;
    }
  EXPECT_EQ(waits, 5u);
  EXPECT_EQ(t.thread_names.at(484), "thread 484 (pt_autograd_0)");  // the later name wins
  EXPECT_EQ(t.stream_names.at(13), "stream 13");
}

TEST(TraceIo, kineto_import_writes_and_reads_back_equal) {
  const timeline t = read_trace(data_dir / "kineto_prefetch.json");
  const timeline back = parse_trace(to_chrome_json(t), "rewritten");
  EXPECT_EQ(ferry::test::timeline_difference(t, back), "");
}

TEST(TraceIo, kineto_sync_records_and_blocking_copies) {
  // Newer Kineto's cuda_sync records sit on the GPU track; the waiting thread is the matching call's.
  const std::string text = R"J({"schemaVersion":1,"traceEvents":[
    {"ph":"X","cat":"cuda_runtime","name":"cudaStreamSynchronize","pid":10,"tid":11,"ts":100,"dur":50,"args":{"correlation":5}},
    {"ph":"X","cat":"cuda_sync","name":"Stream Sync","pid":0,"tid":7,"ts":101,"dur":48,"args":{"correlation":5,"stream":7,"device":0}},
    {"ph":"X","cat":"cuda_sync","name":"Context Sync","pid":0,"tid":"stream 9","ts":200,"dur":1,"args":{"device":0}},
    {"ph":"X","cat":"cuda_runtime","name":"cudaMemcpy","pid":10,"tid":11,"ts":300,"dur":20,"args":{"correlation":6}},
    {"ph":"X","cat":"gpu_memcpy","name":"Memcpy DtoD (Device -> Device)","pid":0,"tid":7,"ts":305,"dur":5,"args":{"correlation":6,"bytes":64,"device":0,"stream":7}},
    {"ph":"X","cat":"cuda_runtime","name":"cudaEventSynchronize","pid":10,"tid":11,"ts":400,"dur":1,"args":{}},
    {"ph":"X","cat":"python_function","name":"train.py(12): step","pid":10,"tid":11,"ts":0,"dur":500},
    {"ph":"X","cat":"Trace","name":"PyTorch Profiler (0)","pid":"Spans","tid":"PyTorch Profiler","ts":0,"dur":1000},
    {"ph":"X","cat":"user_annotation","name":"named track","pid":"Spans","tid":"x","ts":0,"dur":1000},
    {"ph":"s","id":1,"pid":10,"tid":11,"ts":100,"cat":"ac2g","name":"ac2g"},
    {"ph":"i","s":"g","pid":"Traces","tid":"Trace","ts":0,"name":"start"}
  ]})J";
  const timeline t = parse_trace(text, "sync.json");
  ASSERT_EQ(t.events.size(), 7u);
  std::map<std::string, const event*> by_name;
  for (const event& e : t.events) by_name[std::string(t.name_of(e))] = &e;
  EXPECT_EQ(by_name.at("Stream Sync")->kind, activity::sync);
  EXPECT_EQ(by_name.at("Stream Sync")->sync, sync_kind::stream);
  EXPECT_EQ(by_name.at("Stream Sync")->thread, 11u);
  EXPECT_EQ(by_name.at("Stream Sync")->stream, 7u);
  EXPECT_EQ(by_name.at("Context Sync")->sync, sync_kind::device);
  EXPECT_EQ(by_name.at("Context Sync")->thread, 9u);
  EXPECT_EQ(by_name.at("cudaMemcpy")->sync, sync_kind::copy);
  EXPECT_EQ(by_name.at("cudaEventSynchronize")->sync, sync_kind::event);
  const event& copy = *by_name.at("Memcpy DtoD (Device -> Device)");
  EXPECT_EQ(copy.copy, copy_kind::d2d);
  EXPECT_FALSE(copy.async) << "launched by cudaMemcpy";
  EXPECT_EQ(copy.bytes, 64u);
  EXPECT_EQ(t.domain_of(*by_name.at("train.py(12): step")), "pytorch.op");
  EXPECT_EQ(by_name.count("named track"), 0u);
}

TEST(TraceIo, a_chrome_trace_without_ferry_or_kineto_marks_is_read_as_chrome) {
  const timeline t =
      parse_trace(R"([{"ph":"X","cat":"kernel","name":"k","pid":0,"tid":3,"ts":1.5,"dur":2}])", "bare");
  EXPECT_EQ(t.source, "chrome trace");
  ASSERT_EQ(t.events.size(), 1u);
  EXPECT_EQ(t.events[0].start_ns, 1500);
  EXPECT_EQ(t.events[0].end_ns, 3500);
  EXPECT_EQ(t.events[0].stream, 3u);
  EXPECT_EQ(t.events[0].device, 0);
}

TEST(TraceIo, exact_microsecond_text_to_nanoseconds) {
  auto start = [](const std::string& ts) {
    const timeline t =
        parse_trace(R"({"traceEvents":[{"ph":"X","cat":"kernel","name":"k","pid":0,"tid":1,"ts":)" + ts +
                        R"(,"dur":0}]})",
                    "ts");
    return t.events.at(0).start_ns;
  };
  EXPECT_EQ(start("4510785932383.927"), 4'510'785'932'383'927);
  EXPECT_EQ(start("9199999999999999.999"), 9'199'999'999'999'999'999);
  EXPECT_EQ(start("0.0005"), 1);  // half away from zero
  EXPECT_EQ(start("0.0004999"), 0);
  EXPECT_EQ(start("-1.5"), -1500);
  EXPECT_EQ(start("1.5e3"), 1'500'000);
  EXPECT_EQ(start("15E-4"), 2);
  EXPECT_EQ(start("0e999999999999"), 0);
  EXPECT_EQ(start("1e-999999999999"), 0);
  EXPECT_EQ(start("42"), 42'000);
  EXPECT_EQ(start("-9200000000000000"), -9'200'000'000'000'000'000);
}

// --- errors --------------------------------------------------------------------------------------

void expect_contains(const std::string& message, std::initializer_list<std::string_view> parts) {
  for (const std::string_view p : parts)
    EXPECT_NE(message.find(p), std::string::npos) << "\"" << p << "\" not in: " << message;
}

TEST(TraceIo, empty_input_is_refused) {
  expect_contains(parse_error(""), {"t.json", "empty input"});
  expect_contains(parse_error(" \n\t "), {"t.json", "empty input"});
}

TEST(TraceIo, not_json_is_refused_with_the_offset) {
  expect_contains(parse_error("hello"), {"t.json", "invalid JSON at byte 0", "expected"});
  expect_contains(parse_error(R"({"traceEvents":[]} trailing)"),
                  {"t.json", "invalid JSON at byte 21 (of 27)"});
  expect_contains(parse_error("42"), {"t.json", "top level", "expected a JSON object"});
}

TEST(TraceIo, truncated_json_names_the_offset) {
  const std::string full = to_chrome_json(sample_timeline());
  const std::string cut = full.substr(0, full.size() / 2);
  expect_contains(parse_error(cut), {"t.json", "truncated JSON at byte " + std::to_string(cut.size())});
  expect_contains(parse_error(R"({"traceEvents":[{"ph":"X")"), {"truncated JSON at byte 25 (of 25)"});
}

TEST(TraceIo, trace_events_must_be_an_array_of_objects) {
  expect_contains(parse_error(R"({"traceEvents":{}})"), {"t.json", "traceEvents: expected an array"});
  expect_contains(parse_error(R"({"traceEvents":"x"})"),
                  {"traceEvents: expected an array", "found a string"});
  expect_contains(parse_error(R"({"traceEvents":[{"ph":"M"},3]})"),
                  {"traceEvents[1]: expected an event object"});
  expect_contains(parse_error(R"({"schemaVersion":1})"), {"no traceEvents array"});
}

// In a ferry trace (its "ferry" object first, as ferry writes it) an odd time refuses the file.
const std::string ferry_head = R"({"ferry":{"format":1},"traceEvents":[)";

TEST(TraceIo, event_missing_ts_is_named) {
  expect_contains(parse_error(ferry_head + R"({"ph":"M"},{"ph":"X","name":"k","dur":1}]})"),
                  {"t.json", "traceEvents[1]", "no ts"});
  expect_contains(parse_error(ferry_head + R"({"ph":"X","name":"k","ts":1}]})"),
                  {"traceEvents[0]", "no dur"});
  expect_contains(parse_error(ferry_head + R"({"ph":"X","ts":"12","dur":1}]})"),
                  {"traceEvents[0].ts", "expected a number of microseconds", "found a string"});
}

TEST(TraceIo, negative_dur_is_named) {
  expect_contains(
      parse_error(ferry_head + R"({"ph":"X","ts":1,"dur":1,"cat":"kernel"},{"ph":"X","ts":1,"dur":-0.5}]})"),
      {"t.json", "traceEvents[1].dur", "negative"});
}

TEST(TraceIo, timestamps_beyond_int64_nanoseconds_are_refused) {
  expect_contains(parse_error(ferry_head + R"({"ph":"X","ts":9.3e15,"dur":1}]})"),
                  {"traceEvents[0].ts = 9.3e15 us is out of range", "9.2e+15"});
  expect_contains(parse_error(R"({"traceEvents":[{"ph":"X","ts":1e999,"dur":1}]})"),
                  {"byte 35", "number overflow"});
  expect_contains(parse_error(ferry_head + R"({"ph":"X","ts":18446744073709551615,"dur":1}]})"),
                  {"traceEvents[0].ts", "out of range"});
  expect_contains(parse_error(ferry_head + R"({"ph":"X","ts":9.1e15,"dur":9.1e15}]})"), {"ts + dur"});
}

// --- traces ferry did not write: odd records are skipped and counted ------------------------------

// Every field the Kineto importer reads, with an odd value: the record is skipped (and counted by
// reason), or, where the value has a known meaning, mapped; the rest of the file is read.
TEST(TraceIo, kineto_odd_records_are_skipped_and_counted_not_refused) {
  const std::string text = R"J({"schemaVersion":1,"traceEvents":[
    {"ph":"X","cat":"cuda_runtime","name":"cudaEventSynchronize","pid":10,"tid":11,"ts":100,"dur":50,"args":{"correlation":5}},
    {"ph":"X","cat":"cuda_sync","name":"Event Sync","pid":0,"tid":7,"ts":101,"dur":48,"args":{"correlation":5,"stream":-1,"device":0}},
    {"ph":"X","cat":"kernel","name":"good","pid":0,"tid":7,"ts":200,"dur":10,"args":{"correlation":-1,"stream":7,"device":0}},
    {"ph":"X","cat":"kernel","name":"k stream -1","pid":0,"tid":7,"ts":210,"dur":10,"args":{"stream":-1,"device":0}},
    {"ph":"X","cat":"kernel","name":"k stream text","pid":0,"tid":7,"ts":210,"dur":10,"args":{"stream":"7","device":0}},
    {"ph":"X","cat":"kernel","name":"k device -2","pid":0,"tid":7,"ts":210,"dur":10,"args":{"stream":7,"device":-2}},
    {"ph":"X","cat":"kernel","name":"k corr text","pid":0,"tid":7,"ts":210,"dur":10,"args":{"stream":7,"correlation":"x"}},
    {"ph":"X","cat":"gpu_memcpy","name":"Memcpy HtoD (Pinned -> Device)","pid":0,"tid":7,"ts":220,"dur":10,"args":{"stream":7,"bytes":-1}},
    {"ph":"X","cat":"gpu_memset","name":"Memset (Device)","pid":0,"tid":7,"ts":230,"dur":10,"args":{"stream":7,"bytes":1.5}},
    {"ph":"X","cat":"cpu_op","name":"no ts","pid":10,"tid":11,"dur":10},
    {"ph":"X","cat":"cpu_op","name":"no dur","pid":10,"tid":11,"ts":1},
    {"ph":"X","cat":"cpu_op","name":"ts text","pid":10,"tid":11,"ts":"1","dur":1},
    {"ph":"X","cat":"cpu_op","name":"ts object","pid":10,"tid":11,"ts":{},"dur":1},
    {"ph":"X","cat":"cpu_op","name":"negative dur","pid":10,"tid":11,"ts":1,"dur":-1},
    {"ph":"X","cat":"cpu_op","name":"ts huge","pid":10,"tid":11,"ts":9.3e15,"dur":1},
    {"ph":"X","cat":"cpu_op","name":"end huge","pid":10,"tid":11,"ts":9.1e15,"dur":9.1e15},
    {"ph":"X","cat":"cpu_op","name":7,"pid":10,"tid":11,"ts":1,"dur":1},
    {"ph":"X","cat":["cpu_op"],"name":"cat array","pid":10,"tid":11,"ts":1,"dur":1},
    {"ph":5,"cat":"cpu_op","name":"ph number","pid":10,"tid":11,"ts":1,"dur":1},
    {"ph":"X","cat":"cuda_sync","name":"Context Sync","pid":0,"tid":"Spans","ts":300,"dur":1,"args":{"stream":-1}},
    {"ph":"X","cat":"cuda_sync","name":"Stream Sync","pid":0,"tid":7,"ts":300,"dur":1,"args":{"stream":-3}},
    {"ph":"X","cat":"cuda_sync","name":"Event Sync","pid":0,"tid":"Spans","ts":300,"dur":1,"args":{"correlation":99,"stream":-1}},
    {"ph":"X","cat":"cpu_op","name":"ok op","pid":10,"tid":11,"ts":1,"dur":400,"args":{"stream":-1}},
    {"ph":"X","cat":"Trace","name":"ignored, not counted","pid":10,"tid":11,"ts":-5,"dur":-1}
  ]})J";
  const timeline t = parse_trace(text, "odd.json");
  std::map<std::string, const event*> by_name;
  for (const event& e : t.events) by_name[std::string(t.name_of(e))] = &e;
  EXPECT_EQ(by_name.size(), 4u) << "kept: cudaEventSynchronize, Event Sync, good, ok op";
  ASSERT_EQ(by_name.count("Event Sync"), 1u) << "stream -1 on a sync record means no stream";
  EXPECT_EQ(by_name.at("Event Sync")->stream, 0u);
  EXPECT_EQ(by_name.at("Event Sync")->thread, 11u);
  EXPECT_EQ(by_name.at("Event Sync")->sync, sync_kind::event);
  ASSERT_EQ(by_name.count("good"), 1u);
  EXPECT_EQ(by_name.at("good")->correlation, 0u) << "correlation -1 means none";
  EXPECT_EQ(by_name.count("ok op"), 1u) << "a field ferry does not read on this record is not checked";
  const std::map<std::string, std::uint64_t> expected{
      {"kernel record: args.stream is not a stream id (a non-negative integer)", 2},
      {"kernel record: args.device is not a device ordinal", 1},
      {"kernel record: args.correlation is not an integer", 1},
      {"gpu_memcpy record: args.bytes is not a byte count (a non-negative integer)", 1},
      {"gpu_memset record: args.bytes is not a byte count (a non-negative integer)", 1},
      {"cpu_op record: no ts", 1},
      {"cpu_op record: no dur", 1},
      {"cpu_op record: ts is not a number", 2},
      {"cpu_op record: negative dur", 1},
      {"cpu_op record: ts is out of range (int64 nanoseconds)", 1},
      {"cpu_op record: ts + dur is beyond int64 nanoseconds", 1},
      {"cpu_op record: name is not a string", 1},
      {"a record whose cat is not a string", 1},
      {"a record whose ph is not a string", 1},
      {"cuda_sync record: no thread and no correlation with a runtime call", 1},
      {"cuda_sync record: args.stream is not a stream id", 1},
      {"cuda_sync record: no thread (its track is not a thread, and no runtime call has its correlation)", 1},
  };
  EXPECT_EQ(t.skipped, expected);
}

// The first report: Kineto's Event Sync records carry "stream": -1, and the whole file was refused.
TEST(TraceIo, kineto_event_sync_with_stream_minus_one_is_read) {
  const timeline t = parse_trace(
      R"({"traceEvents":[{"ph":"X","cat":"cuda_sync","name":"Event Sync","pid":0,"tid":7,"ts":1,"dur":2,)"
      R"("args":{"device":0,"stream":-1,"correlation":0}},)"
      R"({"ph":"X","cat":"kernel","name":"k","pid":0,"tid":7,"ts":1,"dur":2,"args":{"stream":7}}]})",
      "sync.json");
  ASSERT_EQ(t.events.size(), 2u);
  EXPECT_TRUE(t.skipped.empty());
}

// A "ferry" object after traceEvents: the events are read (again) as ferry's, whose odd fields refuse.
TEST(TraceIo, a_ferry_object_after_the_events_reads_them_as_ferry_events) {
  const timeline t = parse_trace(
      R"({"traceEvents":[{"ph":"X","name":"r","ts":1,"dur":2,"args":{"kind":"range","thread":5}}],)"
      R"("ferry":{"format":1,"source":"late header"}})",
      "late.json");
  EXPECT_EQ(t.source, "late header");
  ASSERT_EQ(t.events.size(), 1u);
  EXPECT_EQ(t.events[0].kind, activity::range);
  EXPECT_EQ(t.events[0].thread, 5u);
  expect_contains(parse_error(R"({"traceEvents":[{"ph":"X","ts":"1","dur":1}],"ferry":{}})"),
                  {"traceEvents[0].ts", "expected a number of microseconds"});
}

// PyTorch 1.8 to 1.10 named categories "Kernel", "Memcpy", "Memset", "Runtime", "Operator", "Python".
TEST(TraceIo, older_pytorch_category_spellings_are_read) {
  const std::string text = R"J({"schemaVersion":1,"traceEvents":[
    {"ph":"X","cat":"Operator","name":"ProfilerStep#3","pid":10,"tid":11,"ts":0,"dur":1000},
    {"ph":"X","cat":"Python","name":"train.py(3): loop","pid":10,"tid":11,"ts":1,"dur":900},
    {"ph":"X","cat":"Runtime","name":"cudaMemcpyAsync","pid":10,"tid":11,"ts":10,"dur":5,"args":{"correlation":4}},
    {"ph":"X","cat":"Runtime","name":"cudaLaunchKernel","pid":10,"tid":11,"ts":20,"dur":5,"args":{"correlation":5}},
    {"ph":"X","cat":"Memcpy","name":"Memcpy HtoD (Pinned -> Device)","pid":0,"tid":"stream 7","ts":12,"dur":30,"args":{"device":0,"stream":7,"correlation":4,"bytes":1024}},
    {"ph":"X","cat":"Kernel","name":"gemm","pid":0,"tid":"stream 7","ts":50,"dur":100,"args":{"device":0,"stream":7,"correlation":5}},
    {"ph":"X","cat":"Memset","name":"Memset (Device)","pid":0,"tid":"stream 7","ts":160,"dur":1,"args":{"device":0,"stream":7,"bytes":8}},
    {"ph":"X","cat":"User","name":"ProfilerStep#3","pid":0,"tid":"stream 7 user","ts":0,"dur":1000}
  ]})J";
  const timeline t = parse_trace(text, "old.json");
  std::map<std::string, const event*> by_name;
  for (const event& e : t.events) by_name[std::string(t.name_of(e))] = &e;
  ASSERT_EQ(t.events.size(), 7u);
  EXPECT_EQ(by_name.at("gemm")->kind, activity::kernel);
  EXPECT_EQ(by_name.at("gemm")->stream, 7u);
  const event& copy = *by_name.at("Memcpy HtoD (Pinned -> Device)");
  EXPECT_EQ(copy.kind, activity::memcpy);
  EXPECT_EQ(copy.copy, copy_kind::h2d);
  EXPECT_TRUE(copy.async) << "launched by cudaMemcpyAsync";
  EXPECT_EQ(by_name.at("Memset (Device)")->kind, activity::memset);
  EXPECT_EQ(by_name.at("cudaLaunchKernel")->kind, activity::api);
  EXPECT_EQ(by_name.at("ProfilerStep#3")->kind, activity::range);
  EXPECT_EQ(by_name.at("ProfilerStep#3")->thread, 11u);
  EXPECT_EQ(t.domain_of(*by_name.at("train.py(3): loop")), "pytorch.op");
  EXPECT_TRUE(t.skipped.empty());
}

TEST(TraceIo, too_deep_nesting_is_refused) {
  std::string deep = R"({"traceEvents":[{"ph":"X","ts":1,"dur":1,"args":{"a":)";
  for (int i = 0; i < 100; ++i) deep += '[';
  for (int i = 0; i < 100; ++i) deep += ']';
  deep += "}}]}";
  expect_contains(parse_error(deep),
                  {"t.json", "nested deeper than 64 levels", "max_depth", "traceEvents[0].args.a"});
  read_limits shallow;
  shallow.max_depth = 3;
  expect_contains(parse_error(R"({"traceEvents":[{"args":{}}]})", shallow),
                  {"deeper than 3", "traceEvents[0].args"});
  // A million brackets neither overflow the stack nor pass.
  expect_contains(parse_error(R"({"x":)" + std::string(1'000'000, '[')), {"nested deeper than 64"});
}

TEST(TraceIo, too_many_events_is_refused) {
  read_limits few;
  few.max_events = 2;
  const std::string three = R"({"traceEvents":[{"ph":"i"},{"ph":"i"},{"ph":"i"}]})";
  expect_contains(parse_error(three, few),
                  {"t.json", "more than 2 trace events", "max_events", "traceEvents[2]"});
  few.max_events = 3;
  EXPECT_NO_THROW((void)parse_trace(three, "t.json", few));
}

TEST(TraceIo, too_big_input_is_refused_before_parsing) {
  read_limits tiny;
  tiny.max_bytes = 10;
  expect_contains(parse_error(R"({"traceEvents":[]} )", tiny),
                  {"t.json", "19 bytes", "max_bytes (10 bytes)"});
  expect_contains(parse_error(std::string(11, '{'), tiny), {"max_bytes"});  // not a JSON error
}

TEST(TraceIo, file_too_big_or_missing_names_the_path) {
  temp_dir dir;
  const fs::path p = dir.path / "big.json";
  write_chrome_trace(sample_timeline(), p);
  read_limits tiny;
  tiny.max_bytes = 100;
  const std::string big = error_of([&] { (void)read_trace(p, tiny); });
  expect_contains(big, {p.string(), "max_bytes (100 bytes)", std::to_string(fs::file_size(p)) + " bytes"});
  const std::string missing = error_of([&] { (void)read_trace(dir.path / "nope.json"); });
  expect_contains(missing, {(dir.path / "nope.json").string(), "cannot open"});
  const std::string directory = error_of([&] { (void)read_trace(dir.path); });
  expect_contains(directory, {dir.path.string(), "not a regular file"});
}

TEST(TraceIo, ferry_fields_of_the_wrong_form_are_named) {
  const std::string head = R"({"ferry":{"format":1},"traceEvents":[)";
  expect_contains(parse_error(head + R"({"ph":"X","ts":1,"dur":1,"args":{"kind":"warp"}}]})"),
                  {"traceEvents[0].args.kind", "unknown activity \"warp\""});
  expect_contains(parse_error(head + R"({"ph":"X","ts":1,"dur":1,"args":{"kind":"memcpy","bytes":-4}}]})"),
                  {"traceEvents[0].args.bytes", "non-negative integer", "-4"});
  expect_contains(
      parse_error(head + R"({"ph":"X","ts":1,"dur":1,"args":{"kind":"kernel","device":4294967296}}]})"),
      {"traceEvents[0].args.device", "device ordinal"});
  expect_contains(parse_error(head + R"({"ph":"X","ts":1,"dur":1}]})"),
                  {"traceEvents[0]", "no args.kind and no cat"});
  expect_contains(parse_error(R"({"ferry":{"format":2},"traceEvents":[]})"),
                  {"ferry.format", "version 2 is newer"});
  expect_contains(parse_error(R"({"ferry":{"thread_names":{"main":"x"}},"traceEvents":[]})"),
                  {"ferry.thread_names", "\"main\" is not an id"});
  expect_contains(parse_error(R"({"ferry":{"metadata":{"a":1}},"traceEvents":[]})"),
                  {"ferry.metadata.a", "expected a string"});
  expect_contains(parse_error(R"({"ferry":[],"traceEvents":[]})"), {"ferry: expected an object"});
}

TEST(TraceIo, invalid_utf8_is_refused_and_never_written) {
  expect_contains(parse_error("{\"traceEvents\":[{\"name\":\"\xff\"}]}"), {"invalid JSON at byte"});
  timeline t;
  event e;
  e.kind = activity::range;
  e.name = t.strings.intern("bad \xff\xfe byte \xe2\x82");
  t.events.push_back(e);
  const timeline back = parse_trace(to_chrome_json(t), "utf8");
  ASSERT_EQ(back.events.size(), 1u);
  EXPECT_EQ(back.name_of(back.events[0]), "bad \xef\xbf\xbd\xef\xbf\xbd byte \xef\xbf\xbd\xef\xbf\xbd");
}

// --- gzip and streaming ----------------------------------------------------------------------------

// `text` gzip-compressed (one member), at `level`.
std::string gzip(std::string_view text, int level = 6) {
  z_stream z{};
  EXPECT_EQ(deflateInit2(&z, level, Z_DEFLATED, 16 + MAX_WBITS, 8, Z_DEFAULT_STRATEGY), Z_OK);
  std::string out(deflateBound(&z, text.size()) + 64, '\0');
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(text.data()));
  z.avail_in = static_cast<uInt>(text.size());
  z.next_out = reinterpret_cast<Bytef*>(out.data());
  z.avail_out = static_cast<uInt>(out.size());
  EXPECT_EQ(deflate(&z, Z_FINISH), Z_STREAM_END);
  out.resize(z.total_out);
  deflateEnd(&z);
  return out;
}

// A trace_input over `bytes` whose reader hands out at most `piece` bytes per call.
trace_input pieces(const std::string& bytes, std::size_t piece, std::string origin = "pieces") {
  trace_input in;
  in.origin = std::move(origin);
  in.size = bytes.size();
  in.open = [&bytes, piece] {
    return [&bytes, piece, at = std::size_t{0}](char* buf, std::size_t capacity) mutable {
      const std::size_t n = std::min({piece, capacity, bytes.size() - at});
      std::copy_n(bytes.data() + at, n, buf);
      at += n;
      return n;
    };
  };
  return in;
}

TEST(TraceIo, gzip_input_is_recognised_by_its_magic_bytes_and_reads_the_same) {
  const std::string plain = read_file(data_dir / "kineto_naive.json");
  const timeline expected = parse_trace(plain, "plain");
  const std::string gz = gzip(plain);
  ASSERT_LT(gz.size(), plain.size());
  EXPECT_EQ(ferry::test::timeline_difference(expected, parse_trace(gz, "naive.pt.trace.json.gz")), "");
  // By content, not by name: a .json file holding gzip, as a file.
  temp_dir dir;
  const fs::path p = dir.path / "misnamed.json";
  std::ofstream(p, std::ios::binary) << gz;
  EXPECT_EQ(ferry::test::timeline_difference(expected, read_trace(p)), "");
  // Concatenated members (`cat a.gz b.gz`) inflate to the concatenated text.
  const std::string half = plain.substr(0, plain.size() / 2);
  EXPECT_EQ(ferry::test::timeline_difference(
                expected, parse_trace(gzip(half) + gzip(plain.substr(half.size())), "two members")),
            "");
}

TEST(TraceIo, truncated_or_corrupt_gzip_is_refused_naming_the_position) {
  const std::string gz = gzip(to_chrome_json(sample_timeline()));
  const std::string cut = gz.substr(0, gz.size() / 2);
  expect_contains(parse_error(cut),
                  {"t.json", "truncated gzip stream", std::to_string(cut.size()) + " compressed bytes"});
  std::string corrupt = gz;
  for (std::size_t i = 20; i < 40; ++i) corrupt[i] = static_cast<char>(~corrupt[i]);
  expect_contains(parse_error(corrupt), {"t.json", "corrupt gzip stream near compressed byte"});
  expect_contains(parse_error(gz + "garbage"), {"t.json", "7 bytes after the end of the gzip stream"});
  // The inflated JSON is checked as plain JSON is, its offsets counted in the inflated stream.
  expect_contains(parse_error(gzip(R"({"traceEvents":[}")")),
                  {"t.json", "invalid JSON at byte 16 of the inflated stream"});
  expect_contains(parse_error(gzip(R"({"traceEvents":[)")), {"t.json", "truncated JSON at byte 16"});
  expect_contains(parse_error(gzip("  \n ")), {"t.json", "empty input"});
}

TEST(TraceIo, a_gzip_bomb_stops_at_max_bytes_of_inflated_text) {
  // 64 MiB of whitespace inside traceEvents compresses to ~64 KiB; the limit applies to what inflates.
  std::string text = R"({"traceEvents":[)";
  text.append(std::size_t{64} << 20, ' ');
  text += "]}";
  const std::string gz = gzip(text, 9);
  ASSERT_LT(gz.size(), std::size_t{1} << 20);
  read_limits limits;
  limits.max_bytes = std::size_t{16} << 20;
  expect_contains(parse_error(gz, limits),
                  {"t.json", "inflates to more than read_limits::max_bytes (16777216 bytes)"});
  limits.max_bytes = std::size_t{128} << 20;
  EXPECT_TRUE(parse_trace(gz, "t.json", limits).events.empty());
}

// The reader reads in chunks: whatever the pieces the input arrives in (1 byte, 7 bytes, ...), a
// token, a number, an escape or a UTF-8 sequence split across them reads the same timeline.
TEST(TraceIo, pieces_of_any_size_read_the_same_timeline) {
  const std::string kineto = read_file(data_dir / "kineto_prefetch.json");
  const std::string ferry = to_chrome_json(sample_timeline());
  for (const std::string* text : {&kineto, &ferry}) {
    const timeline expected = parse_trace(*text, "whole");
    const std::string gz = gzip(*text);
    for (const std::size_t piece : {1, 2, 3, 7, 64, 4093, 1 << 20}) {
      EXPECT_EQ(ferry::test::timeline_difference(expected, read_trace(pieces(*text, piece))), "") << piece;
      EXPECT_EQ(ferry::test::timeline_difference(expected, read_trace(pieces(gz, piece))), "") << piece;
    }
  }
  // Errors name the same position whatever the pieces.
  const std::string bad = R"({"traceEvents":[{"ph":"X",)" + std::string(5000, ' ') + "x]}";
  for (const std::size_t piece : {1, 13, 1 << 20})
    expect_contains(error_of([&] { (void)read_trace(pieces(bad, piece, "bad")); }),
                    {"bad", "invalid JSON at byte 5026 (of 5029)"});
}

// Long runs of blanks between tokens are cut before the parser sees them (they would cost it memory);
// blanks inside strings are data and stay, and errors still name offsets in the input.
TEST(TraceIo, long_blank_runs_read_the_same_and_errors_keep_their_offsets) {
  const std::string blanks(std::size_t{3} << 19, ' ');  // spans the reader's 1 MiB chunks
  const std::string name = "a name with " + std::string(300, ' ') + "\\t\\n inside";  // JSON escapes
  const std::string text = R"({"traceEvents":[)" + blanks + R"({"ph":"X","cat":"cpu_op","name":")" + name +
                           R"(","pid":1,"tid":1,"ts":1,"dur":)" + blanks + "2}" + blanks + "]}";
  for (const std::size_t piece : {std::size_t{1} << 20, std::size_t{4099}}) {
    const timeline t = read_trace(pieces(text, piece));
    ASSERT_EQ(t.events.size(), 1u);
    EXPECT_EQ(t.name_of(t.events[0]), "a name with " + std::string(300, ' ') + "\t\n inside");
    EXPECT_EQ(t.events[0].end_ns, 3000);
  }
  const std::string bad = text.substr(0, text.size() - 2) + "x]}";
  const std::string expected = "invalid JSON at byte " + std::to_string(bad.size() - 3);
  expect_contains(parse_error(bad), {expected});
  expect_contains(parse_error(gzip(bad)), {expected + " of the inflated stream"});
  const std::string cut = text.substr(0, text.size() - 2);
  expect_contains(parse_error(cut), {"truncated JSON at byte " + std::to_string(cut.size())});
}

// A ferry trace whose "ferry" object follows its events is opened twice; any other input once.
TEST(TraceIo, only_a_late_ferry_object_reads_the_input_twice) {
  const std::string late =
      R"({"traceEvents":[{"ph":"X","name":"r","ts":1,"dur":2,"args":{"kind":"range"}}],"ferry":{}})";
  const std::string early = to_chrome_json(sample_timeline());
  for (const auto& [text, opens] : {std::pair{&late, 2}, std::pair{&early, 1}}) {
    trace_input in = pieces(*text, 5);
    int count = 0;
    auto open = in.open;
    in.open = [&] {
      ++count;
      return open();
    };
    (void)read_trace(in);
    EXPECT_EQ(count, opens);
  }
}

TEST(TraceIo, progress_is_quiet_for_a_quick_read) {
  std::vector<std::string> lines;
  temp_dir dir;
  write_chrome_trace(sample_timeline(), dir.path / "t.json");
  (void)read_trace(dir.path / "t.json", {}, [&](const std::string& line) { lines.push_back(line); });
  EXPECT_TRUE(lines.empty()) << "lines start after 2 s of reading";
}

// --- the fuzz corpus -----------------------------------------------------------------------------

// Every seed and every input the fuzzer once crashed on: parse_trace (and parse_process_file) returns or
// throws input_error, and what it returns writes and reads back equal. CI replays these without clang's
// libFuzzer.
TEST(TraceIo, fuzz_corpus_replays_cleanly) {
  ASSERT_TRUE(fs::is_directory(corpus_dir)) << corpus_dir;
  read_limits small;
  small.max_bytes = 1 << 20;
  small.max_events = 4096;
  small.max_depth = 32;
  std::size_t files = 0;
  std::size_t parsed = 0;
  for (const auto& entry : fs::directory_iterator(corpus_dir)) {
    if (!entry.is_regular_file()) continue;
    ++files;
    const std::string text = read_file(entry.path());
    try {
      static_cast<void>(parse_process_file(text, entry.path().filename().string(), small));
    } catch (const ferry::input_error&) {
      // Refused cleanly (most seeds are Chrome traces).
    } catch (const std::exception& e) {
      ADD_FAILURE() << entry.path() << ": the process file reader threw, not an input_error: " << e.what();
    }
    try {
      const timeline t = parse_trace(text, entry.path().filename().string(), small);
      ++parsed;
      const timeline back = parse_trace(to_chrome_json(t), "rewritten");
      EXPECT_EQ(ferry::test::timeline_difference(t, back), "") << entry.path();
    } catch (const ferry::input_error&) {
      // Refused cleanly.
    } catch (const std::exception& e) {
      ADD_FAILURE() << entry.path() << ": not an input_error: " << e.what();
    }
  }
  EXPECT_GE(files, 20u);
  EXPECT_GE(parsed, 5u);  // the seeds include well-formed traces
}

}  // namespace
