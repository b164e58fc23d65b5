#include "ferry/probe/probe.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>

#include "ferry/core/clock.hpp"
#include "ferry/core/error.hpp"
#include "ferry/core/pattern.hpp"
#include "ferry/core/stats.hpp"
#include "ferry/core/units.hpp"
#include "ferry/trace/range.hpp"

namespace ferry::probe {
namespace {

using clock_type = steady_clock;

// Every link checks its bytes against ferry's verification pattern (ferry/core/pattern.hpp), which
// catches lost, shifted and partial copies.
void expect_pattern(const std::byte* p, std::size_t n, std::uint64_t seed, const std::string& link) {
  if (const auto bad = find_pattern_mismatch({p, n}, seed)) {
    throw logic_error(
        fmt::format("probe check failed on {}: byte {} of {} differs from what was sent", link, *bad, n));
  }
}

struct timed {
  double median = 0, min = 0, max = 0;
};

// Holds a stream at a host function until opened (or destroyed), so that the timed work queued behind it
// runs back to back: the events then time the copies, not the moments in which a busy host was slow to
// queue the next one (nvbench's blocking kernel does the same). Never put in front of a copy from or to
// pageable memory: that copy returns only once done, so it would wait for the gate forever.
class stream_gate {
 public:
  stream_gate(device& dev, stream_view s) : state_(std::make_shared<state>()) {
    dev.launch_host_func(s, [st = state_] {
      std::unique_lock lock(st->mu);
      st->cv.wait(lock, [&] { return st->open; });
    });
  }
  stream_gate(const stream_gate&) = delete;
  stream_gate& operator=(const stream_gate&) = delete;
  ~stream_gate() { open(); }

  void open() noexcept {
    {
      const std::lock_guard lock(state_->mu);
      state_->open = true;
    }
    state_->cv.notify_all();
  }

