#include "ferry/bench/start_line.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <thread>

namespace {

using namespace std::chrono_literals;

TEST(start_line, every_run_gets_one_start_taken_when_the_last_arrives) {
  ferry::bench::start_line line(2, 30ms);
  auto early = std::async(std::launch::async, [&] { return line.arrive(); });
  std::this_thread::sleep_for(20ms);  // the early run waits for the late one however long its set-up takes
  const auto late_came = std::chrono::steady_clock::now();
  const auto late = line.arrive();
  EXPECT_EQ(early.get(), late);
  EXPECT_GE(late, late_came);
  EXPECT_EQ(line.deadline(), late + 30ms);
}

TEST(start_line, a_run_that_leaves_releases_the_others) {
  ferry::bench::start_line line(3, 1s);
  auto a = std::async(std::launch::async, [&] { return line.arrive(); });
  line.leave();  // failed during its set-up
  const auto b = line.arrive();
  EXPECT_EQ(a.get(), b);
  line.leave();  // leaving after arriving changes nothing
  EXPECT_EQ(line.deadline(), b + 1s);
}

}  // namespace
