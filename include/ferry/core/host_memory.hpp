// How much memory the host can still give: the bound on sizes a command asks for before it allocates.
#pragma once

#include <cstdint>

namespace ferry {

/// Bytes of memory the host can still give without swapping: MemAvailable of /proc/meminfo, else the
/// free physical pages sysconf reports. 0 when neither is known.
[[nodiscard]] std::uint64_t host_memory_available() noexcept;

/// Bytes of physical memory of the host (sysconf), 0 when unknown.
[[nodiscard]] std::uint64_t host_memory_total() noexcept;

}  // namespace ferry
