// Sizes a command asks for, checked against the memory the device and the host have before anything is
// allocated: a request that cannot fit is refused in the first second with what it needs and what there
// is, instead of being killed by the kernel's OOM killer after minutes.
#pragma once

#include <cstdint>
#include <string>

#include "ferry/bench/egress_bench.hpp"
#include "ferry/bench/ingest_bench.hpp"
#include "ferry/device/device.hpp"
#include "ferry/probe/probe.hpp"

namespace ferry::cli {

/// What a run will allocate at least, at its peak: `what` says from which settings ("--bytes 16 GiB:
/// 2 pinned and 2 pageable copy buffers").
struct memory_need {
  std::string what;
  std::uint64_t device_bytes = 0;
  std::uint64_t host_bytes = 0;  // pinned and pageable together
  std::uint64_t pinned_bytes = 0;
};

/// Throws ferry::out_of_memory when `need` exceeds the device's memory or the host's available memory
/// (MemAvailable). The message names the settings, what they need and what there is. RLIMIT_MEMLOCK is
/// left to the device: the emulator falls back to unlocked memory past it, the CUDA backend names it
/// when pinning fails.
void check_memory(const device& dev, const memory_need& need);

/// probe: the pinning-cost buffer, then 2 pinned + 2 pageable host buffers and 2 device buffers.
void check_probe_memory(const device& dev, const probe::options& opts);
/// The ingest ladder (or pure copy / both ways): the pinned batch slots and the device batches.
void check_ingest_memory(const device& dev, const bench::ingest_options& cfg, bool pure_copy);
/// The egress ladder (or pure copy): ferry's pinned slots, the L2..L4 host pools and the device output.
void check_egress_memory(const device& dev, const bench::egress_options& cfg, bool pure_copy);

}  // namespace ferry::cli
