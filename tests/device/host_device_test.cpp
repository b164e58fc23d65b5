// Behaviour of the emulated host device that the conformance suite cannot ask of a GPU: the link model
// (bandwidth, latency, copy engines, duplex), blocking pageable copies, the emulated memory cap, page
// locking against RLIMIT_MEMLOCK (or unlocked memory past it), jitter, and the lifetime rules of its threads.
#include <gtest/gtest.h>
#include <linux/capability.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <future>
#include <memory>
#include <string>
#include <string_view>

#include "ferry/core/error.hpp"
#include "ferry/core/units.hpp"
#include "ferry/cuda/cuda.hpp"
#include "ferry/device/device.hpp"
#include "support/test_support.hpp"

namespace ferry {
namespace {

using namespace std::chrono_literals;
using steady = std::chrono::steady_clock;
using testing::held_stream;
using testing::message_of;

double ms_since(steady::time_point t0) {
  return std::chrono::duration<double, std::milli>(steady::now() - t0).count();
}

// Milliseconds a copy of `bytes` takes at `gbps` decimal GB/s.
double modelled_ms(std::size_t bytes, double gbps) { return static_cast<double>(bytes) / (gbps * 1e6); }

// No jitter: these tests time single operations.
host_device_options quiet_options() {
  host_device_options o;
  o.latency = 0ns;
  return o;
}

// The timed tests model a slow link (15.6 MB/s: 1 MiB takes 67 ms) on small buffers, so that memcpy,
// about ten times slower under ThreadSanitizer, stays far below the modelled time.
constexpr double slow_gbps = 1.0 / 64;

TEST(host_link_model, a_copy_lasts_its_modelled_duration) {
  constexpr std::size_t n = MiB;
  host_device_options o = quiet_options();
  o.h2d_gbps = slow_gbps;
  const double expected = modelled_ms(n, o.h2d_gbps);  // 67.1 ms
  auto dev = make_host_device(o);
  stream s = dev->make_stream();
  buffer src = dev->alloc_pinned(n);
  buffer d = dev->alloc_device(n);
  buffer back = dev->alloc_pinned(n);
  std::memset(src.host_bytes(), 0x3C, n);

  // The copy lasts its modelled time exactly on the device's clock (timing events), and never less in
  // wall time; how much more depends on how busy the machine is, which the test does not assert. The
  // stream is held while the test queues, so the copy follows the start event however slowly it does.
  event start = dev->make_timing_event();
  event stop = dev->make_timing_event();
  const auto t0 = steady::now();
  {
    const held_stream hold(*dev, s);
    start.record(s);
    dev->copy_async(d, src, s);
    stop.record(s);
  }
  stop.synchronize();
  EXPECT_GE(ms_since(t0), expected);
  EXPECT_NEAR(dev->elapsed_ms(start, stop), expected, 1e-5);
  dev->copy(back, d, s);
  EXPECT_EQ(std::memcmp(back.host_bytes(), src.host_bytes(), n), 0) << "the modelled copy did not copy";

  // Without the model even an absurd bandwidth (1 MiB would take 17 minutes at 1 kB/s) costs nothing:
  // the bound is a minute, far from 17 and far above a memcpy of 1 MiB on the busiest machine.
  o.model_link = false;
  o.h2d_gbps = 1e-6;
  auto unmodelled = make_host_device(o);
  stream s2 = unmodelled->make_stream();
  buffer src2 = unmodelled->alloc_pinned(n);
  buffer d2 = unmodelled->alloc_device(n);
  const auto t1 = steady::now();
  unmodelled->copy(d2, src2, s2);
  EXPECT_LT(ms_since(t1), 60'000.0) << "model_link = false still paced the copy";
}

TEST(host_link_model, timing_events_measure_modelled_time_however_late_the_stream_threads_run) {
  // Jitter delays every stream operation by up to 30 ms of wall time, as a busy machine does to the
  // emulator's threads. Events read the modelled clock, so the spin and the copy between them still
  // measure exactly their modelled 10 ms + 1 MiB at the link's rate, on every stream.
  constexpr std::size_t n = MiB;
  host_device_options o = quiet_options();
  o.h2d_gbps = 1.0;
  o.d2h_gbps = 1.0;
  o.jitter_probability = 1.0;
  o.jitter_max = 30ms;
  o.seed = 9;
  auto dev = make_host_device(o);
  buffer h = dev->alloc_pinned(n);
  buffer d = dev->alloc_device(n);
  stream s = dev->make_stream();
  stream other = dev->make_stream();
  event start = dev->make_timing_event();
  event copied = dev->make_timing_event();
  event stop = dev->make_timing_event();
  {
    const held_stream hold(*dev, s);
    start.record(s);
    dev->spin_async(10ms, s);
    dev->copy_async(d, h, s);
    copied.record(s);
    other.wait(copied);  // another stream starts no earlier than the event, in modelled time too
    dev->copy_async(h, d, other);
    stop.record(other);
  }
  stop.synchronize();
  EXPECT_NEAR(dev->elapsed_ms(start, copied), 10.0 + modelled_ms(n, 1.0), 1e-5);
  EXPECT_NEAR(dev->elapsed_ms(copied, stop), modelled_ms(n, 1.0), 1e-5);
}

TEST(host_link_model, latency_comes_before_the_first_byte) {
  host_device_options o = quiet_options();
  o.latency = 30ms;
  auto dev = make_host_device(o);
  stream s = dev->make_stream();
  buffer h = dev->alloc_pinned(1);
  buffer d = dev->alloc_device(1);
  const auto t0 = steady::now();
  dev->copy(d, h, s);
  EXPECT_GE(ms_since(t0), 30.0);
}

TEST(host_link_model, device_to_device_copies_follow_d2d_bandwidth) {
  constexpr std::size_t n = 512 * KiB;
  host_device_options o = quiet_options();
  o.d2d_gbps = slow_gbps;
  auto dev = make_host_device(o);
  stream s = dev->make_stream();
  buffer a = dev->alloc_device(n);
  buffer b = dev->alloc_device(n);
  const auto t0 = steady::now();
  dev->copy(b, a, s);
  EXPECT_GE(ms_since(t0), modelled_ms(n, o.d2d_gbps));
}

TEST(host_link_model, same_direction_copies_take_turns_on_one_engine) {
  constexpr std::size_t n = MiB;
  host_device_options o = quiet_options();
  o.h2d_gbps = slow_gbps;
  o.d2h_gbps = slow_gbps;
  const double one = modelled_ms(n, o.h2d_gbps);  // 67.1 ms
  auto dev = make_host_device(o);
  stream a = dev->make_stream();
  stream b = dev->make_stream();
  buffer h1 = dev->alloc_pinned(n);
  buffer h2 = dev->alloc_pinned(n);
  buffer d1 = dev->alloc_device(n);
  buffer d2 = dev->alloc_device(n);

  // Both streams wait for one event behind a held stream, so in modelled time both copies are queued at
  // one moment; the window runs from that moment to the later copy's end.
  stream g = dev->make_stream();
  auto window_ms = [&](mem_view dst1, mem_view src1, mem_view dst2, mem_view src2) {
    event go = dev->make_timing_event();
    event a_done = dev->make_timing_event();
    event b_done = dev->make_timing_event();
    {
      const held_stream hold(*dev, g);
      go.record(g);
      a.wait(go);
      b.wait(go);
      dev->copy_async(dst1, src1, a);
      dev->copy_async(dst2, src2, b);
      a_done.record(a);
      b_done.record(b);
    }
    a.synchronize();
    b.synchronize();
    return std::max(dev->elapsed_ms(go, a_done), dev->elapsed_ms(go, b_done));
  };

  auto t0 = steady::now();
  EXPECT_NEAR(window_ms(d1, h1, d2, h2), 2 * one, 1e-5) << "two host-to-device copies ran side by side";
  EXPECT_GE(ms_since(t0), 2 * one);

  // Opposite directions use different engines; with a duplex budget above both links they overlap fully.
  EXPECT_NEAR(window_ms(d1, h1, h2, d2), one, 1e-5) << "copies in opposite directions did not overlap";
}

TEST(host_link_model, both_directions_at_once_share_the_duplex_budget) {
  constexpr std::size_t n = 512 * KiB;
  host_device_options o = quiet_options();
  o.h2d_gbps = slow_gbps;
  o.d2h_gbps = slow_gbps;
  o.duplex_gbps = slow_gbps;  // each direction gets half while both run
  const double alone = modelled_ms(n, o.h2d_gbps);
  auto dev = make_host_device(o);
  stream a = dev->make_stream();
  stream b = dev->make_stream();
  buffer h1 = dev->alloc_pinned(n);
  buffer h2 = dev->alloc_pinned(n);
  buffer d1 = dev->alloc_device(n);
  buffer d2 = dev->alloc_device(n);
  const auto t0 = steady::now();
  dev->copy_async(d1, h1, a);
  dev->copy_async(h2, d2, b);
  a.synchronize();
  b.synchronize();
  EXPECT_GE(ms_since(t0), 1.8 * alone);
}

TEST(host_pageable, copy_async_blocks_the_caller_until_the_copy_is_done) {
  constexpr std::size_t n = MiB;
  host_device_options o = quiet_options();
  o.pageable_h2d_gbps = slow_gbps;
  o.h2d_gbps = slow_gbps;
  const double expected = modelled_ms(n, slow_gbps);
  auto dev = make_host_device(o);
  stream s = dev->make_stream();
  buffer pageable = dev->alloc_pageable(n);
  buffer pinned = dev->alloc_pinned(n);
  buffer d = dev->alloc_device(n);

  auto t0 = steady::now();
  dev->copy_async(d, pageable, s);
  EXPECT_GE(ms_since(t0), expected) << "a pageable copy_async returned before its copy";

  // A pinned copy of the same size returns at once and completes later: queued behind a held stream, it
  // returns while the stream cannot have started it (a copy that blocked would wait out the minute).
  event done = dev->make_event();
  {
    held_stream hold(*dev, s);
    auto queued = std::async(std::launch::async, [&] {
      dev->copy_async(d, pinned, s);
      done.record(s);
    });
    EXPECT_EQ(queued.wait_for(60s), std::future_status::ready) << "a pinned copy_async waited for its copy";
    EXPECT_FALSE(done.query());
    hold.open();
    queued.get();
  }
  done.synchronize();
}

TEST(host_pageable, a_pageable_copy_waits_its_turn_in_the_stream) {
  auto dev = make_host_device(quiet_options());
  stream s = dev->make_stream();
  buffer pageable = dev->alloc_pageable(64);
  buffer d = dev->alloc_device(64);
  const auto t0 = steady::now();  // before the spin, which lasts 100 ms from when it was queued
  dev->spin_async(100ms, s);
  dev->copy_async(d, pageable, s);
  EXPECT_GE(ms_since(t0), 100.0);
}

TEST(host_memory, device_memory_is_capped_at_the_configured_size) {
  host_device_options o = quiet_options();
  o.device_memory_bytes = MiB;
  auto dev = make_host_device(o);
  buffer a = dev->alloc_device(768 * KiB);
  const std::string msg = message_of<out_of_memory>([&] { static_cast<void>(dev->alloc_device(512 * KiB)); });
  EXPECT_MESSAGE_HAS(msg, "512 KiB");
  EXPECT_MESSAGE_HAS(msg, "256 KiB free of 1.00 MiB");
  a = buffer{};
  buffer whole = dev->alloc_device(MiB);
  EXPECT_EQ(whole.size(), MiB);
  EXPECT_EQ(dev->info().memory_bytes, MiB);
}

// Kibibytes the process has locked, as the kernel counts them.
long locked_kib() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmLck:", 0) == 0) return std::stol(line.substr(6));
  }
  return -1;
}

// Sanitizer runtimes turn mlock into a no-op (locking with terabytes of shadow mapped once deadlocked
// kernels), so what the kernel counts as locked can be tested only in a build without them.
bool mlock_locks_pages() {
  const long before = locked_kib();
  const std::size_t page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  void* p = ::mmap(nullptr, page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return false;
  bool counted = false;
  if (::mlock(p, page) == 0) {
    counted = locked_kib() > before;
    ::munlock(p, page);
  }
  ::munmap(p, page);
  return counted;
}

TEST(host_memory, pinned_buffers_are_locked_in_memory_until_freed) {
  if (!mlock_locks_pages()) GTEST_SKIP() << "mlock is a no-op in this build (a sanitizer intercepts it)";
  auto dev = make_host_device(quiet_options());
  const long before = locked_kib();
  ASSERT_GE(before, 0);
  {
    buffer b = dev->alloc_pinned(MiB + 1);  // locked in whole pages
    EXPECT_GE(locked_kib() - before, 1025);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(b.data()) % 4096, 0u);
  }
  EXPECT_EQ(locked_kib(), before);
  buffer pageable = dev->alloc_pageable(100);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(pageable.data()) % 4096, 0u);
}

