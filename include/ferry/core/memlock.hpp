// RLIMIT_MEMLOCK: how much memory this process may lock (pin) with mlock, as the kernel enforces it.
#pragma once

#include <cstdint>
#include <string>

namespace ferry {

/// The process's locked-memory limit and whether the kernel applies it to this process.
struct memlock_info {
  std::uint64_t soft_bytes = 0;  // RLIMIT_MEMLOCK soft limit (UINT64_MAX when unlimited)
  std::uint64_t hard_bytes = 0;  // RLIMIT_MEMLOCK hard limit (UINT64_MAX when unlimited)
  bool unlimited = false;        // soft limit is RLIM_INFINITY
  bool cap_ipc_lock = false;     // the process holds CAP_IPC_LOCK, so the kernel ignores the limit
  /// True when the kernel applies the soft limit to this process: it is finite and there is no
  /// CAP_IPC_LOCK. When false, locking any amount succeeds as far as the limit is concerned.
  [[nodiscard]] bool enforced() const noexcept { return !unlimited && !cap_ipc_lock; }
  /// "8.00 MiB (hard 8.00 MiB)", "unlimited", or "8.00 MiB, not enforced (CAP_IPC_LOCK)".
  [[nodiscard]] std::string describe() const;
};

/// Reads RLIMIT_MEMLOCK (getrlimit) and CAP_IPC_LOCK (the effective set in /proc/self/status) of the
/// calling process. Does not block. Throws ferry::logic_error when getrlimit fails; a missing or
/// unreadable /proc reads as "no CAP_IPC_LOCK".
[[nodiscard]] memlock_info read_memlock();

/// True when locking `request_bytes` more, on top of `locked_bytes` already locked by this process, stays
/// within the limit that the kernel enforces (always when !info.enforced()): check_memlock would pass.
[[nodiscard]] bool fits_memlock(std::uint64_t request_bytes, std::uint64_t locked_bytes,
                                const memlock_info& info) noexcept;

/// Throws ferry::out_of_memory when locking `request_bytes` more, on top of `locked_bytes` already
/// locked by this process, would exceed the limit that the kernel enforces. The message names the
/// request, what is already locked, the limit, and how to raise it. Does nothing when !info.enforced().
void check_memlock(std::uint64_t request_bytes, std::uint64_t locked_bytes, const memlock_info& info);

}  // namespace ferry
