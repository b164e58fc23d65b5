// The host backend's memory accounting (private to src/device/host).
//
// Device memory is host memory tagged as device and capped at device_memory_bytes. Pinned memory is
// mlock()ed where RLIMIT_MEMLOCK allows; past it the emulator, which needs no locked memory, falls back to
// unlocked pages with a one-line note on stderr (once per process), or, with require_locked, refuses as
// real pinning would. Pageable memory is page-aligned host memory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>

#include "ferry/device/device.hpp"

namespace ferry::host_backend {

/// Allocates and frees the three kinds of memory of an emulated device, and counts what is held.
/// Thread-safe.
class host_memory {
 public:
  /// Device memory is capped at `device_memory_bytes`. `require_locked`: pinned memory that cannot be
  /// locked is out_of_memory instead of unlocked memory.
  host_memory(std::uint64_t device_memory_bytes, bool require_locked) noexcept
      : device_memory_bytes_(device_memory_bytes), require_locked_(require_locked) {}
  host_memory(const host_memory&) = delete;
  host_memory& operator=(const host_memory&) = delete;

  /// `bytes` (> 0) of memory of `kind`. Throws out_of_memory naming the size and the limit it meets
  /// (the emulated device's free memory, RLIMIT_MEMLOCK when locking is required, or the host's memory).
  [[nodiscard]] void* alloc(std::size_t bytes, memory_kind kind);
  /// Frees what alloc returned for the same `bytes` and `kind`.
  void free(void* p, std::size_t bytes, memory_kind kind) noexcept;

  /// Locks the caller's memory [p, p + bytes) (whole pages) as a pinned buffer would be, or, past
  /// RLIMIT_MEMLOCK and unless locking is required, notes that it stays unlocked. Throws out_of_memory as
  /// alloc does for pinned memory.
  void register_host(void* p, std::size_t bytes);
  /// Undoes register_host for the same p and bytes (the memory stays the caller's).
  void unregister_host(void* p, std::size_t bytes) noexcept;
  /// Bytes of emulated device memory held.
  [[nodiscard]] std::uint64_t device_used() const;
  /// Bytes this device holds mlock()ed (whole pages of its pinned buffers).
  [[nodiscard]] std::uint64_t locked() const;
  /// Bytes of pinned buffers this device holds, locked or not (whole pages).
  [[nodiscard]] std::uint64_t pinned() const;

 private:
  void* alloc_device(std::size_t bytes);
  void* alloc_pinned(std::size_t bytes);
  // Unlocked pages standing in for pinned ones that could not be locked (`why`).
  void* alloc_unlocked(void* p, std::size_t footprint, const std::string& why);

  const std::uint64_t device_memory_bytes_;
  const bool require_locked_;
  std::mutex pin_mu_;                           // serializes pinning: limit check, mlock and count
  mutable std::mutex memory_mu_;                // guards the counters and the set below
  std::uint64_t device_used_ = 0;               // bytes of emulated device memory allocated
  std::uint64_t locked_ = 0;                    // bytes this device has mlock()ed
  std::uint64_t unlocked_bytes_ = 0;            // bytes of pinned buffers that are not locked
  std::unordered_set<void*> unlocked_;          // those buffers, which free must not munlock
  std::unordered_map<void*, bool> registered_;  // caller memory registered: whether it was locked
};

}  // namespace ferry::host_backend