// Ends a forked child with `why` on stderr and exit status 1.
[[noreturn]] void fail_child(const std::string& why) {
  std::fprintf(stderr, "%s\n", why.c_str());
  std::fflush(stderr);
  ::_exit(1);
}

// In a forked child: lowers RLIMIT_MEMLOCK to 1 MiB (or the hard limit where that is lower, a whole
// number of 16 KiB) and drops CAP_IPC_LOCK, with which (root) the kernel ignores the limit, as an
// unprivileged user has it. Returns the limit; ends the child when the kernel does not enforce it.
std::size_t lower_memlock_as_a_user_has_it() {
  rlimit rl{};
  if (::getrlimit(RLIMIT_MEMLOCK, &rl) != 0) fail_child("getrlimit failed");
  const bool hard_above = rl.rlim_max == RLIM_INFINITY || rl.rlim_max > MiB;
  const std::size_t limit = hard_above ? MiB : rl.rlim_max / (16 * KiB) * (16 * KiB);
  if (limit == 0) fail_child("the hard RLIMIT_MEMLOCK is below 16 KiB");
  rl.rlim_cur = limit;
  if (::setrlimit(RLIMIT_MEMLOCK, &rl) != 0) fail_child("setrlimit failed");

  __user_cap_header_struct header{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct caps[_LINUX_CAPABILITY_U32S_3]{};
  if (::syscall(SYS_capget, &header, caps) != 0) fail_child("capget failed");
  caps[CAP_TO_INDEX(CAP_IPC_LOCK)].effective &= ~CAP_TO_MASK(CAP_IPC_LOCK);
  if (::syscall(SYS_capset, &header, caps) != 0) fail_child("capset could not drop CAP_IPC_LOCK");
  // Asked of the kernel directly: a sanitizer's mlock interceptor would answer yes without asking.
  void* probe = ::mmap(nullptr, 2 * MiB, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (probe == MAP_FAILED) fail_child("mmap failed");
  if (::syscall(SYS_mlock, probe, 2 * MiB) == 0)
    fail_child("the kernel does not enforce the lowered RLIMIT_MEMLOCK");
  ::munmap(probe, 2 * MiB);
  return limit;
}

// Runs in a forked child, so the lowered limit and the dropped capability die with it. Exits 0 when the
// emulator, asked to lock its pinned memory as a GPU must (require_locked_pinned), refused to pin past
// the limit with an error naming RLIMIT_MEMLOCK; otherwise says why on stderr and exits 1. The child
// makes no threads and leaves through _exit.
[[noreturn]] void pin_past_a_lowered_memlock_limit() {
  const auto fail = fail_child;
  const std::size_t limit = lower_memlock_as_a_user_has_it();
  try {
    host_device_options o = quiet_options();
    o.require_locked_pinned = true;
    auto dev = make_host_device(o);
    { buffer fits = dev->alloc_pinned(limit / 4); }
    // Past the limit by this device's own count: check_memlock refuses before mlock is tried.
    try {
      buffer too_big = dev->alloc_pinned(4 * limit);
      fail("alloc_pinned of 4 times RLIMIT_MEMLOCK succeeded");
    } catch (const out_of_memory& e) {
      if (std::strstr(e.what(), "RLIMIT_MEMLOCK") == nullptr) {
        fail(std::string("message lacks RLIMIT_MEMLOCK: ") + e.what());
      }
    }
    // Past the limit only with memory locked elsewhere in the process: mlock itself refuses. Without a
    // real mlock (sanitizer builds) the emulator cannot notice this case.
    if (!mlock_locks_pages()) ::_exit(0);
    const std::size_t elsewhere = limit / 4 * 3;
    void* other = ::mmap(nullptr, elsewhere, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (other == MAP_FAILED || ::mlock(other, elsewhere) != 0)
      fail("could not lock 3/4 of the limit elsewhere");
    try {
      buffer too_big = dev->alloc_pinned(limit / 2);
      fail("alloc_pinned of half RLIMIT_MEMLOCK succeeded with 3/4 of it locked elsewhere");
    } catch (const out_of_memory& e) {
      if (std::strstr(e.what(), "RLIMIT_MEMLOCK") == nullptr) {
        fail(std::string("message lacks RLIMIT_MEMLOCK: ") + e.what());
      }
      if (std::strstr(e.what(), "mlock") == nullptr)
        fail(std::string("message lacks the failed mlock: ") + e.what());
    }
    ::munlock(other, elsewhere);
    ::munmap(other, elsewhere);
    // The failures left no locked pages behind in the device's count.
    buffer fits_again = dev->alloc_pinned(limit / 2);
  } catch (const std::exception& e) {
    fail(std::string("unexpected exception: ") + e.what());
  }
  ::_exit(0);
}

// What the emulator does by default for a user whose RLIMIT_MEMLOCK is low (8 MiB is the usual default):
// pinned buffers past it are unlocked memory, usable as pinned memory, with one note on stderr for the
// whole process. Runs in a forked child; stderr goes to a file that the child reads back. Exits 0 when
// all is as it should be, else 1 with the reason on the original stderr.
[[noreturn]] void pin_past_the_limit_falls_back_to_unlocked_memory() {
  const std::size_t limit = lower_memlock_as_a_user_has_it();
  const int saved_stderr = ::dup(2);
  std::FILE* captured = std::tmpfile();
  if (saved_stderr < 0 || captured == nullptr || ::dup2(::fileno(captured), 2) < 0)
    fail_child("cannot capture stderr");
  std::string why;
  try {
    auto dev = make_host_device(quiet_options());
    auto other = make_host_device(quiet_options());
    stream s = dev->make_stream();
    buffer within = dev->alloc_pinned(limit / 4);        // locked
    buffer past = dev->alloc_pinned(4 * limit);          // unlocked: past the limit by the device's count
    buffer again = dev->alloc_pinned(4 * limit);         // unlocked too: no second note
    buffer other_past = other->alloc_pinned(2 * limit);  // nor for another device
    // Pinned memory in every way the device's users see: copies through it are exact.
    buffer d = dev->alloc_device(4 * limit);
    std::memset(past.host_bytes(), 0x5A, 4 * limit);
    std::memset(again.host_bytes(), 0, 4 * limit);
    dev->copy_async(d, past, 4 * limit, s);
    dev->copy_async(again, d, 4 * limit, s);
    s.synchronize();
    if (std::memcmp(past.host_bytes(), again.host_bytes(), 4 * limit) != 0) why = "the copy differs";
  } catch (const std::exception& e) {
    why = std::string("unexpected exception: ") + e.what();
  }
  // Every buffer was freed (unlocked ones not munlocked, not counted as leaked) before the devices went.
  std::fflush(stderr);
  ::dup2(saved_stderr, 2);
  std::string text(1 << 16, '\0');
  std::rewind(captured);
  text.resize(std::fread(text.data(), 1, text.size(), captured));
  if (!why.empty()) fail_child(why + "\nstderr:\n" + text);
  std::size_t notes = 0;
  for (std::size_t at = text.find("ferry: note:"); at != std::string::npos;
       at = text.find("ferry: note:", at + 1))
    ++notes;
  if (notes != 1) fail_child("expected one note on stderr, got " + std::to_string(notes) + ":\n" + text);
  for (const char* part : {"unlocked memory", "RLIMIT_MEMLOCK", "ulimit -l"}) {
    if (text.find(part) == std::string::npos)
      fail_child(std::string("the note lacks \"") + part + "\": " + text);
  }
  if (std::count(text.begin(), text.end(), '\n') != 1)
    fail_child("stderr holds more than the note:\n" + text);
  ::_exit(0);
}

TEST(host_memlock_DeathTest,
     pinning_past_rlimit_memlock_is_out_of_memory_naming_it_when_locking_is_required) {
  EXPECT_EXIT(pin_past_a_lowered_memlock_limit(), ::testing::ExitedWithCode(0), "");
}

TEST(host_memlock_DeathTest, pinning_past_rlimit_memlock_falls_back_to_unlocked_memory_with_one_note) {
  EXPECT_EXIT(pin_past_the_limit_falls_back_to_unlocked_memory(), ::testing::ExitedWithCode(0), "");
}

TEST(host_streams, adopt_stream_accepts_only_live_streams_of_this_device) {
  auto dev = make_host_device(quiet_options());
  auto other = make_host_device(quiet_options());
  int not_a_stream = 0;
  EXPECT_MESSAGE_HAS(message_of<logic_error>([&] { static_cast<void>(dev->adopt_stream(&not_a_stream)); }),
                     "not a live stream of this host device");
  stream foreign = other->make_stream();
  EXPECT_THROW(static_cast<void>(dev->adopt_stream(foreign.view().native())), logic_error);
  void* gone = nullptr;
  {
    stream s = dev->make_stream();
    gone = s.view().native();
    EXPECT_NO_THROW(static_cast<void>(dev->adopt_stream(gone)));
  }
  EXPECT_THROW(static_cast<void>(dev->adopt_stream(gone)), logic_error);
}

TEST(host_streams, destroying_a_stream_finishes_its_queued_work) {
  auto dev = make_host_device(quiet_options());
  std::atomic<bool> ran{false};
  {
    stream s = dev->make_stream();
    dev->spin_async(30ms, s);
    dev->launch_host_func(s, [&] { ran = true; });
  }
  EXPECT_TRUE(ran.load());
}

TEST(host_streams, destroying_an_event_that_a_stream_still_waits_on_is_safe) {
  auto dev = make_host_device(quiet_options());
  stream a = dev->make_stream();
  stream b = dev->make_stream();
  std::atomic<bool> waited{false};
  const auto t0 = steady::now();
  {
    event e = dev->make_timing_event();  // not pooled: destroying it destroys the handle
    dev->spin_async(50ms, a);
    e.record(a);
    b.wait(e);
    dev->launch_host_func(b, [&] { waited = true; });
  }
  b.synchronize();
  EXPECT_TRUE(waited.load());
  EXPECT_GE(ms_since(t0), 49.0) << "the wait ended when its event was destroyed";
}

TEST(host_jitter, seeded_delays_slow_operations_down) {
  host_device_options o = quiet_options();
  o.jitter_probability = 1.0;
  o.jitter_max = 2ms;  // uniform in [0, 2 ms]: 50 operations sleep about 50 ms in all
  auto dev = make_host_device(o);
  stream s = dev->make_stream();
  const auto t0 = steady::now();
  for (int i = 0; i < 50; ++i) dev->launch_host_func(s, [] {});
  s.synchronize();
  EXPECT_GE(ms_since(t0), 20.0);
}

TEST(host_options, bad_options_are_a_logic_error_naming_the_option) {
  host_device_options o;
  o.h2d_gbps = 0;
  EXPECT_MESSAGE_HAS(message_of<logic_error>([&] { static_cast<void>(make_host_device(o)); }), "h2d_gbps");
  o.model_link = false;  // bandwidths are not used then
  EXPECT_NO_THROW(static_cast<void>(make_host_device(o)));
  o.jitter_probability = 1.5;
  EXPECT_MESSAGE_HAS(message_of<logic_error>([&] { static_cast<void>(make_host_device(o)); }),
                     "jitter_probability");
}

TEST(host_info, describes_the_emulator) {
  auto dev = make_host_device();
  const device_info info = dev->info();
  EXPECT_EQ(info.kind, backend::host);
  EXPECT_EQ(info.copy_engines, 2);
  EXPECT_TRUE(info.pci_bus_id.empty());
  EXPECT_EQ(info.memory_bytes, host_device_options{}.device_memory_bytes);
}

TEST(host_names, backends_parse_and_print) {
  EXPECT_EQ(parse_backend("host"), backend::host);
  EXPECT_EQ(parse_backend("cuda"), backend::cuda);
  EXPECT_EQ(to_string(backend::cuda), "cuda");
  EXPECT_EQ(to_string(memory_kind::pinned), "pinned");
  EXPECT_EQ(to_string(copy_direction::device_to_host), "device_to_host");
  EXPECT_MESSAGE_HAS(message_of<logic_error>([] { static_cast<void>(parse_backend("gpu")); }), "\"gpu\"");
  std::string reason;
  auto dev = make_default_device(&reason);
  EXPECT_FALSE(reason.empty());
  EXPECT_EQ(dev->kind(), cuda_available() ? backend::cuda : backend::host);
}

}  // namespace
}  // namespace ferry
