#include "memory_check.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "ferry/core/error.hpp"
#include "ferry/core/host_memory.hpp"
#include "ferry/core/units.hpp"

namespace ferry::cli {
namespace {

bool has_any(const std::vector<std::string>& levels, std::initializer_list<std::string_view> names) {
  return std::any_of(levels.begin(), levels.end(), [&](const std::string& l) {
    return std::find(names.begin(), names.end(), l) != names.end();
  });
}

std::uint64_t times(std::uint64_t a, std::uint64_t b) {
  return b != 0 && a > UINT64_MAX / b ? UINT64_MAX : a * b;
}

std::uint64_t plus(std::uint64_t a, std::uint64_t b) { return a > UINT64_MAX - b ? UINT64_MAX : a + b; }

}  // namespace

void check_memory(const device& dev, const memory_need& need) {
  const device_info info = dev.info();
  if (info.memory_bytes > 0 && need.device_bytes > info.memory_bytes) {
    throw out_of_memory(fmt::format("{} needs {} of device memory; {} ({}) has {}", need.what,
                                    format_bytes(need.device_bytes), info.name, to_string(info.kind),
                                    format_bytes(info.memory_bytes)));
  }
  // The emulated device's memory is host memory too.
  const std::uint64_t host =
      dev.kind() == backend::host ? plus(need.host_bytes, need.device_bytes) : need.host_bytes;
  const std::uint64_t available = host_memory_available();
  if (available > 0 && host > available) {
    throw out_of_memory(fmt::format("{} needs {} of host memory{}; the host has {} available (MemAvailable)",
                                    need.what, format_bytes(host),
                                    dev.kind() == backend::host ? " (the emulated device's included)" : "",
                                    format_bytes(available)));
  }
  // RLIMIT_MEMLOCK is not checked here: the emulated device falls back to unlocked memory past it (with
  // a note), and the CUDA driver pins through its own path and names the limit when pinning fails.
}

void check_probe_memory(const device& dev, const probe::options& opts) {
  const std::uint64_t n = opts.copy_bytes;
  memory_need need;
  need.what = fmt::format("probe --bytes {} (2 pinned and 2 pageable host buffers, 2 device buffers)",
                          format_bytes(n));
  need.device_bytes = times(n, 2);
  need.host_bytes = times(n, 4);
  need.pinned_bytes = times(n, 2);
  check_memory(dev, need);
  if (opts.measure_pin_cost) {
    // Timed alone, before the copy buffers exist.
    check_memory(dev, {fmt::format("probe --pin-bytes {}", format_bytes(opts.pin_bytes)), 0, opts.pin_bytes,
                       opts.pin_bytes});
  }
}

void check_ingest_memory(const device& dev, const bench::ingest_options& cfg, bool pure_copy) {
  const std::uint64_t batch = cfg.batch_bytes();
  const bool pools = pure_copy || has_any(cfg.levels, {"L2", "L3", "L4", "ferry"});
  const bool ahead = pure_copy || has_any(cfg.levels, {"L3", "L4", "ferry"});
  memory_need need;
  need.what = fmt::format("ingest with batches of {}{}{}", format_bytes(batch),
                          pools ? fmt::format(", {} pinned batch slots", cfg.host_slots) : "",
                          ahead ? fmt::format(", {} device batches ahead", cfg.depth) : "");
  need.pinned_bytes = times(batch, pools ? cfg.host_slots : 1);
  need.host_bytes = need.pinned_bytes;
  need.device_bytes = times(batch, ahead ? cfg.depth : 1);
  check_memory(dev, need);
}

void check_egress_memory(const device& dev, const bench::egress_options& cfg, bool pure_copy) {
  const std::uint64_t output = cfg.output_bytes();
  const bool pools = !pure_copy && has_any(cfg.levels, {"L2", "L3", "L4"});
  const bool slots = pure_copy || has_any(cfg.levels, {"ferry"});
  memory_need need;
  need.what =
      fmt::format("egress with outputs of {}{}{}", format_bytes(output),
                  pools ? fmt::format(", {} pool buffers", cfg.pool_buffers) : "",
                  slots ? fmt::format(", {} slots of {}", cfg.slots, format_bytes(cfg.slot_bytes)) : "");
  need.pinned_bytes = slots ? times(cfg.slots, cfg.slot_bytes) : 0;
  need.host_bytes = std::max(need.pinned_bytes, times(output, pools ? cfg.pool_buffers : 1));
  need.device_bytes = pure_copy ? 0 : output;
  check_memory(dev, need);
}

}  // namespace ferry::cli
