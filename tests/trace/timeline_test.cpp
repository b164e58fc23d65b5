#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <thread>
#include <vector>

#include "ferry/core/error.hpp"
#include "ferry/trace/range.hpp"
#include "ferry/trace/timeline.hpp"
#include "support/test_support.hpp"

namespace {

using namespace ferry::trace;

event kernel_at(std::int64_t start, std::int64_t end) {
  event e;
  e.kind = activity::kernel;
  e.start_ns = start;
  e.end_ns = end;
  e.device = 0;
  e.stream = 1;
  return e;
}

TEST(timeline_words, round_trip_and_refuse_unknown_words) {
  for (auto a : {activity::kernel, activity::memcpy, activity::memset, activity::sync, activity::api,
                 activity::range, activity::stage})
    EXPECT_EQ(parse_activity(to_string(a)), a);
  for (auto k :
       {copy_kind::none, copy_kind::h2d, copy_kind::d2h, copy_kind::d2d, copy_kind::h2h, copy_kind::p2p})
    EXPECT_EQ(parse_copy_kind(to_string(k)), k);
  for (auto k :
       {mem_kind::unknown, mem_kind::pageable, mem_kind::pinned, mem_kind::device, mem_kind::managed})
    EXPECT_EQ(parse_mem_kind(to_string(k)), k);
  for (auto k : {sync_kind::none, sync_kind::event, sync_kind::stream, sync_kind::device,
                 sync_kind::stream_wait, sync_kind::copy})
    EXPECT_EQ(parse_sync_kind(to_string(k)), k);
  EXPECT_MESSAGE_HAS(
      ferry::testing::message_of<ferry::input_error>([] { static_cast<void>(parse_mem_kind("locked")); }),
      "\"locked\"");
  EXPECT_THROW(static_cast<void>(parse_activity("Kernel")), ferry::input_error);
}

TEST(string_table, interns_once_and_keeps_ids) {
  string_table t;
  EXPECT_EQ(t[0], "");
  const auto a = t.intern("spin");
  const auto b = t.intern("checksum");
  EXPECT_EQ(t.intern("spin"), a);
  EXPECT_NE(a, b);
  EXPECT_EQ(t[a], "spin");
  EXPECT_EQ(t[b], "checksum");
  EXPECT_EQ(t.intern(""), 0u);
  EXPECT_THROW(static_cast<void>(t[99]), ferry::logic_error);
}

TEST(recorder, keeps_events_only_while_capturing) {
  recorder r(16);
  r.record(kernel_at(1, 2));
  EXPECT_EQ(r.size(), 0u);
  r.start();
  r.record(kernel_at(5, 6));
  r.record(kernel_at(3, 4));
  r.stop();
  r.record(kernel_at(7, 8));
  r.record_late(kernel_at(9, 10));  // a source flushing after the window closed
  timeline t = r.take("test", "none");
  ASSERT_EQ(t.events.size(), 3u);
  EXPECT_EQ(t.events[0].start_ns, 3);  // sorted by start
  EXPECT_EQ(t.events[1].start_ns, 5);
  EXPECT_EQ(t.events[2].start_ns, 9);
  EXPECT_EQ(t.dropped, 0u);
  EXPECT_EQ(t.source, "test");
  EXPECT_EQ(r.size(), 0u);  // take empties the buffer
}

TEST(recorder, counts_what_does_not_fit) {
  recorder r(3);
  r.start();
  for (int i = 0; i < 10; ++i) r.record(kernel_at(i, i + 1));
  EXPECT_EQ(r.size(), 3u);
  EXPECT_EQ(r.dropped(), 7u);
  const timeline t = r.take("test", "none");
  EXPECT_EQ(t.events.size(), 3u);
  EXPECT_EQ(t.dropped, 7u);
  EXPECT_EQ(r.dropped(), 0u);
  r.count_dropped(5);  // lost by a source before reaching the recorder
  EXPECT_EQ(r.take("test", "none").dropped, 5u);
}

TEST(recorder, refuses_bad_capacity) {
  EXPECT_MESSAGE_HAS(ferry::testing::message_of<ferry::logic_error>([] { recorder r(0); }), "capacity 0");
  EXPECT_MESSAGE_HAS(
      ferry::testing::message_of<ferry::logic_error>([] { recorder r((std::size_t{1} << 26) + 1); }),
      "67108865");
}

TEST(recorder, many_threads_record_without_losing_any) {
  recorder r(100000);
  r.start();
  std::vector<std::jthread> threads;
  for (int t = 0; t < 8; ++t)
    threads.emplace_back([&r, t] {
      for (int i = 0; i < 1000; ++i) r.record(kernel_at(t * 1000 + i, t * 1000 + i + 1));
    });
  threads.clear();
  EXPECT_EQ(r.size(), 8000u);
  EXPECT_EQ(r.dropped(), 0u);
}

TEST(stage_spans, ferry_range_records_into_the_current_recorder) {
  recorder r(64);
  { FERRY_RANGE("before any recorder", ferry::trace::color::gray); }
  {
    recording_scope scope(r);
    EXPECT_EQ(current_recorder(), &r);
    { FERRY_RANGE("not capturing yet", ferry::trace::color::gray); }
    r.start();
    const std::int64_t before = now_ns();
    {
      FERRY_RANGE("outer", ferry::trace::color::blue);
      FERRY_RANGE("inner", ferry::trace::color::green);
    }
    std::jthread other([] {
      name_this_thread("stage-test");
      FERRY_RANGE("on another thread", ferry::trace::color::red);
    });
    other.join();
    const std::int64_t after = now_ns();
    r.stop();
    timeline t = r.take("test", "none");
    ASSERT_EQ(t.events.size(), 3u);
    std::vector<std::string> names;
    for (const event& e : t.events) {
      EXPECT_EQ(e.kind, activity::stage);
      EXPECT_EQ(t.domain_of(e), "ferry");
      EXPECT_GE(e.start_ns, before);
      EXPECT_LE(e.end_ns, after);
      EXPECT_LE(e.start_ns, e.end_ns);
      names.emplace_back(t.name_of(e));
    }
    EXPECT_NE(std::find(names.begin(), names.end(), "outer"), names.end());
    EXPECT_NE(std::find(names.begin(), names.end(), "inner"), names.end());
    const auto other_span = std::find_if(t.events.begin(), t.events.end(),
                                         [&](const event& e) { return t.name_of(e) == "on another thread"; });
    ASSERT_NE(other_span, t.events.end());
    EXPECT_NE(other_span->thread, this_thread_id());
    // The outer range contains the inner one, on this thread.
    const auto outer = std::find_if(t.events.begin(), t.events.end(),
                                    [&](const event& e) { return t.name_of(e) == "outer"; });
    const auto inner = std::find_if(t.events.begin(), t.events.end(),
                                    [&](const event& e) { return t.name_of(e) == "inner"; });
    EXPECT_LE(outer->start_ns, inner->start_ns);
    EXPECT_GE(outer->end_ns, inner->end_ns);
    EXPECT_EQ(outer->thread, this_thread_id());
  }
  EXPECT_EQ(current_recorder(), nullptr);
}

TEST(stage_spans, scopes_nest_and_a_new_recorder_gets_its_own_ids) {
  recorder a(8);
  recorder b(8);
  a.start();
  b.start();
  {
    recording_scope sa(a);
    {
      recording_scope sb(b);
      FERRY_RANGE("into b", ferry::trace::color::gray);
    }
    EXPECT_EQ(current_recorder(), &a);
    FERRY_RANGE("into a", ferry::trace::color::gray);
  }
  const timeline ta = a.take("a", "");
  const timeline tb = b.take("b", "");
  ASSERT_EQ(ta.events.size(), 1u);
  ASSERT_EQ(tb.events.size(), 1u);
  EXPECT_EQ(ta.name_of(ta.events[0]), "into a");
  EXPECT_EQ(tb.name_of(tb.events[0]), "into b");
  EXPECT_NE(a.serial(), b.serial());
}

TEST(recorder, names_threads_from_the_os_when_nobody_named_them) {
  recorder r(8);
  r.start();
  std::uint64_t tid = 0;
  std::mutex mu;
  std::condition_variable cv;
  bool taken = false;
  std::jthread worker([&] {
    name_this_thread("a-very-long-thread-name");
    tid = this_thread_id();
    event e = kernel_at(1, 2);
    e.kind = activity::api;
    e.thread = tid;
    r.record(e);
    std::unique_lock lock(mu);
    cv.wait(lock, [&] { return taken; });  // alive while take() reads its name
  });
  while (r.size() == 0) std::this_thread::yield();
  r.name_thread(this_thread_id(), "main");
  const timeline t = r.take("test", "");
  {
    std::lock_guard lock(mu);
    taken = true;
  }
  cv.notify_all();
  ASSERT_TRUE(t.thread_names.contains(tid));
  EXPECT_EQ(t.thread_names.at(tid), "a-very-long-thr");  // the OS keeps 15 characters
  EXPECT_EQ(t.thread_names.at(this_thread_id()), "main");
}

}  // namespace
