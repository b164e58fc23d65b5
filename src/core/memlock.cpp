#include "ferry/core/memlock.hpp"

#include <sys/resource.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <limits>
#include <string>
#include <system_error>

#include <fmt/format.h>

#include "ferry/core/error.hpp"
#include "ferry/core/units.hpp"

namespace ferry {
namespace {

constexpr std::uint64_t unlimited_bytes = std::numeric_limits<std::uint64_t>::max();
constexpr int cap_ipc_lock_bit = 14;  // CAP_IPC_LOCK in <linux/capability.h>

std::uint64_t to_bytes(rlim_t limit) {
  return limit == RLIM_INFINITY ? unlimited_bytes : static_cast<std::uint64_t>(limit);
}

std::string limit_text(std::uint64_t bytes) {
  return bytes == unlimited_bytes ? std::string("unlimited") : format_bytes(bytes);
}

// Reading /proc avoids a libcap dependency; the CapEff line is a 64-bit hex mask.
bool has_cap_ipc_lock() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("CapEff:", 0) != 0) continue;
    try {
      const std::uint64_t mask = std::stoull(line.substr(7), nullptr, 16);
      return (mask >> cap_ipc_lock_bit) & 1U;
    } catch (const std::exception&) {
      return false;
    }
  }
  return false;
}

}  // namespace

std::string memlock_info::describe() const {
  if (unlimited) return "unlimited";
  if (cap_ipc_lock) return fmt::format("{}, not enforced (CAP_IPC_LOCK)", format_bytes(soft_bytes));
  return fmt::format("{} (hard {})", format_bytes(soft_bytes), limit_text(hard_bytes));
}

memlock_info read_memlock() {
  rlimit limit{};
  if (getrlimit(RLIMIT_MEMLOCK, &limit) != 0) {
    const int err = errno;
    throw logic_error(
        fmt::format("getrlimit(RLIMIT_MEMLOCK) failed: {}", std::generic_category().message(err)));
  }
  memlock_info info;
  info.soft_bytes = to_bytes(limit.rlim_cur);
  info.hard_bytes = to_bytes(limit.rlim_max);
  info.unlimited = limit.rlim_cur == RLIM_INFINITY;
  info.cap_ipc_lock = has_cap_ipc_lock();
  return info;
}

bool fits_memlock(std::uint64_t request_bytes, std::uint64_t locked_bytes,
                  const memlock_info& info) noexcept {
  if (!info.enforced()) return true;
  return request_bytes <= unlimited_bytes - locked_bytes && request_bytes + locked_bytes <= info.soft_bytes;
}

void check_memlock(std::uint64_t request_bytes, std::uint64_t locked_bytes, const memlock_info& info) {
  if (fits_memlock(request_bytes, locked_bytes, info)) return;
  const bool overflows = request_bytes > unlimited_bytes - locked_bytes;
  const std::uint64_t needed = overflows ? unlimited_bytes : request_bytes + locked_bytes;
  std::string message = fmt::format(
      "pinning {} (on top of {} already pinned by ferry) exceeds RLIMIT_MEMLOCK of {}; raise it with "
      "`ulimit -l` (hard limit {}) or run with CAP_IPC_LOCK",
      format_bytes(request_bytes), format_bytes(locked_bytes), format_bytes(info.soft_bytes),
      limit_text(info.hard_bytes));
  // `ulimit -l` cannot go past the hard limit without privilege, so say where that one is set.
  if (needed > info.hard_bytes) {
    message += fmt::format(
        "; {} is above the hard limit too, which is raised in "
        "/etc/security/limits.conf or the service's LimitMEMLOCK",
        format_bytes(needed));
  }
  throw out_of_memory(message);
}

}  // namespace ferry
