// What reading a trace costs in memory, counted deterministically: this test binary's operator new counts
// the bytes it holds (malloc_usable_size), and each test compares the peak during a read with the input.
// The inputs are made on the fly by the reader callback, so the test itself holds none of them.
#if defined(__GNUC__) && !defined(__clang__)
// GCC inlines the replaced operator new below, sees malloc, and then warns at every delete; the replacement
// pair is malloc/free on both sides, so the mismatch it reports is not there.
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif
#include <gtest/gtest.h>
#include <malloc.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <new>
#include <string>

#include "ferry/trace/trace_io.hpp"

namespace {

std::atomic<std::int64_t> g_held{0};
std::atomic<std::int64_t> g_peak{0};

void count(void* p, bool alloc) {
  if (p == nullptr) return;
  const auto n = static_cast<std::int64_t>(malloc_usable_size(p));
  const std::int64_t now = (alloc ? g_held += n : g_held -= n);
  std::int64_t peak = g_peak.load();
  while (now > peak && !g_peak.compare_exchange_weak(peak, now)) {
  }
}

}  // namespace

void* operator new(std::size_t n) {
  void* p = std::malloc(n == 0 ? 1 : n);
  if (p == nullptr) throw std::bad_alloc();
  count(p, true);
  return p;
}
void operator delete(void* p) noexcept {
  count(p, false);
  std::free(p);
}
void operator delete(void* p, std::size_t /*unused*/) noexcept { operator delete(p); }

namespace {

using namespace ferry::trace;

// A trace_input that writes `head`, then `body(i)` for i = 0, 1, ... until it returns empty, then `tail`.
template <class Body>
trace_input generated(std::string head, Body body, std::string tail) {
  trace_input in;
  in.origin = "generated";
  in.open = [=] {
    struct state {
      std::string pending;
      std::uint64_t i = 0;
      bool body_done = false;
      bool tail_done = false;
    };
    auto s = std::make_shared<state>();
    s->pending = head;
    return [=](char* buf, std::size_t capacity) -> std::size_t {
      while (s->pending.size() < capacity && !s->tail_done) {
        if (!s->body_done) {
          std::string next = body(s->i++);
          if (next.empty())
            s->body_done = true;
          else
            s->pending += next;
        } else {
          s->pending += tail;
          s->tail_done = true;
        }
      }
      const std::size_t n = std::min(capacity, s->pending.size());
      std::copy_n(s->pending.data(), n, buf);
      s->pending.erase(0, n);
      return n;
    };
  };
  return in;
}

// Peak bytes held during f(), above what was held before it.
template <class F>
std::int64_t peak_during(F&& f) {
  const std::int64_t before = g_held.load();
  g_peak = before;
  f();
  return g_peak.load() - before;
}

TEST(TraceIoMemory, blanks_cost_no_memory_however_many) {
  // 64 MiB of blanks inside traceEvents, 64 KiB at a time (a gigabyte of them cost 3 GB once).
  const std::uint64_t pieces = 1024;
  const std::string blank(std::size_t{64} << 10, ' ');
  const trace_input in =
      generated(R"({"traceEvents":[)", [&](std::uint64_t i) { return i < pieces ? blank : std::string(); },
                R"({"ph":"X","cat":"cpu_op","name":"op","pid":1,"tid":1,"ts":1,"dur":1}]})");
  std::size_t events = 0;
  const std::int64_t peak = peak_during([&] { events = read_trace(in).events.size(); });
  EXPECT_EQ(events, 1u);
  EXPECT_LT(peak, std::int64_t{16} << 20) << "held " << peak << " bytes at the peak to read 64 MiB of blanks";
}

TEST(TraceIoMemory, each_event_costs_its_72_bytes_and_little_more) {
  // 50k Kineto-like events with args ferry does not read; names repeat, as kernel names do.
  const std::uint64_t n = 50'000;
  const trace_input in = generated(
      R"({"schemaVersion":1,"traceEvents":[)",
      [&](std::uint64_t i) -> std::string {
        if (i >= n) return {};
        return std::string(i == 0 ? "" : ",") + R"({"ph":"X","cat":"kernel","name":"void gemm_kernel_)" +
               std::to_string(i % 50) +
               R"J(<float, 128, 128>(float const*, float*)","pid":0,"tid":7,"ts":)J" +
               std::to_string(1000 + i) +
               R"(.125,"dur":0.5,"args":{"External id":7,"device":0,"stream":7,"correlation":)" +
               std::to_string(i + 1) + R"(,"grid":[132,1,1],"block":[256,1,1],"shared memory":49152}})";
      },
      "]}");
  std::size_t events = 0;
  const std::int64_t peak = peak_during([&] { events = read_trace(in).events.size(); });
  ASSERT_EQ(events, n);
  // An input of unknown size is buffered in 64k-event chunks, copied once into the timeline's vector at
  // the end: twice 72 bytes an event at the peak, then 72 and the sort's 16-byte keys (a file of known
  // size is read straight into one vector, reserved but not touched beyond what it holds). Besides: the
  // reader's 1 MiB buffer and this test's generator, a few MiB.
  const std::int64_t fixed = std::int64_t{6} << 20;
  EXPECT_LT(peak, static_cast<std::int64_t>(n) * 2 * 80 + fixed)
      << "held " << peak << " bytes at the peak for " << n << " events";
}

}  // namespace
