// The host backend's memory: device memory capped as a GPU's, pinned memory really locked where
// RLIMIT_MEMLOCK allows (else unlocked, with a note, or refused when locking is required).
#include "host_memory.hpp"

#include <fmt/format.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <string>
#include <system_error>

#include "ferry/core/error.hpp"
#include "ferry/core/memlock.hpp"
#include "ferry/core/units.hpp"

namespace ferry::host_backend {
namespace {

// cudaMalloc's alignment, so code that relies on it on a GPU is exercised with the same guarantee here.
constexpr std::size_t device_alignment = 256;

std::size_t page_size() noexcept {
  static const std::size_t page = [] {
    const long p = ::sysconf(_SC_PAGESIZE);
    return p > 0 ? static_cast<std::size_t>(p) : std::size_t{4096};
  }();
  return page;
}

// Pinned buffers cover whole pages so that no page is shared by two locked buffers: mlock does not count
// per range, and munlock of one buffer would unlock the other's shared page.
std::size_t pinned_footprint(std::size_t bytes) noexcept {
  const std::size_t page = page_size();
  return (bytes + page - 1) / page * page;
}

void* aligned_alloc_or_null(std::size_t alignment, std::size_t bytes) noexcept {
  void* p = nullptr;
  return ::posix_memalign(&p, alignment, bytes) == 0 ? p : nullptr;
}

// Once per process, however many devices and buffers fall back: an unprivileged user's 8 MiB limit
// would otherwise print it for every pool.
void note_unlocked_once(const std::string& why) {
  static std::atomic<bool> noted{false};
  if (noted.exchange(true)) return;
  std::fprintf(stderr,
               "ferry: note: the emulated device uses unlocked memory for pinned buffers: %s. The emulator "
               "needs none locked; a GPU does (raise `ulimit -l` there)\n",
               why.c_str());
  std::fflush(stderr);
}

}  // namespace

void* host_memory::alloc(std::size_t bytes, memory_kind kind) {
  switch (kind) {
    case memory_kind::device: return alloc_device(bytes);
    case memory_kind::pinned: return alloc_pinned(bytes);
    case memory_kind::pageable: {
      void* p = aligned_alloc_or_null(page_size(), bytes);
      if (p == nullptr) {
        throw out_of_memory(
            fmt::format("pageable allocation of {} failed: the host is out of memory", format_bytes(bytes)));
      }
      return p;
    }
  }
  return nullptr;
}

void host_memory::free(void* p, std::size_t bytes, memory_kind kind) noexcept {
  switch (kind) {
    case memory_kind::device: {
      std::free(p);
      const std::lock_guard lock(memory_mu_);
      device_used_ -= bytes;
      return;
    }
    case memory_kind::pinned: {
      const std::size_t footprint = pinned_footprint(bytes);
      {
        const std::lock_guard lock(memory_mu_);
        if (unlocked_.erase(p) != 0) {
          unlocked_bytes_ -= footprint;
          std::free(p);
          return;
        }
      }
      FERRY_ASSERT_NOTHROW(::munlock(p, footprint) == 0,
                           fmt::format("munlock of a pinned buffer of {} failed: {}", format_bytes(bytes),
                                       std::generic_category().message(errno)));
      std::free(p);
      const std::lock_guard lock(memory_mu_);
      locked_ -= footprint;
      return;
    }
    case memory_kind::pageable: std::free(p); return;
  }
}

std::uint64_t host_memory::device_used() const {
  const std::lock_guard lock(memory_mu_);
  return device_used_;
}

std::uint64_t host_memory::locked() const {
  const std::lock_guard lock(memory_mu_);
  return locked_;
}

std::uint64_t host_memory::pinned() const {
  const std::lock_guard lock(memory_mu_);
  return locked_ + unlocked_bytes_;
}

void* host_memory::alloc_device(std::size_t bytes) {
  {
    const std::lock_guard lock(memory_mu_);
    const std::uint64_t total = device_memory_bytes_;
    const std::uint64_t free_bytes = total - std::min(total, device_used_);
    if (bytes > free_bytes) {
      throw out_of_memory(
          fmt::format("device allocation of {} does not fit: the emulated device has {} free "
                      "of {} (host_device_options::device_memory_bytes)",
                      format_bytes(bytes), format_bytes(free_bytes), format_bytes(total)));
    }
    device_used_ += bytes;
  }
  void* p = aligned_alloc_or_null(device_alignment, bytes);
  if (p == nullptr) {
    const std::lock_guard lock(memory_mu_);
    device_used_ -= bytes;
    throw out_of_memory(
        fmt::format("device allocation of {} failed: the host backing the emulated device "
                    "is out of memory",
                    format_bytes(bytes)));
  }
  return p;
}

void* host_memory::alloc_pinned(std::size_t bytes) {
  if (bytes > std::numeric_limits<std::size_t>::max() - page_size()) {
    throw out_of_memory(fmt::format("pinned allocation of {} bytes is larger than any address space", bytes));
  }
  const std::size_t footprint = pinned_footprint(bytes);
  // Checking the limit, locking and counting happen under one lock: two threads that each fit alone
  // must not both pass the check.
  const std::lock_guard pin_lock(pin_mu_);
  const memlock_info limit = read_memlock();
  const std::uint64_t already = locked();
  const bool within_limit = fits_memlock(footprint, already, limit);
  if (require_locked_) check_memlock(footprint, already, limit);
  void* p = aligned_alloc_or_null(page_size(), footprint);
  if (p == nullptr) {
    throw out_of_memory(
        fmt::format("pinned allocation of {} failed: the host is out of memory", format_bytes(bytes)));
  }
  if (!within_limit) {
    return alloc_unlocked(p, footprint,
                          fmt::format("locking {} more than the {} it holds exceeds RLIMIT_MEMLOCK of {}",
                                      format_bytes(footprint), format_bytes(already), limit.describe()));
  }
  if (::mlock(p, footprint) != 0) {
    const int err = errno;
    // Other locked memory of the process (another device, a framework) counts against the same limit,
    // which is how this can fail after the check passed.
    if (!require_locked_) {
      return alloc_unlocked(
          p, footprint,
          fmt::format("mlock of {} failed: {}; RLIMIT_MEMLOCK is {}", format_bytes(footprint),
                      std::generic_category().message(err), limit.describe()));
    }
    std::free(p);
    throw out_of_memory(fmt::format(
        "pinning {} of host memory failed: mlock: {}; this device holds {} locked "
        "already and RLIMIT_MEMLOCK is {} (raise it with ulimit -l, or "
        "LimitMEMLOCK= for a service)",
        format_bytes(bytes), std::generic_category().message(err), format_bytes(already), limit.describe()));
  }
  const std::lock_guard lock(memory_mu_);
  locked_ += footprint;
  return p;
}

void* host_memory::alloc_unlocked(void* p, std::size_t footprint, const std::string& why) {
  try {
    const std::lock_guard lock(memory_mu_);
    unlocked_.insert(p);
    unlocked_bytes_ += footprint;
  } catch (...) {
    std::free(p);
    throw;
  }
  note_unlocked_once(why);
  return p;
}

void host_memory::register_host(void* p, std::size_t bytes) {
  const std::size_t footprint = pinned_footprint(bytes);
  const std::lock_guard pin_lock(pin_mu_);
  const memlock_info limit = read_memlock();
  const std::uint64_t already = locked();
  if (require_locked_) check_memlock(footprint, already, limit);
  std::string why;
  if (!fits_memlock(footprint, already, limit)) {
    why = fmt::format("locking {} more than the {} it holds exceeds RLIMIT_MEMLOCK of {}",
                      format_bytes(footprint), format_bytes(already), limit.describe());
  } else if (::mlock(p, footprint) != 0) {
    const int err = errno;
    if (require_locked_) {
      throw out_of_memory(fmt::format(
          "registering {} of host memory failed: mlock: {}; this device holds {} locked already and "
          "RLIMIT_MEMLOCK is {} (raise it with ulimit -l, or LimitMEMLOCK= for a service)",
          format_bytes(bytes), std::generic_category().message(err), format_bytes(already),
          limit.describe()));
    }
    why = fmt::format("mlock of {} failed: {}; RLIMIT_MEMLOCK is {}", format_bytes(footprint),
                      std::generic_category().message(err), limit.describe());
  }
  {
    const std::lock_guard lock(memory_mu_);
    const bool locked = why.empty();
    registered_.emplace(p, locked);
    (locked ? locked_ : unlocked_bytes_) += footprint;
  }
  if (!why.empty()) note_unlocked_once(why);
}

void host_memory::unregister_host(void* p, std::size_t bytes) noexcept {
  const std::size_t footprint = pinned_footprint(bytes);
  bool locked = false;
  {
    const std::lock_guard lock(memory_mu_);
    const auto it = registered_.find(p);
    FERRY_ASSERT_NOTHROW(it != registered_.end(), "unregister_host of memory that was not registered");
    if (it == registered_.end()) return;
    locked = it->second;
    registered_.erase(it);
    (locked ? locked_ : unlocked_bytes_) -= footprint;
  }
  if (locked) {
    FERRY_ASSERT_NOTHROW(::munlock(p, footprint) == 0,
                         fmt::format("munlock of registered memory of {} failed: {}", format_bytes(bytes),
                                     std::generic_category().message(errno)));
  }
}

}  // namespace ferry::host_backend
