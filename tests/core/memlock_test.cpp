#include "ferry/core/memlock.hpp"

#include <sys/resource.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>

#include "ferry/core/error.hpp"
#include "ferry/core/units.hpp"

namespace {

using ferry::GiB;
using ferry::MiB;

constexpr std::uint64_t unlimited = std::numeric_limits<std::uint64_t>::max();

ferry::memlock_info enforced_limit(std::uint64_t soft, std::uint64_t hard) {
  ferry::memlock_info info;
  info.soft_bytes = soft;
  info.hard_bytes = hard;
  return info;
}

std::string memlock_message(std::uint64_t request, std::uint64_t locked, const ferry::memlock_info& info) {
  try {
    ferry::check_memlock(request, locked, info);
  } catch (const ferry::out_of_memory& e) {
    return e.what();
  }
  return {};
}

TEST(memlock, enforced_only_without_unlimited_and_cap) {
  auto info = enforced_limit(8 * MiB, 8 * MiB);
  EXPECT_TRUE(info.enforced());
  info.cap_ipc_lock = true;
  EXPECT_FALSE(info.enforced());
  info.cap_ipc_lock = false;
  info.unlimited = true;
  EXPECT_FALSE(info.enforced());
}

TEST(memlock, check_passes_within_limit) {
  const auto info = enforced_limit(8 * MiB, 8 * MiB);
  EXPECT_NO_THROW(ferry::check_memlock(8 * MiB, 0, info));
  EXPECT_NO_THROW(ferry::check_memlock(4 * MiB, 4 * MiB, info));
  EXPECT_NO_THROW(ferry::check_memlock(0, 8 * MiB, info));
}

TEST(memlock, check_message_names_request_locked_limit_and_remedy) {
  const auto info = enforced_limit(8 * MiB, 8 * MiB);
  EXPECT_THROW(ferry::check_memlock(GiB, 0, info), ferry::out_of_memory);
  const std::string msg = memlock_message(GiB, 0, info);
  EXPECT_EQ(msg.rfind("pinning 1.00 GiB (on top of 0 B already pinned by ferry) exceeds RLIMIT_MEMLOCK of "
                      "8.00 MiB; raise it with `ulimit -l` (hard limit 8.00 MiB) or run with CAP_IPC_LOCK",
                      0),
            0U)
      << msg;
}

TEST(memlock, check_counts_what_is_already_locked) {
  const auto info = enforced_limit(64 * MiB, unlimited);
  const std::string msg = memlock_message(MiB, 64 * MiB, info);
  EXPECT_NE(msg.find("pinning 1.00 MiB (on top of 64.0 MiB already pinned by ferry)"), std::string::npos)
      << msg;
  EXPECT_NE(msg.find("hard limit unlimited"), std::string::npos) << msg;
  // Within the hard limit, `ulimit -l` is the whole remedy.
  EXPECT_EQ(msg.find("limits.conf"), std::string::npos) << msg;
}

TEST(memlock, check_says_when_the_hard_limit_must_rise_too) {
  const std::string msg = memlock_message(GiB, 0, enforced_limit(8 * MiB, 16 * MiB));
  EXPECT_NE(msg.find("hard limit 16.0 MiB"), std::string::npos) << msg;
  EXPECT_NE(msg.find("limits.conf"), std::string::npos) << msg;
}

TEST(memlock, check_does_not_overflow) {
  const auto info = enforced_limit(8 * MiB, 8 * MiB);
  EXPECT_THROW(ferry::check_memlock(unlimited, 8 * MiB, info), ferry::out_of_memory);
  EXPECT_THROW(ferry::check_memlock(2, unlimited - 1, info), ferry::out_of_memory);
}

TEST(memlock, fits_answers_as_check_does) {
  auto info = enforced_limit(8 * MiB, 8 * MiB);
  EXPECT_TRUE(ferry::fits_memlock(4 * MiB, 4 * MiB, info));
  EXPECT_FALSE(ferry::fits_memlock(4 * MiB, 4 * MiB + 1, info));
  EXPECT_FALSE(ferry::fits_memlock(unlimited, 8 * MiB, info));
  EXPECT_FALSE(ferry::fits_memlock(2, unlimited - 1, info));
  info.cap_ipc_lock = true;
  EXPECT_TRUE(ferry::fits_memlock(64 * GiB, 64 * GiB, info));
}

TEST(memlock, check_ignores_limit_not_enforced) {
  auto info = enforced_limit(8 * MiB, 8 * MiB);
  info.cap_ipc_lock = true;
  EXPECT_NO_THROW(ferry::check_memlock(64 * GiB, 64 * GiB, info));
  info.cap_ipc_lock = false;
  info.unlimited = true;
  info.soft_bytes = unlimited;
  EXPECT_NO_THROW(ferry::check_memlock(64 * GiB, 64 * GiB, info));
}

TEST(memlock, describe) {
  auto info = enforced_limit(8 * MiB, 8 * MiB);
  EXPECT_EQ(info.describe(), "8.00 MiB (hard 8.00 MiB)");
  info.hard_bytes = unlimited;
  EXPECT_EQ(info.describe(), "8.00 MiB (hard unlimited)");
  info.cap_ipc_lock = true;
  EXPECT_EQ(info.describe(), "8.00 MiB, not enforced (CAP_IPC_LOCK)");
  info.cap_ipc_lock = false;
  info.unlimited = true;
  info.soft_bytes = unlimited;
  EXPECT_EQ(info.describe(), "unlimited");
}

TEST(memlock, read_matches_getrlimit) {
  rlimit limit{};
  ASSERT_EQ(getrlimit(RLIMIT_MEMLOCK, &limit), 0);
  const auto info = ferry::read_memlock();
  EXPECT_EQ(info.unlimited, limit.rlim_cur == RLIM_INFINITY);
  EXPECT_EQ(info.soft_bytes, limit.rlim_cur == RLIM_INFINITY ? unlimited : limit.rlim_cur);
  EXPECT_EQ(info.hard_bytes, limit.rlim_max == RLIM_INFINITY ? unlimited : limit.rlim_max);
}

// Restores the soft limit even when an assertion fails, so later tests see the original.
class memlock_restorer {
 public:
  memlock_restorer() { ok_ = getrlimit(RLIMIT_MEMLOCK, &saved_) == 0; }
  memlock_restorer(const memlock_restorer&) = delete;
  memlock_restorer& operator=(const memlock_restorer&) = delete;
  ~memlock_restorer() {
    if (ok_) setrlimit(RLIMIT_MEMLOCK, &saved_);
  }
  [[nodiscard]] bool ok() const { return ok_; }
  [[nodiscard]] const rlimit& saved() const { return saved_; }

