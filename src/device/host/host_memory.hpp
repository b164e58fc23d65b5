// The host backend's memory accounting (private to src/device/host).
//
// Device memory is host memory tagged as device and capped at device_memory_bytes. Pinned memory is
// mlock()ed, so the emulator runs into RLIMIT_MEMLOCK where real pinning would. Pageable memory is
// page-aligned host memory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>

#include "ferry/device/device.hpp"

namespace ferry::host_backend {

/// Allocates and frees the three kinds of memory of an emulated device, and counts what is held.
/// Thread-safe.
class host_memory {
 public:
  /// Device memory is capped at `device_memory_bytes`.
  explicit host_memory(std::uint64_t device_memory_bytes) noexcept
      : device_memory_bytes_(device_memory_bytes) {}
  host_memory(const host_memory&) = delete;
  host_memory& operator=(const host_memory&) = delete;

  /// `bytes` (> 0) of memory of `kind`. Throws out_of_memory naming the size and the limit it meets
  /// (the emulated device's free memory, RLIMIT_MEMLOCK, or the host's memory).
  [[nodiscard]] void* alloc(std::size_t bytes, memory_kind kind);
  /// Frees what alloc returned for the same `bytes` and `kind`.
  void free(void* p, std::size_t bytes, memory_kind kind) noexcept;

  /// Bytes of emulated device memory held.
  [[nodiscard]] std::uint64_t device_used() const;
  /// Bytes this device holds mlock()ed (whole pages of its pinned buffers).
  [[nodiscard]] std::uint64_t locked() const;

 private:
  void* alloc_device(std::size_t bytes);
  void* alloc_pinned(std::size_t bytes);

  const std::uint64_t device_memory_bytes_;
  std::mutex pin_mu_;              // serializes pinning: limit check, mlock and count
  mutable std::mutex memory_mu_;   // guards the two counters below
  std::uint64_t device_used_ = 0;  // bytes of emulated device memory allocated
  std::uint64_t locked_ = 0;       // bytes this device has mlock()ed
};

}  // namespace ferry::host_backend
