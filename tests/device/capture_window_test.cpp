#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "ferry/core/error.hpp"
#include "ferry/device/capture.hpp"
#include "ferry/device/device.hpp"
#include "ferry/trace/range.hpp"

namespace {

struct calls {
  std::vector<std::string> log;
  std::vector<std::uint64_t> at_step;
};

TEST(capture_window, opens_after_warmup_and_closes_after_steps) {
  calls c;
  std::uint64_t step = 0;
  {
    ferry::trace::capture_window w([&] { c.log.push_back("start"), c.at_step.push_back(step); },
                                   [&] { c.log.push_back("stop"), c.at_step.push_back(step); }, 3, 2);
    for (step = 0; step < 10; ++step) {
      w.step();
      EXPECT_EQ(w.capturing(), step >= 3 && step < 5) << "step " << step;
    }
    EXPECT_TRUE(w.done());
    EXPECT_EQ(w.steps_seen(), 10u);
  }
  ASSERT_EQ(c.log, (std::vector<std::string>{"start", "stop"}));
  // Steps 3 and 4 are inside the window: it opens as step 3 begins and closes as step 5 begins.
  EXPECT_EQ(c.at_step, (std::vector<std::uint64_t>{3, 5}));
}

TEST(capture_window, zero_warmup_opens_at_first_step) {
  int starts = 0, stops = 0;
  ferry::trace::capture_window w([&] { ++starts; }, [&] { ++stops; }, 0, 1);
  w.step();
  EXPECT_TRUE(w.capturing());
  EXPECT_EQ(starts, 1);
  w.step();
  EXPECT_FALSE(w.capturing());
  EXPECT_EQ(stops, 1);
}

TEST(capture_window, destroying_an_open_window_stops_it) {
  int stops = 0;
  {
    ferry::trace::capture_window w([] {}, [&] { ++stops; }, 0, 100);
    w.step();
    ASSERT_TRUE(w.capturing());
  }
  EXPECT_EQ(stops, 1);
}

TEST(capture_window, zero_steps_is_rejected_with_a_reason) {
  try {
    ferry::trace::capture_window w([] {}, [] {}, 5, 0);
    FAIL() << "a window of 0 steps was accepted";
  } catch (const ferry::logic_error& e) {
    EXPECT_NE(std::string(e.what()).find("0 steps"), std::string::npos) << e.what();
  }
}

TEST(capture_window, drives_the_device_profiler_range) {
  auto dev = ferry::make_host_device();
  ferry::trace::capture_window w(*dev, 1, 1);
  for (int i = 0; i < 3; ++i) w.step();
  EXPECT_TRUE(w.done());
}

TEST(range, nests_and_compiles_in_either_build) {
  // Without an NVTX tool attached the calls must be harmless; with FERRY_WITH_NVTX=OFF they vanish.
  int inner_ran = 0;
  {
    FERRY_RANGE("outer", ferry::trace::color::blue);
    {
      FERRY_RANGE("inner", ferry::trace::color::green);
      ferry::trace::mark("instant", ferry::trace::color::red);
      ++inner_ran;
    }
  }
  EXPECT_EQ(inner_ran, 1);
#if FERRY_NVTX
  EXPECT_TRUE(ferry::trace::nvtx_enabled());
#else
  EXPECT_FALSE(ferry::trace::nvtx_enabled());
#endif
}

}  // namespace