 private:
  rlimit saved_{};
  bool ok_ = false;
};

TEST(memlock, read_sees_a_lowered_soft_limit) {
  const memlock_restorer restore;
  ASSERT_TRUE(restore.ok());
  // Lowering the soft limit is always allowed; pick a value below the hard limit and the current one.
  rlim_t lowered = 3 * MiB;
  if (restore.saved().rlim_max != RLIM_INFINITY)
    lowered = std::min<rlim_t>(lowered, restore.saved().rlim_max / 2);
  if (restore.saved().rlim_cur != RLIM_INFINITY)
    lowered = std::min<rlim_t>(lowered, restore.saved().rlim_cur / 2);
  rlimit limit = restore.saved();
  limit.rlim_cur = lowered;
  ASSERT_EQ(setrlimit(RLIMIT_MEMLOCK, &limit), 0);

  const auto info = ferry::read_memlock();
  EXPECT_EQ(info.soft_bytes, lowered);
  EXPECT_FALSE(info.unlimited);
  if (!info.cap_ipc_lock) {
    EXPECT_TRUE(info.enforced());
    const std::string msg = memlock_message(lowered + 1, 0, info);
    EXPECT_NE(msg.find("exceeds RLIMIT_MEMLOCK of " + ferry::format_bytes(lowered)), std::string::npos)
        << msg;
  } else {
    EXPECT_NO_THROW(ferry::check_memlock(lowered + 1, 0, info));
  }

  ASSERT_EQ(setrlimit(RLIMIT_MEMLOCK, &restore.saved()), 0);
  const auto back = ferry::read_memlock();
  EXPECT_EQ(back.unlimited, restore.saved().rlim_cur == RLIM_INFINITY);
  if (!back.unlimited) {
    EXPECT_EQ(back.soft_bytes, restore.saved().rlim_cur);
  }
}

}  // namespace
