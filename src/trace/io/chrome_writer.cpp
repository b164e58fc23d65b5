// The Chrome trace writer: one track per GPU stream (process "GPU <device>") and per CPU thread (process
// "CPU"), or for a multi-process recording a group per process and per (device, process); colours and display
// names for the viewers, and ferry's own fields in each event's "args" so that the reader (sax_reader.cpp,
// import_ferry.cpp) restores the timeline exactly.
#include "ferry/trace/trace_io.hpp"

#include <fmt/format.h>

#include <cerrno>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>

#include "chrome_format.hpp"
#include "ferry/core/atomic_file.hpp"

namespace ferry::trace {

namespace {

using detail::format_version;

constexpr std::int64_t cpu_pid = 1;
constexpr std::int64_t gpu_pid_base = 1000;

// Appends `s` as a JSON string. Invalid UTF-8 becomes U+FFFD so the output is always valid JSON.
void append_json_string(std::string& out, std::string_view s) {
  out += '"';
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const std::size_t n = s.size();
  std::size_t i = 0;
  while (i < n) {
    const unsigned char c = p[i];
    if (c < 0x80) {
      switch (c) {
        case '"': out += "\\\""; break;
        case '\\': out += "\\\\"; break;
        case '\n': out += "\\n"; break;
        case '\r': out += "\\r"; break;
        case '\t': out += "\\t"; break;
        case '\b': out += "\\b"; break;
        case '\f': out += "\\f"; break;
        default:
          if (c < 0x20)
            out += fmt::format("\\u{:04x}", c);
          else
            out += static_cast<char>(c);
      }
      ++i;
      continue;
    }
    // A multi-byte sequence: copy it when well-formed (no overlongs, no surrogates, <= U+10FFFF).
    std::size_t len = 0;
    std::uint32_t cp = 0;
    if (c >= 0xC2 && c <= 0xDF)
      len = 2, cp = c & 0x1Fu;
    else if (c >= 0xE0 && c <= 0xEF)
      len = 3, cp = c & 0x0Fu;
    else if (c >= 0xF0 && c <= 0xF4)
      len = 4, cp = c & 0x07u;
    bool ok = len != 0 && i + len <= n;
    for (std::size_t k = 1; ok && k < len; ++k) {
      if ((p[i + k] & 0xC0u) != 0x80u) ok = false;
      cp = (cp << 6) | (p[i + k] & 0x3Fu);
    }
    if (ok && len == 3 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) ok = false;
    if (ok && len == 4 && (cp < 0x10000 || cp > 0x10FFFF)) ok = false;
    if (ok) {
      out.append(s.data() + i, len);
      i += len;
    } else {
      out += "\\ufffd";
      ++i;
    }
  }
  out += '"';
}

// Nanoseconds as microseconds with exactly three decimals: exact, whatever the magnitude.
void append_us(std::string& out, std::int64_t ns) {
  const bool negative = ns < 0;
  // Through unsigned so that INT64_MIN has a magnitude.
  const std::uint64_t mag =
      negative ? std::uint64_t{0} - static_cast<std::uint64_t>(ns) : static_cast<std::uint64_t>(ns);
  fmt::format_to(std::back_inserter(out), "{}{}.{:03}", negative ? "-" : "", mag / 1000, mag % 1000);
}

// Shortest text that reads back as the same double; JSON has no NaN or infinity.
void append_double(std::string& out, double v) {
  if (!std::isfinite(v)) v = 0;
  fmt::format_to(std::back_inserter(out), "{}", v);
}

std::string_view copy_word(copy_kind k) {
  switch (k) {
    case copy_kind::h2d: return "HtoD";
    case copy_kind::d2h: return "DtoH";
    case copy_kind::d2d: return "DtoD";
    case copy_kind::h2h: return "HtoH";
    case copy_kind::p2p: return "PtoP";
    case copy_kind::none: break;
  }
  return "";
}

std::string_view mem_word(mem_kind k) {
  switch (k) {
    case mem_kind::pageable: return "Pageable";
    case mem_kind::pinned: return "Pinned";
    case mem_kind::device: return "Device";
    case mem_kind::managed: return "Managed";
    case mem_kind::unknown: break;
  }
  return "Unknown";
}

// The name a viewer shows for an event that has none of its own (copies are usually unnamed).
std::string display_name(const event& e) {
  switch (e.kind) {
    case activity::memcpy:
      if (e.copy == copy_kind::none) return "Memcpy";
      return fmt::format("Memcpy {} ({} -> {})", copy_word(e.copy), mem_word(e.src), mem_word(e.dst));
    case activity::memset: return fmt::format("Memset ({})", mem_word(e.dst));
    case activity::sync: return fmt::format("Sync ({})", to_string(e.sync));
    default: return std::string(to_string(e.kind));
  }
}

// Colours from the Chrome trace viewer's reserved colour names (trace-viewer's color_scheme), so kernels,
// each copy direction and CPU waits stand apart in chrome://tracing (Perfetto colours by name instead).
std::string_view colour(const event& e) {
  switch (e.kind) {
    case activity::kernel: return "thread_state_running";  // green
    case activity::memcpy:
      switch (e.copy) {
        case copy_kind::h2d: return "rail_response";               // blue
        case copy_kind::d2h: return "rail_animation";              // red
        case copy_kind::d2d: return "heap_dump_child_node_arrow";  // tawny
        case copy_kind::p2p: return "cq_build_failed";             // pink
        case copy_kind::h2h: return "rail_idle";                   // orange-yellow
        case copy_kind::none: break;
      }
      return "generic_work";
    case activity::memset: return "generic_work";        // grey
    case activity::sync: return "bad";                   // orange: the CPU is blocked
    case activity::api: return "thread_state_sleeping";  // pale
    case activity::range: return "yellow";
    case activity::stage: return "olive";
  }
  return "generic_work";
}

// A multi-process recording (timeline::processes) gets a track group per process, its threads under its
// pid, and a GPU group per (device, process) under a pid above every real one.
constexpr std::int64_t gpu_group_base = 1'000'000'000;

std::int64_t process_of_thread(const timeline& t, std::uint64_t thread) {
  const auto it = t.thread_processes.find(thread);
  return it != t.thread_processes.end() ? static_cast<std::int64_t>(it->second) : cpu_pid;
}

std::int64_t process_of_stream(const timeline& t, std::uint64_t stream) {
  const auto it = t.stream_processes.find(stream);
  return it != t.stream_processes.end() ? static_cast<std::int64_t>(it->second) : 0;
}

// The Chrome pid and tid of an event's track.
std::pair<std::int64_t, std::uint64_t> track_of(const timeline& t, const event& e) {
  if (t.processes.empty())
    return {e.on_gpu() ? gpu_pid_base + e.device : cpu_pid, e.on_gpu() ? e.stream : e.thread};
  if (e.on_gpu())
    return {gpu_group_base * (e.device + 1) + process_of_stream(t, e.stream), e.stream & 0xffffffffu};
  return {process_of_thread(t, e.thread), e.thread};
}

void append_process_tracks(std::string& out, const timeline& t, bool& first) {
  std::map<std::int64_t, std::set<std::uint64_t>> threads;  // pid -> threads
  std::map<std::pair<std::int32_t, std::int64_t>, std::set<std::uint64_t>>
      streams;  // (device, pid) -> streams
  for (const event& e : t.events) {
    if (e.on_gpu())
      streams[{e.device, process_of_stream(t, e.stream)}].insert(e.stream);
    else
      threads[process_of_thread(t, e.thread)].insert(e.thread);
  }
  for (const auto& [key, p] : t.processes) threads.try_emplace(static_cast<std::int64_t>(key));
  auto meta = [&](std::string_view what, std::int64_t pid, std::uint64_t tid, std::string_view key,
                  const std::string& value, bool number) {
    if (!first) out += ",\n";
    first = false;
    fmt::format_to(std::back_inserter(out), R"({{"ph":"M","name":"{}","pid":{},"tid":{},"args":{{"{}":)",
                   what, pid, tid, key);
    if (number)
      out += value;
    else
      append_json_string(out, value);
    out += "}}";
  };
  auto process_label = [&](std::int64_t pid) {
    const auto it = t.processes.find(static_cast<std::uint64_t>(pid));
    if (it == t.processes.end()) return std::string("CPU");
    return fmt::format("{} [{}]", it->second.name, it->second.pid);
  };
  for (const auto& [pid, tids] : threads) {
    meta("process_name", pid, 0, "name", process_label(pid), false);
    meta("process_sort_index", pid, 0, "sort_index", std::to_string(pid * 10), true);
    const auto it = t.processes.find(static_cast<std::uint64_t>(pid));
    if (it != t.processes.end() && !it->second.command.empty())
      meta("process_labels", pid, 0, "labels", it->second.command, false);
    for (const std::uint64_t tid : tids) {
      const auto n = t.thread_names.find(tid);
      std::string name = n != t.thread_names.end() ? n->second : fmt::format("thread {}", tid);
      if (it != t.processes.end() && tid == static_cast<std::uint64_t>(pid)) name += " (main)";
      meta("thread_name", pid, tid, "name", name, false);
    }
  }
  for (const auto& [where, ids] : streams) {
    const auto [device, process] = where;
    const std::int64_t pid = gpu_group_base * (device + 1) + process;
    std::string label = fmt::format("GPU {}", device);
    if (!t.device_name.empty()) label += " " + t.device_name;
    label += " (" + process_label(process) + ")";
    meta("process_name", pid, 0, "name", label, false);
    meta("process_sort_index", pid, 0, "sort_index", std::to_string(process * 10 + 1 + device), true);
    for (const std::uint64_t stream : ids) {
      const auto n = t.stream_names.find(stream);
      const std::string name =
          n != t.stream_names.end() ? n->second : fmt::format("stream {}", stream & 0xffffffffu);
      meta("thread_name", pid, stream & 0xffffffffu, "name", name, false);
    }
  }
}

// Per-process CPU use (the launcher's /proc samples) as counters, and launch-to-GPU flows.
void append_counters_and_flows(std::string& out, const timeline& t) {
  for (const cpu_sample& s : t.cpu_samples) {
    fmt::format_to(std::back_inserter(out), R"j(,
{{"ph":"C","name":"CPU use (cores)","pid":{},"ts":)j",
                   s.process);
    append_us(out, s.t_ns);
    out += R"(,"args":{"cores":)";
    append_double(out, static_cast<double>(s.cores));
    fmt::format_to(std::back_inserter(out), R"(,"running threads":{}}}}})", s.running);
  }
  std::map<std::uint64_t, const event*> launches;
  for (const event& e : t.events)
    if (e.kind == activity::api && e.correlation != 0) launches.emplace(e.correlation, &e);
  for (const event& g : t.events) {
    if (!g.on_gpu() || g.correlation == 0) continue;
    const auto it = launches.find(g.correlation);
    if (it == launches.end()) continue;
    const event& a = *it->second;
    const auto [apid, atid] = track_of(t, a);
    const auto [gpid, gtid] = track_of(t, g);
    fmt::format_to(std::back_inserter(out), R"(,
{{"ph":"s","id":{},"name":"launch","cat":"flow","pid":{},"tid":{},"ts":)",
                   g.correlation, apid, atid);
    append_us(out, a.start_ns);
    fmt::format_to(std::back_inserter(out), R"(}},
{{"ph":"f","bp":"e","id":{},"name":"launch","cat":"flow","pid":{},"tid":{},"ts":)",
                   g.correlation, gpid, gtid);
    append_us(out, g.start_ns);
    out += '}';
  }
}

void append_track_names(std::string& out, const timeline& t, bool& first) {
  if (!t.processes.empty()) {
    append_process_tracks(out, t, first);
    return;
  }
  std::set<std::uint64_t> threads;
  std::map<std::int32_t, std::set<std::uint64_t>> streams;  // device -> streams
  for (const event& e : t.events) {
    if (e.on_gpu())
      streams[e.device].insert(e.stream);
    else
      threads.insert(e.thread);
  }
  auto sep = [&] {
    if (!first) out += ",\n";
    first = false;
  };
  auto meta = [&](std::string_view what, std::int64_t pid, std::uint64_t tid, std::string_view key,
                  auto&& value) {
    sep();
    fmt::format_to(std::back_inserter(out), R"({{"ph":"M","name":"{}","pid":{},"tid":{},"args":{{"{}":)",
                   what, pid, tid, key);
    value();
    out += "}}";
  };
  if (!threads.empty()) {
    meta("process_name", cpu_pid, 0, "name", [&] { out += "\"CPU\""; });
    meta("process_sort_index", cpu_pid, 0, "sort_index", [&] { out += '0'; });
    for (const std::uint64_t tid : threads) {
      const auto it = t.thread_names.find(tid);
      const std::string name = it != t.thread_names.end() ? it->second : fmt::format("thread {}", tid);
      meta("thread_name", cpu_pid, tid, "name", [&] { append_json_string(out, name); });
    }
  }
  for (const auto& [device, ids] : streams) {
    const std::int64_t pid = gpu_pid_base + device;
    const std::string pname = t.device_name.empty() ? fmt::format("GPU {}", device)
                                                    : fmt::format("GPU {} {}", device, t.device_name);
    meta("process_name", pid, 0, "name", [&] { append_json_string(out, pname); });
    meta("process_sort_index", pid, 0, "sort_index",
         [&] { fmt::format_to(std::back_inserter(out), "{}", pid); });
    for (const std::uint64_t stream : ids) {
      const auto it = t.stream_names.find(stream);
      const std::string name = it != t.stream_names.end() ? it->second : fmt::format("stream {}", stream);
      meta("thread_name", pid, stream, "name", [&] { append_json_string(out, name); });
    }
  }
}

void append_event(std::string& out, const timeline& t, const event& e) {
  const std::string_view own_name = t.name_of(e);
  const bool anonymous = own_name.empty();
  out += R"({"ph":"X","cat":")";
  out += to_string(e.kind);
  out += R"(","name":)";
  if (anonymous)
    append_json_string(out, display_name(e));
  else
    append_json_string(out, own_name);
  const auto [pid, tid] = track_of(t, e);
  fmt::format_to(std::back_inserter(out), R"(,"pid":{},"tid":{},"ts":)", pid, tid);
  append_us(out, e.start_ns);
  out += R"(,"dur":)";
  // A malformed event (end before start) is written as an instant rather than as unreadable JSON.
  append_us(out, e.end_ns >= e.start_ns ? e.end_ns - e.start_ns : 0);
  out += R"(,"cname":")";
  out += colour(e);
  out += R"(","args":{"kind":")";
  out += to_string(e.kind);
  out += '"';
  // Fields at their default value are left out; the reader restores the defaults.
  if (anonymous) out += R"(,"anonymous":true)";
  if (e.device != -1) fmt::format_to(std::back_inserter(out), R"(,"device":{})", e.device);
  if (e.stream != 0) fmt::format_to(std::back_inserter(out), R"(,"stream":{})", e.stream);
  if (e.thread != 0) fmt::format_to(std::back_inserter(out), R"(,"thread":{})", e.thread);
  if (e.correlation != 0) fmt::format_to(std::back_inserter(out), R"(,"correlation":{})", e.correlation);
  if (e.bytes != 0) fmt::format_to(std::back_inserter(out), R"(,"bytes":{})", e.bytes);
  if (e.copy != copy_kind::none)
    fmt::format_to(std::back_inserter(out), R"(,"copy":"{}")", to_string(e.copy));
  if (e.src != mem_kind::unknown) fmt::format_to(std::back_inserter(out), R"(,"src":"{}")", to_string(e.src));
  if (e.dst != mem_kind::unknown) fmt::format_to(std::back_inserter(out), R"(,"dst":"{}")", to_string(e.dst));
  if (e.sync != sync_kind::none)
    fmt::format_to(std::back_inserter(out), R"(,"sync":"{}")", to_string(e.sync));
  if (e.async) out += R"(,"async":true)";
  if (e.domain != 0) {
    out += R"(,"domain":)";
    append_json_string(out, t.domain_of(e));
  }
  // For the reader of the viewer only (ferry's reader ignores it): the copy's bandwidth.
  if (e.kind == activity::memcpy && e.bytes != 0 && e.end_ns > e.start_ns)
    fmt::format_to(std::back_inserter(out), R"(,"GB/s":{:.3f})",
                   static_cast<double>(e.bytes) / static_cast<double>(e.end_ns - e.start_ns));
  out += "}}";
}

template <class Map, class Key>
void append_string_map(std::string& out, const Map& m, Key&& key_text) {
  out += '{';
  bool first = true;
  for (const auto& [k, v] : m) {
    if (!first) out += ',';
    first = false;
    append_json_string(out, key_text(k));
    out += ':';
    append_json_string(out, v);
  }
  out += '}';
}

}  // namespace

std::string to_chrome_json(const timeline& t) {
  std::string out;
  out.reserve(1024 + t.events.size() * 320);
  out += "{\"ferry\":{";
  fmt::format_to(std::back_inserter(out), "\"format\":{},\"source\":", format_version);
  append_json_string(out, t.source);
  out += ",\"device_name\":";
  append_json_string(out, t.device_name);
  fmt::format_to(std::back_inserter(out), ",\"dropped\":{},\"link_h2d_gbps\":", t.dropped);
  append_double(out, t.link_h2d_gbps);
  out += ",\"link_d2h_gbps\":";
  append_double(out, t.link_d2h_gbps);
  out += ",\"metadata\":";
  append_string_map(out, t.metadata, [](const std::string& k) -> std::string_view { return k; });
  out += ",\"thread_names\":";
  append_string_map(out, t.thread_names, [](std::uint64_t k) { return std::to_string(k); });
  out += ",\"stream_names\":";
  append_string_map(out, t.stream_names, [](std::uint64_t k) { return std::to_string(k); });
  out += "},\n\"displayTimeUnit\":\"ns\",\n\"traceEvents\":[\n";
  bool first = true;
  append_track_names(out, t, first);
  for (const event& e : t.events) {
    if (!first) out += ",\n";
    first = false;
    append_event(out, t, e);
  }
  if (!t.processes.empty() && !first) append_counters_and_flows(out, t);
  out += "\n]}\n";
  return out;
}

void write_chrome_trace(const timeline& t, const std::filesystem::path& path) {
  // Under a temporary name until complete: an interrupted or failed write leaves no truncated trace.
  write_file_atomically(path, to_chrome_json(t));
}

}  // namespace ferry::trace