 private:
  struct state {
    std::mutex mu;
    std::condition_variable cv;
    bool open = false;
  };
  std::shared_ptr<state> state_;  // shared with the host function, which may run after the gate is gone
};

// Times `iterations` copies with events around each one on stream `s`, after `warmup` untimed ones. Copies
// between pinned and device memory are queued behind a stream_gate, so they run back to back.
timed time_copies(device& dev, stream_view s, mem_view dst, mem_view src, std::size_t bytes, int warmup,
                  int iterations) {
  for (int i = 0; i < warmup; ++i) dev.copy_async(dst, src, bytes, s);
  s.synchronize();
  std::vector<event> starts, stops;
  for (int i = 0; i < iterations; ++i) {
    starts.push_back(dev.make_timing_event());
    stops.push_back(dev.make_timing_event());
  }
  {
    std::optional<stream_gate> gate;
    if (src.kind != memory_kind::pageable && dst.kind != memory_kind::pageable) gate.emplace(dev, s);
    for (int i = 0; i < iterations; ++i) {
      starts[i].record(s);
      dev.copy_async(dst, src, bytes, s);
      stops[i].record(s);
    }
  }  // the gate opens here, also when a call above threw
  s.synchronize();
  std::vector<double> gbps;
  for (int i = 0; i < iterations; ++i) {
    const double ms = dev.elapsed_ms(starts[i], stops[i]);
    gbps.push_back(gb_per_s(bytes, ms * 1e-3));
  }
  const auto [lo, hi] = std::minmax_element(gbps.begin(), gbps.end());
  return {median(gbps), *lo, *hi};
}

}  // namespace

options default_options(backend b) {
  options o;
  if (b == backend::host) {
    o.copy_bytes = 32 * MiB;
    o.iterations = 5;
    o.warmup = 1;
    o.pin_bytes = 4 * MiB;
    // The host backend locks its pinned pages with mlock, so its buffers (two copy buffers and the
    // pinning-cost one) must fit within RLIMIT_MEMLOCK where the kernel enforces it.
    const memlock_info ml = read_memlock();
    if (ml.enforced()) {
      const std::size_t quarter = static_cast<std::size_t>(ml.soft_bytes / 4);
      o.copy_bytes = std::max<std::size_t>(std::min(o.copy_bytes, quarter), 4096);
      o.pin_bytes = std::max<std::size_t>(std::min(o.pin_bytes, quarter), 4096);
    }
  }
  return o;
}

double pin_cost_result::seconds_per_gib() const noexcept {
  return bytes == 0 ? 0.0
                    : (alloc_seconds + free_seconds) * static_cast<double>(GiB) / static_cast<double>(bytes);
}

const link_result* result::find(const std::string& name) const noexcept {
  for (const auto& l : links)
    if (l.name == name) return &l;
  return nullptr;
}

result run(device& dev, const options& opts, progress_fn progress) {
  FERRY_EXPECTS(opts.copy_bytes > 0, "probe copy size is 0; give a size of at least 1 byte");
  FERRY_EXPECTS(opts.iterations >= 1,
                fmt::format("probe iterations is {}; at least 1 timed copy is needed", opts.iterations));
  FERRY_EXPECTS(opts.warmup >= 0, fmt::format("probe warmup is {}; it cannot be negative", opts.warmup));
  FERRY_RANGE("ferry.probe", trace::color::gray);
  auto say = [&](const std::string& line) {
    if (progress) progress(line);
  };

  result r;
  r.device = dev.info();
  r.memlock = read_memlock();
  r.used = opts;
  const std::size_t n = opts.copy_bytes;

  // Pinning cost first, before the copy buffers, so it is measured on a fresh heap.
  if (opts.measure_pin_cost) {
    say(fmt::format("pinning {} of host memory", format_bytes(opts.pin_bytes)));
    const auto t0 = clock_type::now();
    buffer pinned = dev.alloc_pinned(opts.pin_bytes);
    r.pin_cost.alloc_seconds = seconds_since(t0);
    const auto t1 = clock_type::now();
    pinned = buffer{};
    r.pin_cost.free_seconds = seconds_since(t1);
    r.pin_cost.bytes = opts.pin_bytes;
  }

  buffer pinned_src = dev.alloc_pinned(n);
  buffer pinned_dst = dev.alloc_pinned(n);
  buffer pageable_src = dev.alloc_pageable(n);
  buffer pageable_dst = dev.alloc_pageable(n);
  buffer dev_a = dev.alloc_device(n);
  buffer dev_b = dev.alloc_device(n);
  stream s = dev.make_stream();

  fill_pattern({pinned_src.host_bytes(), n}, 7);
  fill_pattern({pageable_src.host_bytes(), n}, 7);

  auto measure = [&](const std::string& name, mem_view dst, mem_view src, memory_kind host_kind) {
    say(fmt::format("{}: {} x {}", name, opts.iterations, format_bytes(n)));
    link_result l;
    l.name = name;
    l.direction = direction_of(src.kind, dst.kind);
    l.host_memory = host_kind;
    l.bytes = n;
    l.iterations = opts.iterations;
    const timed t = time_copies(dev, s, dst, src, n, opts.warmup, opts.iterations);
    l.median_gbps = t.median;
    l.min_gbps = t.min;
    l.max_gbps = t.max;
    return l;
  };

  // Each host-to-device measurement is checked by a round trip through a poisoned pinned buffer.
  auto check_device = [&](link_result& l, mem_view device_mem) {
    if (!opts.check) return;
    std::memset(pinned_dst.host_bytes(), 0xA5, n);
    dev.copy(pinned_dst, device_mem, s);
    expect_pattern(pinned_dst.host_bytes(), n, 7, l.name);
    l.checked = true;
  };
  auto check_host = [&](link_result& l, const buffer& host) {
    if (!opts.check) return;
    expect_pattern(host.host_bytes(), n, 7, l.name);
    l.checked = true;
  };

  dev.memset_async(dev_a, 0x5A, s);
  r.links.push_back(measure("pinned H2D", dev_a, pinned_src, memory_kind::pinned));
  check_device(r.links.back(), dev_a);

  std::memset(pinned_dst.host_bytes(), 0xA5, n);
  r.links.push_back(measure("pinned D2H", pinned_dst, dev_a, memory_kind::pinned));
  check_host(r.links.back(), pinned_dst);

  dev.memset_async(dev_b, 0x5A, s);
  r.links.push_back(measure("pageable H2D", dev_b, pageable_src, memory_kind::pageable));
  check_device(r.links.back(), dev_b);

  std::memset(pageable_dst.host_bytes(), 0xA5, n);
  r.links.push_back(measure("pageable D2H", pageable_dst, dev_b, memory_kind::pageable));
  check_host(r.links.back(), pageable_dst);

  dev.memset_async(dev_b, 0x5A, s);
  r.links.push_back(measure("D2D", dev_b, dev_a, memory_kind::device));
  check_device(r.links.back(), dev_b);

  // Both directions at once, each on its own stream, released together by one gate; the window is timed
  // with events, from the start of both to the end of the later one.
  {
    say(fmt::format("both directions: {} x {} each way", opts.iterations, format_bytes(n)));
    stream up = dev.make_stream();
    stream down = dev.make_stream();
    for (int i = 0; i < opts.warmup; ++i) {
      dev.copy_async(dev_b, pinned_src, n, up);
      dev.copy_async(pinned_dst, dev_a, n, down);
    }
    dev.synchronize();
    event up_start = dev.make_timing_event(), up_stop = dev.make_timing_event();
    event down_start = dev.make_timing_event(), down_stop = dev.make_timing_event();
    event go = dev.make_event();
    {
      const stream_gate gate(dev, up);
      go.record(up);
      down.wait(go);
      up_start.record(up);
      down_start.record(down);
      for (int i = 0; i < opts.iterations; ++i) {
        dev.copy_async(dev_b, pinned_src, n, up);
        dev.copy_async(pinned_dst, dev_a, n, down);
      }
      up_stop.record(up);
      down_stop.record(down);
    }  // the gate opens here
    up.synchronize();
    down.synchronize();
    const std::uint64_t each_way =
        static_cast<std::uint64_t>(n) * static_cast<std::uint64_t>(opts.iterations);
    const double up_s = dev.elapsed_ms(up_start, up_stop) * 1e-3;
    const double down_s = dev.elapsed_ms(down_start, down_stop) * 1e-3;
    // down_start follows up_start (down waits for `go`, recorded on up just before it).
    const double window_s = std::max(up_s, dev.elapsed_ms(up_start, down_stop) * 1e-3);
    r.duplex.bytes_each_way = n;
    r.duplex.iterations = opts.iterations;
    r.duplex.total_gbps = gb_per_s(2 * each_way, window_s);
    r.duplex.h2d_gbps = gb_per_s(each_way, up_s);
    r.duplex.d2h_gbps = gb_per_s(each_way, down_s);
    if (opts.check) {
      expect_pattern(pinned_dst.host_bytes(), n, 7, "both directions (D2H)");
      std::memset(pinned_dst.host_bytes(), 0xA5, n);
      dev.copy(pinned_dst, dev_b, s);
      expect_pattern(pinned_dst.host_bytes(), n, 7, "both directions (H2D)");
    }
  }
  return r;
}

link_result measure_link(device& dev, copy_direction dir, memory_kind host_memory, std::size_t bytes,
                         int warmup, int iterations) {
  FERRY_EXPECTS(bytes > 0, "link measurement of 0 bytes; give a size of at least 1 byte");
  FERRY_EXPECTS(iterations >= 1,
                fmt::format("link measurement of {} iterations; at least 1 is needed", iterations));
  FERRY_EXPECTS(dir == copy_direction::host_to_device || dir == copy_direction::device_to_host,
                fmt::format("measure_link measures host-device links, not {}", to_string(dir)));
  FERRY_EXPECTS(host_memory != memory_kind::device, "measure_link: the host side must be pinned or pageable");
  buffer host = host_memory == memory_kind::pinned ? dev.alloc_pinned(bytes) : dev.alloc_pageable(bytes);
  buffer device_mem = dev.alloc_device(bytes);
  stream s = dev.make_stream();
  const bool up = dir == copy_direction::host_to_device;
  link_result l;
  l.name = fmt::format("{} {}", to_string(host_memory), up ? "H2D" : "D2H");
  l.direction = dir;
  l.host_memory = host_memory;
  l.bytes = bytes;
  l.iterations = iterations;
  if (up) {
    fill_pattern({host.host_bytes(), bytes}, 11);
  } else {
    dev.fill_pattern_async(device_mem, 11, s);
    std::memset(host.host_bytes(), 0xA5, bytes);
  }
  const timed t = up ? time_copies(dev, s, device_mem, host, bytes, warmup, iterations)
                     : time_copies(dev, s, host, device_mem, bytes, warmup, iterations);
  l.median_gbps = t.median;
  l.min_gbps = t.min;
  l.max_gbps = t.max;
  if (up) dev.copy(host, device_mem, s);  // round trip: what arrived on the device comes back to be checked
  expect_pattern(host.host_bytes(), bytes, 11, l.name);
  l.checked = true;
  return l;
}

double pinned_ceiling(device& dev, copy_direction dir, std::uint64_t bytes, double given,
                      progress_fn progress) {
  if (given > 0) return given;
  const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(bytes, 256 * MiB));
  const bool up = dir == copy_direction::host_to_device;
  if (progress)
    progress(fmt::format("probing pinned {} with {} copies", up ? "H2D" : "D2H", format_bytes(n)));
  return measure_link(dev, dir, memory_kind::pinned, n, 2, 5).median_gbps;
}

