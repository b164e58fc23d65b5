// Field-by-field comparison of two timelines, names compared as text (string ids may differ). Shared by
// the trace I/O tests and the trace import fuzzer.
#pragma once

#include <fmt/format.h>

#include <cstddef>
#include <string>

#include "ferry/trace/timeline.hpp"

namespace ferry::test {

/// The first difference between `a` and `b`, or "" when they are equal.
inline std::string timeline_difference(const trace::timeline& a, const trace::timeline& b) {
  if (a.source != b.source) return fmt::format("source \"{}\" vs \"{}\"", a.source, b.source);
  if (a.device_name != b.device_name)
    return fmt::format("device_name \"{}\" vs \"{}\"", a.device_name, b.device_name);
  if (a.dropped != b.dropped) return fmt::format("dropped {} vs {}", a.dropped, b.dropped);
  if (a.link_h2d_gbps != b.link_h2d_gbps)
    return fmt::format("link_h2d_gbps {} vs {}", a.link_h2d_gbps, b.link_h2d_gbps);
  if (a.link_d2h_gbps != b.link_d2h_gbps)
    return fmt::format("link_d2h_gbps {} vs {}", a.link_d2h_gbps, b.link_d2h_gbps);
  if (a.thread_names != b.thread_names) return "thread_names differ";
  if (a.stream_names != b.stream_names) return "stream_names differ";
  if (a.metadata != b.metadata) return "metadata differs";
  if (a.events.size() != b.events.size())
    return fmt::format("{} vs {} events", a.events.size(), b.events.size());
  for (std::size_t i = 0; i < a.events.size(); ++i) {
    const trace::event& x = a.events[i];
    const trace::event& y = b.events[i];
    auto diff = [&](const char* field, const auto& u, const auto& v) {
      return fmt::format("event {} ({}): {} {} vs {}", i, a.name_of(x), field, u, v);
    };
    if (x.kind != y.kind) return diff("kind", trace::to_string(x.kind), trace::to_string(y.kind));
    if (x.start_ns != y.start_ns) return diff("start_ns", x.start_ns, y.start_ns);
    if (x.end_ns != y.end_ns) return diff("end_ns", x.end_ns, y.end_ns);
    if (a.name_of(x) != b.name_of(y)) return diff("name", a.name_of(x), b.name_of(y));
    if (a.domain_of(x) != b.domain_of(y)) return diff("domain", a.domain_of(x), b.domain_of(y));
    if (x.device != y.device) return diff("device", x.device, y.device);
    if (x.stream != y.stream) return diff("stream", x.stream, y.stream);
    if (x.thread != y.thread) return diff("thread", x.thread, y.thread);
    if (x.correlation != y.correlation) return diff("correlation", x.correlation, y.correlation);
    if (x.bytes != y.bytes) return diff("bytes", x.bytes, y.bytes);
    if (x.copy != y.copy) return diff("copy", trace::to_string(x.copy), trace::to_string(y.copy));
    if (x.src != y.src) return diff("src", trace::to_string(x.src), trace::to_string(y.src));
    if (x.dst != y.dst) return diff("dst", trace::to_string(x.dst), trace::to_string(y.dst));
    if (x.sync != y.sync) return diff("sync", trace::to_string(x.sync), trace::to_string(y.sync));
    if (x.async != y.async) return diff("async", x.async, y.async);
  }
  return "";
}

}  // namespace ferry::test
