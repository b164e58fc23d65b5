// The HTML report: structure and escaping on hand-built analyses (names that try to break out of the
// markup), merging and the rect cap on traces of a million events, a recorded Kineto trace through the
// real importer and analyzer, and the rendering in headless Chromium: a probe script in the page
// (layout_probe.js, embedded at build time) measures what was drawn and the test compares it with what
// the generator emitted.
//
// FERRY_TEST_BROWSER=off skips the browser tests (sanitizer runs); FERRY_CHROMIUM names another browser
// binary; FERRY_TEST_KEEP_REPORTS=1 keeps the rendered pages and screenshots under the temp directory.
#include "ferry/report/report_html.hpp"

#include "ferry/trace/trace_io.hpp"

#include <gtest/gtest.h>
#include <unistd.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <system_error>

#include "ferry_embedded/layout_probe_js.hpp"

namespace ferry::trace {
namespace {

namespace fs = std::filesystem;

constexpr const char* evil = "<script>alert(\"x&y\")</script>'";
constexpr const char* evil_escaped = "&lt;script&gt;alert(&quot;x&amp;y&quot;)&lt;/script&gt;&#39;";

// The page end the browser tests put in: the probe writes its measurement into the <pre>.
const std::string& probe_markup() {
  static const std::string markup = "<pre id=\"render-check\"></pre>\n<script>\n" +
                                    std::string(ferry::embedded::layout_probe_js) + "</script>\n";
  return markup;
}

html_options with_probe() {
  html_options o;
  o.body_end = probe_markup();
  return o;
}

std::size_t count(const std::string& hay, const std::string& needle) {
  std::size_t n = 0;
  for (auto pos = hay.find(needle); pos != std::string::npos; pos = hay.find(needle, pos + needle.size()))
    ++n;
  return n;
}

constexpr std::int64_t ms = 1'000'000;

event gpu(timeline& t, activity k, std::string_view name, std::int64_t start, std::int64_t end,
          std::uint64_t stream, copy_kind c = copy_kind::none, std::uint64_t bytes = 0) {
  event e;
  e.kind = k;
  e.name = t.strings.intern(name);
  e.start_ns = start;
  e.end_ns = end;
  e.device = 0;
  e.stream = stream;
  e.copy = c;
  e.bytes = bytes;
  return e;
}

event cpu(timeline& t, activity k, std::string_view name, std::int64_t start, std::int64_t end,
          std::uint64_t thread) {
  event e;
  e.kind = k;
  e.name = t.strings.intern(name);
  e.start_ns = start;
  e.end_ns = end;
  e.thread = thread;
  return e;
}

step_breakdown make_step(int index, std::int64_t start, std::int64_t end) {
  step_breakdown s;
  s.index = index;
  s.start_ns = start;
  s.end_ns = end;
  s.wall_ms = static_cast<double>(end - start) / 1e6;
  s.compute_ms = 4 + index;
  s.h2d_ms = 2;
  s.d2h_ms = 0.5;
  s.d2d_ms = 0.25;
  s.comm_ms = 0;  // a zero category draws no segment
  s.idle_ms = s.wall_ms - s.compute_ms - s.h2d_ms - s.d2h_ms - s.d2d_ms;
  s.utilization = 1 - s.idle_ms / s.wall_ms;
  s.h2d_bytes = 64 << 20;
  return s;
}

// Four steps of 10 ms; two GPU streams (one named), two CPU threads (one named) with nested ranges, and
// names that try to break out of the markup.
struct fixture {
  timeline t;
  analysis a;
};

fixture make_fixture(std::uint64_t dropped = 0) {
  fixture f;
  timeline& t = f.t;
  t.source = std::string("test <source> ") + evil;
  t.device_name = "Emulated & GPU";
  t.stream_names[7] = "compute";
  t.thread_names[100] = std::string("main ") + evil;
  t.metadata["command"] = std::string("bench --level=3 ") + evil;
  t.dropped = dropped;
  for (int s = 0; s < 4; ++s) {
    const std::int64_t b = s * 10 * ms;
    t.events.push_back(cpu(t, activity::range, "step", b, b + 10 * ms, 100));
    t.events.push_back(cpu(t, activity::range, evil, b, b + 3 * ms, 100));  // nested in the step
    t.events.push_back(cpu(t, activity::api, "cudaMemcpyAsync", b + ms, b + 2 * ms, 100));  // nested deeper
    t.events.push_back(cpu(t, activity::sync, "cudaStreamSynchronize", b + 8 * ms, b + 10 * ms, 100));
    t.events.push_back(cpu(t, activity::stage, "egress sink", b + 2 * ms, b + 6 * ms, 200));
    t.events.push_back(
        gpu(t, activity::memcpy, "Memcpy HtoD", b + ms, b + 3 * ms, 13, copy_kind::h2d, 64 << 20));
    t.events.push_back(gpu(t, activity::kernel, evil, b + 3 * ms, b + 7 * ms, 7));
    t.events.push_back(gpu(t, activity::kernel, "ncclAllReduce", b + 7 * ms, b + 7 * ms + 200'000, 7));
    t.events.push_back(
        gpu(t, activity::memcpy, "Memcpy DtoH", b + 7 * ms, b + 8 * ms, 13, copy_kind::d2h, 1 << 20));
    t.events.push_back(gpu(t, activity::memset, "Memset", b + 8 * ms, b + 8 * ms, 13));  // zero duration
  }
  t.sort();

  analysis& a = f.a;
  a.source = t.source;
  a.device_name = t.device_name;
  a.dropped = dropped;
  a.step_prefix = "step";
  for (int s = 0; s < 4; ++s) a.steps.push_back(make_step(s, s * 10 * ms, (s + 1) * 10 * ms));
  a.mean = make_step(-1, 0, 10 * ms);
  a.mean.compute_ms = 5.5;
  a.mean.idle_ms = 10 - 5.5 - 2 - 0.5 - 0.25;
  idle_attribution main_range;
  main_range.thread = std::string("main ") + evil;
  main_range.activity = evil;
  main_range.idle_ms = 3.5;
  main_range.fraction_of_idle = 0.7;
  main_range.main_thread = true;
  idle_attribution sink_wait;
  sink_wait.thread = "thread 200";
  sink_wait.activity = "cudaStreamSynchronize";
  sink_wait.idle_ms = 1.5;
  sink_wait.fraction_of_idle = 0.3;
  sink_wait.blocking = true;
  a.idle = {main_range, sink_wait};
  finding f1;
  f1.rule = "gpu_idle";
  f1.title = std::string("GPU idle 35% of each step in ") + evil;
  f1.evidence = std::string("3.5 ms per step inside ") + evil;
  f1.fix = std::string("Prefetch with ferry::ingest::prefetcher & ") + evil;
  f1.cost_ms_per_step = 3.5;
  f1.numbers["idle_ms"] = 3.5;
  finding f2;
  f2.rule = "pageable_async_copy";
  f2.title = "Asynchronous copies from pageable memory";
  f2.evidence = "4 copies of 64 MiB";
  f2.fix = "Use pinned buffers";
  f2.cost_ms_per_step = 1;
  a.findings = {f1, f2};
  return f;
}

TEST(ReportHtml, EscapesEveryStringFromTheTrace) {
  const fixture f = make_fixture();
  const std::string html = to_html(f.t, f.a);
  EXPECT_EQ(html.find("<script>alert"), std::string::npos);
  EXPECT_EQ(html.find("\"x&y\""), std::string::npos);
  EXPECT_EQ(count(html, "<script"), 0u) << "a report for readers runs no script";
  EXPECT_EQ(count(to_html(f.t, f.a, with_probe()), "<script"), 1u) << "only the test's probe";
  // Title, evidence, fix, idle table (thread and activity), timeline rect titles, metadata, source.
  EXPECT_GE(count(html, evil_escaped), 8u);
  EXPECT_NE(html.find("Emulated &amp; GPU"), std::string::npos);
  EXPECT_NE(html.find("test &lt;source&gt;"), std::string::npos);
  EXPECT_NE(html.find("Prefetch with ferry::ingest::prefetcher &amp; "), std::string::npos);
}

TEST(ReportHtml, HeaderNamesSourceDeviceStepsAndBottleneck) {
  const fixture f = make_fixture();
  const std::string html = to_html(f.t, f.a);
  EXPECT_EQ(html.rfind("<!DOCTYPE html>", 0), 0u);
  EXPECT_NE(html.find("<b>Steps:</b> 4"), std::string::npos);
  const auto b = html.find("id=\"bottleneck\" data-rule=\"gpu_idle\"");
  ASSERT_NE(b, std::string::npos);
  EXPECT_NE(html.find("GPU idle 35% of each step", b), std::string::npos);
  EXPECT_EQ(html.find("id=\"dropped\""), std::string::npos) << "no warning without drops";
  EXPECT_EQ(count(html, "<section class=\"finding\""), 2u);
  EXPECT_LT(html.find("data-rule=\"gpu_idle\"><h3>"), html.find("data-rule=\"pageable_async_copy\"><h3>"));

  const fixture dropped = make_fixture(1234);
  const std::string warned = to_html(dropped.t, dropped.a);
  const auto w = warned.find("id=\"dropped\"");
  ASSERT_NE(w, std::string::npos);
  EXPECT_NE(warned.find("1234 events were dropped", w), std::string::npos);
}

TEST(ReportHtml, NamesTheMainThreadsRuleAndTheIdleNoActivityCovers) {
  fixture f = make_fixture();
  EXPECT_EQ(to_html(f.t, f.a).find("id=\"uncovered\""), std::string::npos) << "none without uncovered idle";
  f.a.main_thread = "pt_main_thread";
  f.a.main_thread_rule = "tid_is_pid";
  f.a.uncovered.idle_ms = 1.25;
  f.a.uncovered.fraction_of_idle = 0.25;
  f.a.uncovered.before = {{"cudaMemcpyAsync", 3, 1.25}};
  const std::string html = to_html(f.t, f.a);
  EXPECT_NE(
      html.find("<b>Main thread:</b> pt_main_thread <small id=\"main-thread-rule\">(tid_is_pid)</small>"),
      std::string::npos);
  const auto u = html.find("id=\"uncovered\"");
  ASSERT_NE(u, std::string::npos);
  EXPECT_NE(html.find("just before: cudaMemcpyAsync", u), std::string::npos);
  EXPECT_NE(html.find("25%", u), std::string::npos);
}

TEST(ReportHtml, OneBarPerStepPlusTheMean) {
  const fixture f = make_fixture();
  const std::string html = to_html(f.t, f.a);
  EXPECT_EQ(count(html, "<g class=\"bar\""), f.a.steps.size() + 1);
  EXPECT_EQ(count(html, "<g class=\"bar\" data-step=\"mean\">"), 1u);
  EXPECT_NE(html.find("data-bars=\"5\""), std::string::npos);
  // compute, d2d, h2d, d2h, idle per bar; comm is zero and draws nothing.
  EXPECT_EQ(count(html, "data-category=\"compute\" data-ms="), 5u);
  EXPECT_EQ(count(html, "data-category=\"comm\" data-ms="), 0u);
  EXPECT_EQ(count(html, "<rect class=\"seg\""), 25u);
  EXPECT_NE(html.find("data-step=\"2\" data-category=\"compute\" data-ms=\"6.0000\""), std::string::npos);
  // Every segment has a tooltip.
  const auto seg = html.find("<rect class=\"seg\"");
  EXPECT_LT(html.find("<title>step 0: compute 4.000 ms", seg), html.find("</svg>", seg));
}

TEST(ReportHtml, TrackPerStreamAndThreadWithNestedRows) {
  const fixture f = make_fixture();
  const std::string html = to_html(f.t, f.a);
  EXPECT_NE(html.find("data-track=\"gpu:0:7\""), std::string::npos);
  EXPECT_NE(html.find("data-track=\"gpu:0:13\""), std::string::npos);
  EXPECT_NE(html.find("data-track=\"cpu:100\""), std::string::npos);
  EXPECT_NE(html.find("data-track=\"cpu:200\""), std::string::npos);
  EXPECT_EQ(count(html, "<g class=\"track\""), 4u);
  EXPECT_NE(html.find(">GPU 0 compute (stream 7)<"), std::string::npos);
  EXPECT_NE(html.find(">GPU 0 stream 13<"), std::string::npos);
  EXPECT_NE(html.find(">thread 200<"), std::string::npos);
  EXPECT_NE(html.find("main &lt;script&gt;"), std::string::npos);
  // Three steps are drawn: per step 4 events on thread 100, 1 on 200, 2 kernels, 3 copies/memsets.
  EXPECT_EQ(count(html, "<rect data-kind="), 3u * 10);
  EXPECT_EQ(count(html, "<rect data-kind=\"kernel\""), 3u);
  EXPECT_EQ(count(html, "<rect data-kind=\"comm\""), 3u);
  EXPECT_EQ(count(html, "<rect data-kind=\"memset\""), 3u) << "zero-duration events still get a pixel";
  EXPECT_EQ(count(html, "<rect data-kind=\"sync\""), 3u);
  // Thread 100 nests step > range > api in rows 0, 1, 2 (14 px each); the first range rect is a step.
  const auto t100 = html.find("data-track=\"cpu:100\"");
  const auto api = html.find("<rect data-kind=\"api\"", t100);
  const auto range = html.find("<rect data-kind=\"range\"", t100);
  ASSERT_NE(api, std::string::npos);
  ASSERT_NE(range, std::string::npos);
  auto y_of = [&](std::size_t pos) { return std::stod(html.substr(html.find(" y=\"", pos) + 4, 8)); };
  EXPECT_DOUBLE_EQ(y_of(api) - y_of(range), 28.0);
  // Step boundaries for steps 0..2 and the idle shading on GPU tracks.
  EXPECT_EQ(count(html, "<line class=\"step\" data-step="), 3u);
  EXPECT_GT(count(html, "<rect class=\"idle\""), 0u);
  // Tooltips carry name, duration and bytes.
  EXPECT_NE(html.find("Memcpy HtoD \xC2\xB7 memcpy host to device \xC2\xB7 2.00 ms \xC2\xB7 64.0 MiB"),
            std::string::npos);
}

TEST(ReportHtml, TrackLabelsDoNotRepeatTheId) {
  fixture f = make_fixture();
  f.t.stream_names[13] = "stream 13";              // as the Kineto importer names streams
  f.t.thread_names[200] = "thread 200 (python3)";  // and threads
  f.t.stream_names[7] = "stream 7 (compute)";
  const std::string html = to_html(f.t, f.a);
  EXPECT_NE(html.find(">GPU 0 stream 13<"), std::string::npos);
  EXPECT_NE(html.find(">thread 200 (python3)<"), std::string::npos);
  EXPECT_NE(html.find(">GPU 0 stream 7 (compute)<"), std::string::npos);
}

TEST(ReportHtml, TablesListMeanStepsAndIdle) {
  const fixture f = make_fixture();
  const std::string html = to_html(f.t, f.a);
  const auto table = html.find("<table id=\"breakdown\">");
  ASSERT_NE(table, std::string::npos);
  EXPECT_EQ(count(html.substr(table, html.find("</table>", table) - table), "<tr"), 1u + 1 + 4);
  const auto idle = html.find("<table id=\"idle\">");
  ASSERT_NE(idle, std::string::npos);
  EXPECT_NE(html.find("<td class=\"n\">70.0%</td>", idle), std::string::npos);
  EXPECT_NE(html.find("cudaStreamSynchronize <small>(waits for the GPU)</small>", idle), std::string::npos);
  EXPECT_NE(html.find("&lt;/script&gt;&#39; <small>(main)</small>", idle), std::string::npos);
}

TEST(ReportHtml, FetchesNothing) {
  const fixture f = make_fixture();
  const std::string html = to_html(f.t, f.a);
  EXPECT_EQ(html.find("http"), std::string::npos);
  EXPECT_EQ(html.find("src="), std::string::npos);
  EXPECT_EQ(html.find("<link"), std::string::npos);
  EXPECT_EQ(html.find("@import"), std::string::npos);
  EXPECT_EQ(html.find("url("), std::string::npos);
}

// A million events on 64 streams and 4 threads over 3 steps: rects stay under the cap, the file small.
// A million events: 64 streams of kernel bursts and 4 CPU threads. A burst of 20 back-to-back 5 us
// kernels is narrower than a pixel and merges into one rect; with `overlapping_ranges`, each thread also
// holds 10000 overlapping 5 ms ranges (wider than any merge), deeper than the rows drawn, so the rects
// exceed the cap however coarse the merging. The filler API calls are sub-pixel and merge.
fixture make_huge(bool overlapping_ranges) {
  fixture f;
  timeline& t = f.t;
  t.source = "synthetic";
  const auto k =
      t.strings.intern("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>");
  const auto api = t.strings.intern("cudaLaunchKernel");
  const auto range = t.strings.intern("forward");
  constexpr int streams = 64;
  constexpr int threads = 4;
  constexpr std::int64_t step_ns = 100 * ms;
  t.events.reserve(1'000'000);
  // Per stream 15000 kernels: a burst every 600 us, every 13th with one 2 ms kernel; 500 bursts per
  // stream fall into the 3 steps drawn.
  for (int i = 0; i < 15'000; ++i)
    for (int s = 0; s < streams; ++s) {
      const int burst = i / 20;
      event e;
      e.kind = activity::kernel;
      e.name = k;
      e.device = s / 32;
      e.stream = static_cast<std::uint64_t>(s);
      e.start_ns = burst * 600'000 + (i % 20) * 5'000 + s * 1'000;
      e.end_ns = e.start_ns + (burst % 13 == 0 && i % 20 == 19 ? 2'000'000 : 5'000);
      t.events.push_back(e);
    }
  if (overlapping_ranges)
    for (int i = 0; i < 40'000; ++i) {
      event e;
      e.kind = activity::range;
      e.name = range;
      e.thread = static_cast<std::uint64_t>(1000 + i % threads);
      e.start_ns = (i / threads) * 29'000;
      e.end_ns = e.start_ns + 5 * ms;
      t.events.push_back(e);
    }
  while (t.events.size() < 1'000'000) {
    const auto i = static_cast<std::int64_t>(t.events.size());
    event e;
    e.kind = activity::api;
    e.name = api;
    e.thread = static_cast<std::uint64_t>(1000 + i % threads);
    e.start_ns = (i / threads) * 3'000 % (3 * step_ns);
    e.end_ns = e.start_ns + 2'000;
    t.events.push_back(e);
  }
  t.sort();
  for (int s = 0; s < 10; ++s) f.a.steps.push_back(make_step(s, s * step_ns, (s + 1) * step_ns));
  f.a.mean = make_step(-1, 0, step_ns);
  f.a.step_prefix = "step";
  f.a.findings.push_back({"compute_bound", "GPU computes", "", "", 0, {}});
  return f;
}

TEST(ReportHtml, MergesSubPixelEventsOfAMillion) {
  const fixture f = make_huge(/*overlapping_ranges=*/false);
  ASSERT_EQ(f.t.events.size(), 1'000'000u);
  const std::string html = to_html(f.t, f.a);
  const std::size_t rects = count(html, "<rect data-kind=");
  // Everything in the window is drawn, merged: nothing omitted, far fewer rects than events.
  EXPECT_LE(rects, 20000u);
  EXPECT_GT(rects, 1000u);
  EXPECT_EQ(html.find("id=\"omitted\""), std::string::npos);
  EXPECT_NE(html.find("events merged (kernel)"), std::string::npos);
  EXPECT_NE(html.find("are merged into runs"), std::string::npos);
  EXPECT_EQ(count(html, "<g class=\"track\""), 64u + 4);
  EXPECT_LT(html.size(), 5u << 20) << "report of " << html.size() << " bytes";
}

TEST(ReportHtml, CapsRectsOnAMillionEvents) {
  const fixture f = make_huge(/*overlapping_ranges=*/true);
  ASSERT_EQ(f.t.events.size(), 1'000'000u);
  const auto t0 = std::chrono::steady_clock::now();
  const std::string html = to_html(f.t, f.a);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const std::size_t rects = count(html, "<rect data-kind=");
  EXPECT_LE(rects, 20000u);
  EXPECT_GT(rects, 19000u) << "the cap is used, not undershot";
  EXPECT_LT(html.size(), 5u << 20) << "report of " << html.size() << " bytes";
  EXPECT_NE(html.find("id=\"omitted\""), std::string::npos);
  EXPECT_NE(html.find("data-rects=\"" + std::to_string(rects) + "\""), std::string::npos);
  EXPECT_EQ(count(html, "<g class=\"track\""), 64u + 4);
  // Every GPU stream keeps its share of the rects (the overlapping ranges do not crowd them out).
  for (int s = 0; s < 64; s += 21) {
    const auto at = html.find("data-track=\"gpu:" + std::to_string(s / 32) + ":" + std::to_string(s) + "\"");
    ASSERT_NE(at, std::string::npos);
    EXPECT_EQ(html.find("<rect data-kind=\"kernel\"", at), html.find("<rect data-kind=", at));
    EXPECT_LT(html.find("<rect data-kind=\"kernel\"", at), html.find("</g>", at));
  }
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
  static_cast<void>(secs);  // sanitizers slow the generator 30 times or more: time is not what they check
#else
  EXPECT_LT(secs, 10.0);  // generous: it catches a layout gone quadratic, not a busy machine
#endif
  std::printf("[ report   ] 1e6 events: %zu rects, %zu bytes, %.2f s\n", rects, html.size(), secs);
}

TEST(ReportHtml, RobustToDegenerateInput) {
  // One step at negative times, GPU only, zero-duration events, an event outside the step.
  fixture f;
  timeline& t = f.t;
  t.events.push_back(gpu(t, activity::kernel, "k", -5 * ms, -4 * ms, 0));
  t.events.push_back(gpu(t, activity::kernel, "", -3 * ms, -3 * ms, 0));
  t.events.push_back(gpu(t, activity::memcpy, "c", -2 * ms, -2 * ms, 1, copy_kind::h2h, 0));
  t.events.push_back(gpu(t, activity::kernel, "later", 50 * ms, 51 * ms, 0));
  t.sort();
  f.a.steps.push_back(make_step(0, -5 * ms, -1 * ms));
  f.a.mean = f.a.steps.front();
  f.a.findings.push_back({"compute_bound", "GPU computes", "", "", 0, {}});
  const std::string html = to_html(f.t, f.a);
  EXPECT_EQ(count(html, "<rect data-kind="), 3u);
  EXPECT_EQ(count(html, "<g class=\"bar\""), 2u);
  EXPECT_EQ(html.find("nan"), std::string::npos);
  EXPECT_EQ(html.find("inf"), std::string::npos);

  // Nothing at all: no events, no steps, no findings, zero-width step, NaN numbers.
  fixture empty;
  empty.a.mean.compute_ms = std::nan("");
  const std::string bare = to_html(empty.t, empty.a, with_probe());
  EXPECT_NE(bare.find("</html>"), std::string::npos);
  EXPECT_NE(bare.find("No finding"), std::string::npos);
  EXPECT_NE(bare.find("id=\"render-check\""), std::string::npos);

  fixture instant;
  instant.t.events.push_back(gpu(instant.t, activity::kernel, "k", 7, 7, 0));
  instant.a.steps.push_back(make_step(0, 7, 7));
  instant.a.steps.front().wall_ms = 0;
  instant.a.mean = instant.a.steps.front();
  const std::string one = to_html(instant.t, instant.a);
  EXPECT_EQ(count(one, "<rect data-kind="), 1u);
  EXPECT_EQ(one.find("nan"), std::string::npos);
}

fs::path fresh_dir(const std::string& tag) {
  auto dir = fs::temp_directory_path() /
             ("ferry_report_" + tag + "_" + std::to_string(::getpid()) + "_" +
              std::to_string(std::chrono::steady_clock::now().time_since_epoch().count()));
  fs::create_directories(dir);
  return dir;
}

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST(ReportHtml, WriteHtmlReportWritesTheDocument) {
  const fixture f = make_fixture();
  const fs::path dir = fresh_dir("write");
  const fs::path path = dir / "report.html";
  write_html_report(f.t, f.a, path);
  EXPECT_EQ(slurp(path), to_html(f.t, f.a));
  write_html_report(f.t, f.a, path, with_probe());
  EXPECT_EQ(slurp(path), to_html(f.t, f.a, with_probe()));
  fs::remove_all(dir);
}

TEST(ReportHtml, BodyEndGoesInAsIsJustBeforeTheBodyClosesAndChangesNothingElse) {
  const fixture f = make_fixture();
  const std::string plain = to_html(f.t, f.a);
  EXPECT_EQ(plain.find("id=\"render-check\""), std::string::npos) << "no probe element without the probe";
  html_options o;
  o.body_end = "<p id=\"added\">x & <y></p>\n";
  const std::string added = to_html(f.t, f.a, o);
  const auto end = plain.rfind("</body>");
  ASSERT_NE(end, std::string::npos);
  EXPECT_EQ(added, plain.substr(0, end) + std::string(o.body_end) + plain.substr(end));
}

TEST(ReportHtml, WriteHtmlReportThrowsNamingThePath) {
  const fixture f = make_fixture();
  const fs::path path = fs::temp_directory_path() / "ferry_no_such_dir_for_report" / "sub" / "report.html";
  try {
    write_html_report(f.t, f.a, path);
    FAIL() << "expected std::system_error";
  } catch (const std::system_error& e) {
    EXPECT_NE(std::string(e.what()).find(path.string()), std::string::npos) << e.what();
    EXPECT_EQ(e.code(), std::errc::no_such_file_or_directory);
  }
}

// The real pipeline on a recorded PyTorch profiler trace: import, analyze, report.
const fs::path data_dir = fs::path(FERRY_TESTS_DIR) / "trace" / "data";

fixture kineto_fixture() {
  fixture f;
  f.t = read_trace(data_dir / "kineto_naive.json");
  f.a = analyze(f.t);
  return f;
}

TEST(ReportHtml, ReportsAnAnalyzedKinetoTrace) {
  const fixture f = kineto_fixture();
  const std::string html = to_html(f.t, f.a);
  EXPECT_EQ(count(html, "<g class=\"bar\""), f.a.steps.size() + 1);
  EXPECT_EQ(count(html, "<section class=\"finding\""), f.a.findings.size());
  EXPECT_NE(html.find("id=\"bottleneck\" data-rule=\"" + f.a.bottleneck() + "\""), std::string::npos);
  EXPECT_GT(count(html, "<rect data-kind=\"kernel\""), 0u);
  EXPECT_GT(count(html, "<rect data-kind=\"h2d\""), 0u);
  EXPECT_GT(count(html, "<line class=\"step\" data-step="), 0u);
  EXPECT_EQ(html.find("http"), std::string::npos);
}

// ---- headless Chromium ------------------------------------------------------------------------------------

// Debian's package; FERRY_CHROMIUM names another binary.
std::string chromium_path() {
  const char* v = std::getenv("FERRY_CHROMIUM");
  return v != nullptr && *v != '\0' ? v : "/usr/bin/chromium";
}

struct browser_run {
  int status = -1;
  double seconds = 0;
  std::string out;
  std::string err;
};

// Seconds one Chromium run may take before it counts as hung (ctest's own limit for the test is larger).
constexpr int browser_timeout_s = 900;

browser_run run_chromium(const fs::path& work, const std::string& mode_args, const fs::path& page) {
  static int runs = 0;
  const fs::path profile = work / ("profile" + std::to_string(++runs));
  fs::create_directories(profile);
  const fs::path out = work / "stdout.txt";
  const fs::path err = work / "stderr.txt";
  // The bound only stops a browser that hangs: rendering the largest report takes seconds on an idle
  // machine and minutes on a busy one, and the test asserts what was rendered, never how fast.
  const std::string cmd = "timeout " + std::to_string(browser_timeout_s) + " '" + chromium_path() + "'" +
                          " --headless --no-sandbox --disable-gpu --disable-quic --no-first-run"
                          " --disable-background-networking --disable-component-update --disable-sync"
                          " --user-data-dir='" +
                          profile.string() + "' --virtual-time-budget=5000 " + mode_args + " 'file://" +
                          page.string() + "' > '" + out.string() + "' 2> '" + err.string() + "'";
  browser_run r;
  const auto t0 = std::chrono::steady_clock::now();
  r.status = std::system(cmd.c_str());
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.out = slurp(out);
  r.err = slurp(err);
  return r;
}

// Renders `f` in Chromium and checks the page's own measurement against what the generator emitted.
void check_renders(const fixture& f, const std::string& tag, bool screenshot) {
  const fs::path dir = fresh_dir(tag);
  const fs::path page = dir / "report.html";
  write_html_report(f.t, f.a, page, with_probe());
  const std::string html = slurp(page);
  const std::size_t emitted_timeline = count(html, "<rect data-kind=");
  const std::size_t emitted_bars = count(html, "<rect class=\"seg\"");
  const std::size_t svgs = count(html, "<svg ");

  const browser_run dom = run_chromium(dir, "--dump-dom", page);
  std::printf("[ chromium ] %s: --dump-dom took %.2f s\n", tag.c_str(), dom.seconds);
  ASSERT_EQ(dom.status, 0) << "chromium failed (status " << dom.status << "):\n" << dom.err;
  EXPECT_NE(dom.out.find("data-rendered=\"ok\""), std::string::npos)
      << "the page's probe did not finish; stderr:\n"
      << dom.err;
  const std::string open_tag = "<pre id=\"render-check\">";
  const auto begin = dom.out.find(open_tag);
  ASSERT_NE(begin, std::string::npos);
  const auto end = dom.out.find("</pre>", begin);
  ASSERT_NE(end, std::string::npos);
  const std::string json_text = dom.out.substr(begin + open_tag.size(), end - begin - open_tag.size());
  const auto check = nlohmann::json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  ASSERT_TRUE(check.is_object()) << json_text;
  EXPECT_EQ(check.value("timeline_rects", -1), static_cast<long>(emitted_timeline)) << json_text;
  EXPECT_EQ(check.value("bar_rects", -1), static_cast<long>(emitted_bars)) << json_text;
  ASSERT_TRUE(check["svg_widths"].is_array()) << json_text;
  EXPECT_EQ(check["svg_widths"].size(), svgs) << json_text;
  for (const auto& w : check["svg_widths"]) EXPECT_GT(w.get<double>(), 0) << json_text;

  if (screenshot) {
    const fs::path png = dir / "report.png";
    const browser_run shot =
        run_chromium(dir, "--screenshot='" + png.string() + "' --window-size=1400,2000", page);
    std::printf("[ chromium ] %s: --screenshot took %.2f s\n", tag.c_str(), shot.seconds);
    ASSERT_EQ(shot.status, 0) << "chromium failed (status " << shot.status << "):\n" << shot.err;
    ASSERT_TRUE(fs::exists(png)) << shot.err;
    const std::string bytes = slurp(png);
    ASSERT_GT(bytes.size(), 8u);
    EXPECT_EQ(bytes.substr(1, 3), "PNG");
    // A blank 1400x2000 page compresses to a few KB; the report's charts and text take far more.
    EXPECT_GT(bytes.size(), 40u * 1024) << "screenshot of " << bytes.size() << " bytes looks blank";
  }
  // FERRY_TEST_KEEP_REPORTS=1 keeps the page and the screenshot to look at.
  if (!::testing::Test::HasFailure() && std::getenv("FERRY_TEST_KEEP_REPORTS") == nullptr)
    fs::remove_all(dir);
  else
    std::printf("[ chromium ] kept %s\n", dir.c_str());
}

// FERRY_TEST_BROWSER: "required" (default) fails without Chromium; "off" skips (sanitizer runs).
bool browser_wanted() {
  const char* v = std::getenv("FERRY_TEST_BROWSER");
  const std::string mode = v == nullptr ? "required" : v;
  if (mode == "off") return false;
  EXPECT_TRUE(mode == "required") << "FERRY_TEST_BROWSER='" << mode << "': expected 'required' or 'off'";
  return true;
}

TEST(ReportHtmlBrowser, RendersInHeadlessChromium) {
  if (!browser_wanted()) GTEST_SKIP() << "FERRY_TEST_BROWSER=off: the headless-browser check is turned off";
  ASSERT_TRUE(fs::exists(chromium_path()))
      << chromium_path()
      << " not found: the HTML report is checked in headless Chromium; run scripts/setup.sh "
      << "(it installs Debian's chromium), or set FERRY_TEST_BROWSER=off to skip this test";
  check_renders(make_fixture(), "small", /*screenshot=*/true);
}

TEST(ReportHtmlBrowser, RendersAnAnalyzedKinetoTrace) {
  if (!browser_wanted()) GTEST_SKIP() << "FERRY_TEST_BROWSER=off: the headless-browser check is turned off";
  ASSERT_TRUE(fs::exists(chromium_path()))
      << chromium_path()
      << " not found: the HTML report is checked in headless Chromium; run scripts/setup.sh "
      << "(it installs Debian's chromium), or set FERRY_TEST_BROWSER=off to skip this test";
  check_renders(kineto_fixture(), "kineto", /*screenshot=*/false);
}

TEST(ReportHtmlBrowser, RendersTheCappedMillionEventReport) {
  if (!browser_wanted()) GTEST_SKIP() << "FERRY_TEST_BROWSER=off: the headless-browser check is turned off";
  ASSERT_TRUE(fs::exists(chromium_path()))
      << chromium_path()
      << " not found: the HTML report is checked in headless Chromium; run scripts/setup.sh "
      << "(it installs Debian's chromium), or set FERRY_TEST_BROWSER=off to skip this test";
  check_renders(make_huge(/*overlapping_ranges=*/true), "huge", /*screenshot=*/true);
}

}  // namespace
}  // namespace ferry::trace