std::string format_table(const result& r) {
  std::string out;
  out += fmt::format("device   {} ({} backend{}{}), {} of memory, {} copy engine(s)\n", r.device.name,
                     to_string(r.device.kind), r.device.pci_bus_id.empty() ? "" : ", PCI ",
                     r.device.pci_bus_id, format_bytes(r.device.memory_bytes), r.device.copy_engines);
  out += fmt::format("memlock  RLIMIT_MEMLOCK {}\n\n", r.memlock.describe());
  out += fmt::format("{:<16} {:>10} {:>6} {:>10} {:>10} {:>10} {:>7}\n", "link", "size", "iters", "GB/s med",
                     "GB/s min", "GB/s max", "check");
  for (const auto& l : r.links) {
    out += fmt::format("{:<16} {:>10} {:>6} {:>10.2f} {:>10.2f} {:>10.2f} {:>7}\n", l.name,
                       format_bytes(l.bytes), l.iterations, l.median_gbps, l.min_gbps, l.max_gbps,
                       l.checked ? "ok" : "-");
  }
  out += fmt::format("{:<16} {:>10} {:>6} {:>10.2f}   (H2D {:.2f} + D2H {:.2f} GB/s during the window)\n",
                     "both ways", format_bytes(r.duplex.bytes_each_way), r.duplex.iterations,
                     r.duplex.total_gbps, r.duplex.h2d_gbps, r.duplex.d2h_gbps);
  if (r.pin_cost.bytes > 0) {
    out += fmt::format("\npinning  {} took {:.1f} ms to allocate, {:.1f} ms to free: {:.0f} ms per GiB\n",
                       format_bytes(r.pin_cost.bytes), r.pin_cost.alloc_seconds * 1e3,
                       r.pin_cost.free_seconds * 1e3, r.pin_cost.seconds_per_gib() * 1e3);
  }
  return out;
}

