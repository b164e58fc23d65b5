// Per-process trace files (`ferry trace`): the writer's lines read back into the same events, a file cut
// mid-line still reads, malformed lines are refused naming the file and line, and a session directory
// merges into one timeline with a process table, streams and correlations kept apart per process, a
// reused pid told apart, parents linked and CPU samples attached; the Chrome output groups by process.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "ferry/core/error.hpp"
#include "ferry/trace/process_trace.hpp"
#include "ferry/trace/trace_io.hpp"

namespace {

using namespace ferry::trace;
namespace fs = std::filesystem;

process_header header(std::uint64_t pid, std::uint64_t ppid, std::uint64_t start, const char* started,
                      const char* command) {
  process_header h;
  h.pid = pid;
  h.ppid = ppid;
  h.start_ticks = start;
  h.monotonic_ns = static_cast<std::int64_t>(start) * 10'000'000;
  h.realtime_ns = 1'700'000'000'000'000'000;
  h.started = started;
  h.exe = "/usr/bin/python3";
  h.command = command;
  return h;
}

// Two batches from one recorder, as the injection library's writer thread takes them.
std::string two_batches(std::uint64_t tid) {
  recorder rec(64);
  rec.start();
  process_file_writer w;
  std::string out;
  event e;
  e.kind = activity::range;
  e.start_ns = 100;
  e.end_ns = 250;
  e.thread = tid;
  e.name = rec.intern("munmap (libtorch_cpu.so)");
  e.domain = rec.intern("os");
  e.bytes = 36 << 20;
  rec.record(e);
  rec.name_thread(tid, "main\tthread");
  w.append(rec.take("", ""), out);
  event k;
  k.kind = activity::kernel;
  k.start_ns = 300;
  k.end_ns = 400;
  k.device = 0;
  k.stream = 7;
  k.correlation = 42;
  k.name = rec.intern("gemm\nkernel");
  rec.record(k);
  event a;
  a.kind = activity::api;
  a.start_ns = 290;
  a.end_ns = 295;
  a.thread = tid;
  a.correlation = 42;
  a.name = rec.intern("cudaLaunchKernel");
  rec.record(a);
  w.append(rec.take("", ""), out);
  return out;
}

TEST(process_trace, lines_read_back_into_the_same_events) {
  const std::string text = format_process_header(header(10, 1, 5, "exec", "python3 train.py --x \"a b\"")) +
                           two_batches(10) + format_process_note("cupti", "recording\tkernels") +
                           format_process_exit(999, 3);
  const process_file f = parse_process_file(text, "mem");
  EXPECT_EQ(f.header.pid, 10u);
  EXPECT_EQ(f.header.ppid, 1u);
  EXPECT_EQ(f.header.started, "exec");
  EXPECT_EQ(f.header.command, "python3 train.py --x \"a b\"");
  ASSERT_EQ(f.events.events.size(), 3u);
  const event& r = f.events.events[0];
  EXPECT_EQ(r.kind, activity::range);
  EXPECT_EQ(f.events.name_of(r), "munmap (libtorch_cpu.so)");
  EXPECT_EQ(f.events.domain_of(r), "os");
  EXPECT_EQ(r.bytes, 36u << 20);
  EXPECT_EQ(f.events.thread_names.at(10), "main\tthread");
  const event& k = f.events.events[2];  // after the launch, by start time
  EXPECT_EQ(k.kind, activity::kernel);
  EXPECT_EQ(f.events.name_of(k), "gemm\nkernel");  // escaped on the way out, restored on the way in
  EXPECT_EQ(k.stream, 7u);
  EXPECT_EQ(k.device, 0);
  EXPECT_EQ(f.events.metadata.at("cupti"), "recording\tkernels");
  EXPECT_TRUE(f.exited);
  EXPECT_EQ(f.exit_status, 3);
  EXPECT_FALSE(f.truncated);
}

TEST(process_trace, a_file_cut_mid_line_reads_to_its_last_complete_line) {
  const std::string text = format_process_header(header(10, 1, 5, "exec", "x")) + two_batches(10);
  for (std::size_t cut : {text.size() - 1, text.size() - 10}) {
    const process_file f = parse_process_file(text.substr(0, cut), "mem");
    EXPECT_TRUE(f.truncated);
    EXPECT_LT(f.events.events.size(), 3u);
    EXPECT_FALSE(f.exited);
  }
}

TEST(process_trace, malformed_lines_are_refused_naming_the_file_and_line) {
  const std::string head = format_process_header(header(10, 1, 5, "exec", "x"));
  const auto message = [](const std::string& text) {
    try {
      static_cast<void>(parse_process_file(text, "run/10-5-0.ferry-proc"));
    } catch (const ferry::input_error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message("not a trace\n").find("not a ferry process trace"), std::string::npos);
  EXPECT_NE(message(head + "E 0 1 2\n").find("run/10-5-0.ferry-proc line 3"), std::string::npos);
  EXPECT_NE(message(head + "E 0 10 5 0 0 -1 0 0 0 0 0 0 0 0 0\n").find("before start"), std::string::npos);
  EXPECT_NE(message(head + "E 0 1 5 0 0 -1 0 0 9 0 0 0 0 0 0\n").find("string id 9 was not defined"),
            std::string::npos);
  EXPECT_NE(message(head + "E 99 1 5 0 0 -1 0 0 0 0 0 0 0 0 0\n").find("kind 99 is out of range"),
            std::string::npos);
  EXPECT_NE(message(head + "Q 1\n").find("unknown record"), std::string::npos);
  EXPECT_NE(message(std::string(process_file_magic) + "\nS 1\tx\n").find("P line first"), std::string::npos);
}

class session_dir : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("ferry_process_trace_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  void write(const std::string& name, const std::string& text) { std::ofstream(dir_ / name) << text; }
  fs::path dir_;
};

TEST_F(session_dir, processes_merge_with_their_own_streams_parents_and_samples) {
  // The main process (pid 10), its fork child (pid 11, a DataLoader worker), and a later process that
  // reused pid 11 (start 9): three processes, two with a kernel on stream 7 with correlation 42.
  write("10-5-0.ferry-proc", format_process_header(header(10, 1, 5, "exec", "python3 train.py")) +
                                 two_batches(10) + format_process_exit(1000, 0));
  {
    recorder rec(8);
    rec.start();
    event f;
    f.kind = activity::range;
    f.start_ns = 120;
    f.end_ns = 200;
    f.thread = 11;
    f.name = rec.intern("DataLoader fetch (worker 3)");
    rec.record(f);
    process_file_writer w;
    std::string out;
    w.append(rec.take("", ""), out);
    write("11-6-0.ferry-proc", format_process_header(header(11, 10, 6, "fork", "python3 train.py")) + out);
  }
  write("11-9-0.ferry-proc",
        format_process_header(header(11, 10, 9, "exec", "python3 other.py")) + two_batches(11));
  write("samples.ferry-cpu",
        "ferry-cpu-samples 1\nC 150 11 6 980 1 2\nC 160 10 5 500 1 9\nC 170 77 1 1000 1 1\nL 7\n");
  write("unrelated.txt", "not a process file");
  write("12-7-0.ferry-proc", "garbage\n");  // one unreadable file: named, the others still read

  const timeline t = read_process_traces(dir_);
  ASSERT_EQ(t.processes.size(), 3u);
  ASSERT_EQ(t.skipped.size(), 1u);
  EXPECT_NE(t.skipped.begin()->first.find("12-7-0.ferry-proc line 1"), std::string::npos)
      << t.skipped.begin()->first;
  const process_info& main = t.processes.at(10);
  EXPECT_EQ(main.name, "python3 train.py");
  EXPECT_TRUE(main.gpu);
  EXPECT_EQ(main.ended, "exit 0");
  const process_info& worker = t.processes.at(11);
  EXPECT_EQ(worker.name, "DataLoader worker 3");
  EXPECT_EQ(worker.parent, 10u);
  EXPECT_EQ(worker.started, "fork");
  EXPECT_FALSE(worker.gpu);
  EXPECT_EQ(worker.ended, "no exit record (killed?)");
  // pid 11 again, later: its own key.
  const std::uint64_t reused = 11 + (std::uint64_t{1} << 22);
  ASSERT_TRUE(t.processes.contains(reused));
  EXPECT_EQ(t.processes.at(reused).name, "python3 other.py");
  EXPECT_EQ(t.processes.at(reused).parent, 10u);
  // The two kernels: same stream and correlation in their files, apart in the merge.
  std::vector<const event*> kernels;
  for (const event& e : t.events)
    if (e.kind == activity::kernel) kernels.push_back(&e);
  ASSERT_EQ(kernels.size(), 2u);
  EXPECT_NE(kernels[0]->stream, kernels[1]->stream);
  EXPECT_NE(kernels[0]->correlation, kernels[1]->correlation);
  EXPECT_EQ(t.stream_processes.at(kernels[0]->stream) + t.stream_processes.at(kernels[1]->stream),
            10 + reused);
  // Threads map to their processes; the reused pid's threads are renumbered with it.
  EXPECT_EQ(t.thread_processes.at(10), 10u);
  EXPECT_EQ(t.thread_processes.at(reused), reused);
  // Samples of recorded processes only; the launcher's own use as metadata.
  ASSERT_EQ(t.cpu_samples.size(), 2u);
  EXPECT_FLOAT_EQ(t.cpu_samples[0].cores, 0.98f);
  EXPECT_EQ(t.metadata.at("launcher_cpu_cores"), "0.007");

  const std::string json = to_chrome_json(t);
  EXPECT_NE(json.find("\"python3 train.py [10]\""), std::string::npos);
  EXPECT_NE(json.find("\"DataLoader worker 3 [11]\""), std::string::npos);
  EXPECT_NE(json.find("\"ph\":\"C\""), std::string::npos);  // CPU use counters
  EXPECT_NE(json.find("\"ph\":\"s\""), std::string::npos);  // launch-to-kernel flows
  // The merged trace reads back (flows and counters are skipped by the reader).
  const timeline back = parse_trace(json, "merged");
  EXPECT_EQ(back.events.size(), t.events.size());
}

TEST_F(session_dir, an_empty_directory_is_refused_with_the_command_to_record_one) {
  EXPECT_FALSE(is_process_trace_dir(dir_));
  try {
    static_cast<void>(read_process_traces(dir_));
    FAIL() << "no error";
  } catch (const ferry::input_error& e) {
    EXPECT_NE(std::string(e.what()).find("ferry trace -o"), std::string::npos) << e.what();
  }
}

}  // namespace

namespace {

TEST(process_trace, proc_stat_fields_read_past_a_command_name_with_spaces_and_parentheses) {
  const std::string text =
      "4242 (python3 (x) y) S 17 4242 4242 0 -1 4194560 100 0 0 0 250 30 0 0 20 0 9 0 123456 0 0 0 0 0 0\n";
  ferry::trace::proc_stat st;
  ASSERT_TRUE(ferry::trace::parse_proc_stat(text, st));
  EXPECT_EQ(st.state, 'S');
  EXPECT_EQ(st.ppid, 17u);
  EXPECT_EQ(st.cpu_ticks, 280u);
  EXPECT_EQ(st.threads, 9u);
  EXPECT_EQ(st.start_ticks, 123456u);
  EXPECT_FALSE(ferry::trace::parse_proc_stat("4242 (cut", st));
  EXPECT_FALSE(ferry::trace::parse_proc_stat("4242 (x) S 1 2", st));
}

}  // namespace