std::string to_json(const result& r, int indent) {
  using nlohmann::json;
  json j;
  j["device"] = json::parse(to_json(r.device));
  j["memlock"] = {{"soft_bytes", r.memlock.unlimited ? json(nullptr) : json(r.memlock.soft_bytes)},
                  {"hard_bytes", r.memlock.hard_bytes},
                  {"unlimited", r.memlock.unlimited},
                  {"cap_ipc_lock", r.memlock.cap_ipc_lock},
                  {"enforced", r.memlock.enforced()}};
  j["options"] = {{"copy_bytes", r.used.copy_bytes},
                  {"warmup", r.used.warmup},
                  {"iterations", r.used.iterations},
                  {"pin_bytes", r.used.pin_bytes},
                  {"check", r.used.check}};
  auto& links = j["links"] = json::array();
  for (const auto& l : r.links) {
    links.push_back({{"name", l.name},
                     {"direction", std::string(to_string(l.direction))},
                     {"host_memory", std::string(to_string(l.host_memory))},
                     {"bytes", l.bytes},
                     {"iterations", l.iterations},
                     {"median_gbps", l.median_gbps},
                     {"min_gbps", l.min_gbps},
                     {"max_gbps", l.max_gbps},
                     {"checked", l.checked}});
  }
  j["both_directions"] = {{"bytes_each_way", r.duplex.bytes_each_way},
                          {"iterations", r.duplex.iterations},
                          {"total_gbps", r.duplex.total_gbps},
                          {"h2d_gbps", r.duplex.h2d_gbps},
                          {"d2h_gbps", r.duplex.d2h_gbps}};
  // Null rather than absent when not measured, so every probe result has the same keys.
  j["pin_cost"] = r.pin_cost.bytes == 0 ? json(nullptr)
                                        : json{{"bytes", r.pin_cost.bytes},
                                               {"alloc_seconds", r.pin_cost.alloc_seconds},
                                               {"free_seconds", r.pin_cost.free_seconds},
                                               {"seconds_per_gib", r.pin_cost.seconds_per_gib()}};
  return j.dump(indent);
}

}  // namespace ferry::probe
