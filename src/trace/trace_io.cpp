// Chrome trace JSON: ferry's writer, and a reader for ferry's own traces and PyTorch profiler (Kineto)
// traces.
//
// The reader is a SAX handler over nlohmann's iterative parser, so no DOM of the whole file is built and
// nesting cannot overflow the stack: events are reduced to the few fields ferry reads as they stream by,
// then converted once the whole input is known to be well-formed (whether it is a ferry trace is only
// known once the top-level "ferry" object has been seen, wherever it stands in the file).
#include "ferry/trace/trace_io.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <system_error>
#include <unordered_map>
#include <utility>
#include <vector>

#include "ferry/core/error.hpp"

namespace ferry::trace {

namespace {

using json = nlohmann::json;

constexpr int format_version = 1;
constexpr std::int64_t cpu_pid = 1;
constexpr std::int64_t gpu_pid_base = 1000;
// Timestamps are microseconds; beyond this they no longer fit int64 nanoseconds (with room for dur).
constexpr double max_abs_ts_us = 9.2e15;

// ---------------------------------------------------------------------------------------------------
// Writing

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

void append_track_names(std::string& out, const timeline& t, bool& first) {
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
  auto meta = [&](std::string_view what, std::int64_t pid, std::uint64_t tid, std::string_view key, auto&& value) {
    sep();
    fmt::format_to(std::back_inserter(out), R"({{"ph":"M","name":"{}","pid":{},"tid":{},"args":{{"{}":)", what, pid,
                   tid, key);
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
    const std::string pname =
        t.device_name.empty() ? fmt::format("GPU {}", device) : fmt::format("GPU {} {}", device, t.device_name);
    meta("process_name", pid, 0, "name", [&] { append_json_string(out, pname); });
    meta("process_sort_index", pid, 0, "sort_index", [&] { fmt::format_to(std::back_inserter(out), "{}", pid); });
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
  const std::int64_t pid = e.on_gpu() ? gpu_pid_base + e.device : cpu_pid;
  const std::uint64_t tid = e.on_gpu() ? e.stream : e.thread;
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
  if (e.copy != copy_kind::none) fmt::format_to(std::back_inserter(out), R"(,"copy":"{}")", to_string(e.copy));
  if (e.src != mem_kind::unknown) fmt::format_to(std::back_inserter(out), R"(,"src":"{}")", to_string(e.src));
  if (e.dst != mem_kind::unknown) fmt::format_to(std::back_inserter(out), R"(,"dst":"{}")", to_string(e.dst));
  if (e.sync != sync_kind::none) fmt::format_to(std::back_inserter(out), R"(,"sync":"{}")", to_string(e.sync));
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

// ---------------------------------------------------------------------------------------------------
// Reading: the SAX pass

// One JSON scalar as the SAX pass saw it. Strings are ids into the reader's scratch string table.
// 16 bytes: a trace holds millions of events, each buffered with its fields until the input ends.
struct scalar {
  enum class type : std::uint8_t { absent, integer, big_unsigned, floating, string, boolean, null, container };
  type t = type::absent;
  union {
    std::int64_t i = 0;  // integer
    std::uint64_t u;     // big_unsigned (above INT64_MAX)
    double d;            // floating
    bool b;              // boolean
    std::uint32_t s;     // string (0 when the reader does not keep the text)
  };
};
static_assert(sizeof(scalar) == 16);

// The fields of an event ferry reads; everything else is skipped as it streams by.
enum slot : std::uint8_t {
  s_ph,
  s_cat,
  s_name,
  s_pid,
  s_tid,
  // args
  a_kind,
  a_copy,
  a_src,
  a_dst,
  a_sync,
  a_domain,
  a_bytes,
  a_async,
  a_correlation,
  a_device,
  a_stream,
  a_thread,
  a_anonymous,
  a_name,
  a_labels,
  slot_count,
};

constexpr std::array<std::string_view, slot_count> slot_names{"ph",          "cat",
                                                              "name",        "pid",
                                                              "tid",         "args.kind",
                                                              "args.copy",   "args.src",
                                                              "args.dst",    "args.sync",
                                                              "args.domain", "args.bytes",
                                                              "args.async",  "args.correlation",
                                                              "args.device", "args.stream",
                                                              "args.thread", "args.anonymous",
                                                              "args.name",   "args.labels"};

std::optional<slot> event_slot(std::string_view key) {
  if (key == "ph") return s_ph;
  if (key == "cat") return s_cat;
  if (key == "name") return s_name;
  if (key == "pid") return s_pid;
  if (key == "tid") return s_tid;
  return std::nullopt;
}

std::optional<slot> args_slot(std::string_view key) {
  static const std::unordered_map<std::string_view, slot> slots{{"kind", a_kind},
                                                                {"copy", a_copy},
                                                                {"src", a_src},
                                                                {"dst", a_dst},
                                                                {"sync", a_sync},
                                                                {"domain", a_domain},
                                                                {"bytes", a_bytes},
                                                                {"async", a_async},
                                                                {"correlation", a_correlation},
                                                                {"device", a_device},
                                                                {"stream", a_stream},
                                                                {"thread", a_thread},
                                                                {"anonymous", a_anonymous},
                                                                {"name", a_name},
                                                                {"labels", a_labels}};
  if (const auto it = slots.find(key); it != slots.end()) return it->second;
  return std::nullopt;
}

struct raw_event {
  std::size_t index = 0;  // position in traceEvents
  std::array<scalar, slot_count> f;
  bool has_ts = false;
  bool has_dur = false;
  std::int64_t ts_ns = 0;
  std::int64_t dur_ns = 0;
};

enum class ctx : std::uint8_t {
  root,                // the top-level object
  events,              // traceEvents (or a top-level array)
  event,               // one element of traceEvents
  args,                // its args
  ferry,               // the top-level "ferry" object
  ferry_metadata,      // ferry.metadata
  ferry_thread_names,  // ferry.thread_names
  ferry_stream_names,  // ferry.stream_names
  device_props,        // deviceProperties (Kineto)
  device_prop0,        // deviceProperties[0]
  skip,                // anything ferry does not read
};

struct frame {
  ctx c = ctx::skip;
  bool array = false;
  std::size_t count = 0;  // arrays: elements seen so far
  std::string key;        // objects: the key whose value comes next (or of the open child)
};

// Parses a JSON number's text (microseconds) into nanoseconds exactly (round half away from zero), so
// "4510785932383.927" is 4510785932383927 ns even where a double would be off by one. `approx` is the
// parser's double of the same text, used for the range check.
std::optional<std::int64_t> us_text_to_ns(std::string_view text, double approx) {
  if (!std::isfinite(approx) || std::fabs(approx) > max_abs_ts_us) return std::nullopt;
  std::size_t i = 0;
  const bool negative = i < text.size() && text[i] == '-';
  if (negative) ++i;
  const std::size_t int_begin = i;
  while (i < text.size() && text[i] >= '0' && text[i] <= '9') ++i;
  const std::size_t int_len = i - int_begin;
  std::size_t frac_begin = i;
  std::size_t frac_len = 0;
  if (i < text.size() && text[i] == '.') {
    frac_begin = ++i;
    while (i < text.size() && text[i] >= '0' && text[i] <= '9') ++i;
    frac_len = i - frac_begin;
  }
  std::int64_t exp10 = 0;
  if (i < text.size() && (text[i] == 'e' || text[i] == 'E')) {
    ++i;
    bool exp_negative = false;
    if (i < text.size() && (text[i] == '+' || text[i] == '-')) exp_negative = text[i++] == '-';
    while (i < text.size() && text[i] >= '0' && text[i] <= '9') {
      // Saturates: an exponent this large leaves only zeros (the range check caught the rest).
      if (exp10 < 100'000'000) exp10 = exp10 * 10 + (text[i] - '0');
      ++i;
    }
    if (exp_negative) exp10 = -exp10;
  }
  if (i != text.size() || int_len + frac_len == 0) return std::nullopt;
  const std::size_t n = int_len + frac_len;
  auto digit = [&](std::size_t k) -> unsigned {
    return static_cast<unsigned>(k < int_len ? text[int_begin + k] - '0' : text[frac_begin + (k - int_len)] - '0');
  };
  // Digit k weighs 10^(top - 1 - k) nanoseconds.
  const std::int64_t top = static_cast<std::int64_t>(int_len) + exp10 + 3;
  const std::size_t whole = top <= 0 ? 0 : std::min<std::size_t>(n, static_cast<std::size_t>(top));
  std::uint64_t acc = 0;
  constexpr auto cap = static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max());
  auto push = [&](unsigned d) {
    return !__builtin_mul_overflow(acc, std::uint64_t{10}, &acc) && !__builtin_add_overflow(acc, d, &acc) && acc <= cap;
  };
  for (std::size_t k = 0; k < whole; ++k)
    if (!push(digit(k))) return std::nullopt;
  if (acc != 0)
    for (std::int64_t k = static_cast<std::int64_t>(n); k < top; ++k)
      if (!push(0)) return std::nullopt;
  if (top >= 0 && static_cast<std::uint64_t>(top) < n && digit(static_cast<std::size_t>(top)) >= 5) ++acc;
  if (acc > cap) return std::nullopt;
  const auto mag = static_cast<std::int64_t>(acc);
  return negative ? -mag : mag;
}

std::string_view type_name(scalar::type t) {
  switch (t) {
    case scalar::type::absent: return "nothing";
    case scalar::type::integer:
    case scalar::type::big_unsigned: return "an integer";
    case scalar::type::floating: return "a number";
    case scalar::type::string: return "a string";
    case scalar::type::boolean: return "a boolean";
    case scalar::type::null: return "null";
    case scalar::type::container: return "an object or array";
  }
  return "a value";
}

class reader {
 public:
  reader(std::string_view origin, const read_limits& limits) : origin_(origin), limits_(limits) {}

  template <class... Args>
  [[noreturn]] void fail(fmt::format_string<Args...> f, Args&&... args) const {
    throw input_error(fmt::format("{}: {}", origin_, fmt::format(f, std::forward<Args>(args)...)));
  }

  // nlohmann SAX interface ------------------------------------------------------------------------
  bool null() {
    scalar v;
    v.t = scalar::type::null;
    return value(v, {});
  }
  bool boolean(bool b) {
    scalar v;
    v.t = scalar::type::boolean;
    v.b = b;
    return value(v, {});
  }
  bool number_integer(json::number_integer_t i) {
    scalar v;
    v.t = scalar::type::integer;
    v.i = i;
    return value(v, {});
  }
  bool number_unsigned(json::number_unsigned_t u) {
    scalar v;
    if (u <= static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
      v.t = scalar::type::integer;
      v.i = static_cast<std::int64_t>(u);
    } else {
      v.t = scalar::type::big_unsigned;
      v.u = u;
    }
    return value(v, {});
  }
  bool number_float(json::number_float_t d, const json::string_t& text) {
    scalar v;
    v.t = scalar::type::floating;
    v.d = d;
    return value(v, text);
  }
  bool string(json::string_t& s) {
    scalar v;
    v.t = scalar::type::string;
    v.s = keeps_text() ? scratch_.intern(s) : 0;
    return value(v, {});
  }
  bool binary(json::binary_t& /*unused*/) { fail("binary values are not JSON"); }
  bool start_object(std::size_t /*unused*/) { return open(false); }
  bool start_array(std::size_t /*unused*/) { return open(true); }
  bool key(json::string_t& k) {
    stack_.back().key = k;
    return true;
  }
  bool end_object() { return close(); }
  bool end_array() { return close(); }
  bool parse_error(std::size_t position, const std::string& /*last_token*/, const nlohmann::detail::exception& ex) {
    // nlohmann's message reads "[json.exception.parse_error.101] parse error at line 1, column 7: ...".
    std::string_view what = ex.what();
    if (const auto bracket = what.find("] "); what.starts_with("[json.") && bracket != std::string_view::npos)
      what.remove_prefix(bracket + 2);
    // Its "last read" part quotes the input, which may be a 64 KiB string.
    if (what.size() > 300) what = what.substr(0, 300);
    // nlohmann counts the characters read, the offending one included: its offset is one less. Running
    // out of input reads one past the end.
    const std::size_t offset = std::min(position == 0 ? 0 : position - 1, text_size_);
    fail("{} at byte {} (of {}): {}; expected a complete JSON document (Chrome trace format)",
         offset >= text_size_ ? "truncated JSON" : "invalid JSON", offset, text_size_, what);
  }

  // Results ---------------------------------------------------------------------------------------
  void set_text_size(std::size_t n) { text_size_ = n; }
  timeline finish();

 private:
  // Where the reader is, as "traceEvents[3].args.x"; `next` is appended (the child about to open).
  [[nodiscard]] std::string path(std::string_view next = {}) const {
    // While a child is open, its parent's key (or element count) still names it.
    std::string p;
    for (std::size_t k = 0; k + 1 < stack_.size(); ++k)
      p += stack_[k].array ? fmt::format("[{}]", stack_[k].count) : "." + stack_[k].key;
    p += next;
    if (!p.empty() && p.front() == '.') p.erase(0, 1);
    // Deep or long-keyed paths are shortened: their head and tail say where.
    if (p.size() > 160) p = p.substr(0, 100) + "..." + p.substr(p.size() - 50);
    return p.empty() ? "the top level" : p;
  }
  [[nodiscard]] std::string event_label(const raw_event& e) const { return fmt::format("traceEvents[{}]", e.index); }

  // Whether a string arriving now is one ferry reads (the rest are not even copied).
  [[nodiscard]] bool keeps_text() const {
    if (stack_.empty()) return false;
    const frame& top = stack_.back();
    switch (top.c) {
      case ctx::event: return event_slot(top.key).has_value();
      case ctx::args: return args_slot(top.key).has_value();
      case ctx::root:
      case ctx::skip:
      case ctx::device_props:
      case ctx::events: return false;
      case ctx::device_prop0: return top.key == "name";
      default: return true;
    }
  }

  // Where the next value goes: the label it is reached by, and the context it opens if a container.
  std::string child_label() {
    frame& top = stack_.back();
    return top.array ? fmt::format("[{}]", top.count) : "." + top.key;
  }

  bool open(bool array) {
    if (stack_.size() + 1 > limits_.max_depth)
      fail("JSON nested deeper than {} levels (read_limits::max_depth) at {}", limits_.max_depth,
           stack_.empty() ? std::string("the top level") : path(child_label()));
    frame f;
    f.array = array;
    if (stack_.empty()) {
      if (array)
        f.c = ctx::events;  // the JSON Array Format: a bare list of events
      else
        f.c = ctx::root;
      seen_events_ = array;
      stack_.push_back(std::move(f));
      return true;
    }
    f.c = child_context(array);
    stack_.push_back(std::move(f));
    return true;
  }

  bool close() {
    frame& top = stack_.back();
    if (top.c == ctx::event) finish_event();
    stack_.pop_back();
    if (!stack_.empty()) advance();
    return true;
  }

  // Moves the parent past the value just read.
  void advance() {
    frame& top = stack_.back();
    if (top.array) ++top.count;
  }

  ctx child_context(bool array) {
    frame& top = stack_.back();
    const std::string_view k = top.key;
    switch (top.c) {
      case ctx::root:
        if (k == "traceEvents") {
          if (!array) fail("traceEvents: expected an array of events, found an object");
          seen_events_ = true;
          return ctx::events;
        }
        if (k == "ferry") {
          if (array) fail("ferry: expected an object, found an array");
          is_ferry_ = true;
          return ctx::ferry;
        }
        if (k == "deviceProperties") {
          kineto_ = true;
          return array ? ctx::device_props : ctx::skip;
        }
        return ctx::skip;
      case ctx::events:
        if (array) fail("{}[{}]: expected an event object, found an array", events_label(), top.count);
        begin_event(top.count);
        return ctx::event;
      case ctx::event:
        if (k == "args" && !array) return ctx::args;
        if (const auto s = event_slot(k)) current_.f[*s].t = scalar::type::container;
        if (k == "ts" || k == "dur")
          fail("{}.{}: expected a number of microseconds, found an {}", event_label(current_), k,
               array ? "array" : "object");
        return ctx::skip;
      case ctx::args:
        if (const auto s = args_slot(k)) current_.f[*s].t = scalar::type::container;
        return ctx::skip;
      case ctx::ferry:
        if (k == "metadata" || k == "thread_names" || k == "stream_names") {
          if (array) fail("ferry.{}: expected an object, found an array", k);
          return k == "metadata"       ? ctx::ferry_metadata
                 : k == "thread_names" ? ctx::ferry_thread_names
                                       : ctx::ferry_stream_names;
        }
        if (k == "source" || k == "device_name" || k == "dropped" || k == "format" || k == "link_h2d_gbps" ||
            k == "link_d2h_gbps")
          fail("ferry.{}: expected a {}, found an {}", k, (k == "source" || k == "device_name") ? "string" : "number",
               array ? "array" : "object");
        return ctx::skip;
      case ctx::ferry_metadata:
      case ctx::ferry_thread_names:
      case ctx::ferry_stream_names:
        fail("{}.{}: expected a string, found an {}", path(), k, array ? "array" : "object");
      case ctx::device_props: return (!array && top.count == 0) ? ctx::device_prop0 : ctx::skip;
      case ctx::device_prop0:
      case ctx::skip: return ctx::skip;
    }
    return ctx::skip;
  }

  [[nodiscard]] std::string_view events_label() const { return "traceEvents"; }

  void begin_event(std::size_t index) {
    ++event_count_;
    if (event_count_ > limits_.max_events)
      fail("more than {} trace events (read_limits::max_events): traceEvents[{}] is one too many", limits_.max_events,
           index);
    current_ = raw_event{};
    current_.index = index;
  }

  void finish_event() {
    // Only complete events ("X") and metadata ("M") carry anything ferry reads; flows, instants and
    // counters are dropped here so they cost no memory.
    const scalar& ph = current_.f[s_ph];
    if (ph.t != scalar::type::string) {
      if (ph.t != scalar::type::absent)
        fail("{}.ph: expected a string, found {}", event_label(current_), type_name(ph.t));
      return;
    }
    const std::string_view p = scratch_[ph.s];
    if (p == "X") {
      if (!current_.has_ts) fail("{}: complete event (ph \"X\") has no ts", event_label(current_));
      if (!current_.has_dur) fail("{}: complete event (ph \"X\") has no dur", event_label(current_));
      std::int64_t end = 0;
      if (__builtin_add_overflow(current_.ts_ns, current_.dur_ns, &end))
        fail("{}: ts + dur is beyond int64 nanoseconds", event_label(current_));
      raws_.push_back(current_);
    } else if (p == "M") {
      raws_.push_back(current_);
    }
  }

  // A scalar arrived (number text is set for floats).
  bool value(const scalar& v, std::string_view number_text) {
    if (stack_.empty()) fail("the top level is {}: expected a JSON object with traceEvents", type_name(v.t));
    frame& top = stack_.back();
    const std::string_view k = top.key;
    switch (top.c) {
      case ctx::root:
        if (k == "traceEvents") fail("traceEvents: expected an array of events, found {}", type_name(v.t));
        if (k == "ferry") fail("ferry: expected an object, found {}", type_name(v.t));
        if (k == "schemaVersion" || k == "baseTimeNanoseconds") kineto_ = true;
        break;
      case ctx::events: fail("{}[{}]: expected an event object, found {}", events_label(), top.count, type_name(v.t));
      case ctx::event:
        if (k == "ts" || k == "dur") {
          time_field(k, v, number_text);
        } else if (const auto s = event_slot(k)) {
          current_.f[*s] = v;
        }
        break;
      case ctx::args:
        if (const auto s = args_slot(k)) current_.f[*s] = v;
        break;
      case ctx::ferry: ferry_field(k, v); break;
      case ctx::ferry_metadata:
        metadata_[std::string(k)] = std::string(expect_string(v, fmt::format("ferry.metadata.{}", k)));
        break;
      case ctx::ferry_thread_names:
      case ctx::ferry_stream_names: {
        const bool threads = top.c == ctx::ferry_thread_names;
        const std::string field = fmt::format("ferry.{}", threads ? "thread_names" : "stream_names");
        std::uint64_t id = 0;
        const auto [end, ec] = std::from_chars(k.data(), k.data() + k.size(), id);
        if (k.empty() || ec != std::errc{} || end != k.data() + k.size())
          fail("{}: key \"{}\" is not an id: expected a decimal integer", field, k);
        (threads ? thread_names_ : stream_names_)[id] = std::string(expect_string(v, fmt::format("{}.{}", field, k)));
        break;
      }
      case ctx::device_props: break;
      case ctx::device_prop0:
        if (k == "name" && v.t == scalar::type::string) kineto_device_name_ = std::string(scratch_[v.s]);
        break;
      case ctx::skip: break;
    }
    advance();
    return true;
  }

  std::string_view expect_string(const scalar& v, const std::string& field) {
    if (v.t != scalar::type::string) fail("{}: expected a string, found {}", field, type_name(v.t));
    return scratch_[v.s];
  }

  void ferry_field(std::string_view k, const scalar& v) {
    auto number = [&](std::string_view field) -> double {
      if (v.t == scalar::type::integer) return static_cast<double>(v.i);
      if (v.t == scalar::type::big_unsigned) return static_cast<double>(v.u);
      if (v.t == scalar::type::floating) return v.d;
      fail("ferry.{}: expected a number, found {}", field, type_name(v.t));
    };
    if (k == "format") {
      if (v.t != scalar::type::integer || v.i < 1)
        fail("ferry.format: expected a positive integer (format version), found {}", type_name(v.t));
      if (v.i > format_version)
        fail("ferry.format: version {} is newer than this reader's ({}); update ferry", v.i, format_version);
    } else if (k == "source") {
      source_ = expect_string(v, "ferry.source");
    } else if (k == "device_name") {
      device_name_ = expect_string(v, "ferry.device_name");
    } else if (k == "dropped") {
      if (v.t == scalar::type::integer && v.i >= 0)
        dropped_ = static_cast<std::uint64_t>(v.i);
      else if (v.t == scalar::type::big_unsigned)
        dropped_ = v.u;
      else
        fail("ferry.dropped: expected a non-negative integer, found {}",
             v.t == scalar::type::integer ? std::to_string(v.i) : std::string(type_name(v.t)));
    } else if (k == "link_h2d_gbps") {
      link_h2d_ = number(k);
    } else if (k == "link_d2h_gbps") {
      link_d2h_ = number(k);
    } else if (k == "metadata" || k == "thread_names" || k == "stream_names") {
      fail("ferry.{}: expected an object, found {}", k, type_name(v.t));
    }
  }

  void time_field(std::string_view k, const scalar& v, std::string_view number_text) {
    auto field = [&] { return fmt::format("{}.{}", event_label(current_), k); };
    std::optional<std::int64_t> ns;
    switch (v.t) {
      case scalar::type::integer:
        if (std::fabs(static_cast<double>(v.i)) <= max_abs_ts_us) ns = v.i * 1000;
        break;
      case scalar::type::big_unsigned: break;
      case scalar::type::floating: ns = us_text_to_ns(number_text, v.d); break;
      default: fail("{}: expected a number of microseconds, found {}", field(), type_name(v.t));
    }
    if (!ns) {
      const std::string shown = v.t == scalar::type::floating  ? std::string(number_text.substr(0, 40))
                                : v.t == scalar::type::integer ? std::to_string(v.i)
                                                               : std::to_string(v.u);
      fail("{} = {} us is out of range: expected at most {:g} us in magnitude (int64 nanoseconds)", field(), shown,
           max_abs_ts_us);
    }
    if (k == "ts") {
      current_.has_ts = true;
      current_.ts_ns = *ns;
    } else {
      if (*ns < 0) fail("{} = {} us is negative: expected a duration >= 0", field(), static_cast<double>(*ns) / 1000.0);
      current_.has_dur = true;
      current_.dur_ns = *ns;
    }
  }

  // Conversion helpers (after the SAX pass) -------------------------------------------------------
  std::optional<std::string_view> get_string(const raw_event& e, slot s) {
    const scalar& v = e.f[s];
    if (v.t == scalar::type::absent) return std::nullopt;
    if (v.t != scalar::type::string)
      fail("{}.{}: expected a string, found {}", event_label(e), slot_names[s], type_name(v.t));
    return scratch_[v.s];
  }
  std::optional<std::uint64_t> get_u64(const raw_event& e, slot s) {
    const scalar& v = e.f[s];
    if (v.t == scalar::type::absent) return std::nullopt;
    if (v.t == scalar::type::integer && v.i >= 0) return static_cast<std::uint64_t>(v.i);
    if (v.t == scalar::type::big_unsigned) return v.u;
    fail("{}.{}: expected a non-negative integer, found {}", event_label(e), slot_names[s],
         v.t == scalar::type::integer ? std::to_string(v.i) : std::string(type_name(v.t)));
  }
  std::optional<std::int32_t> get_device(const raw_event& e, slot s) {
    const scalar& v = e.f[s];
    if (v.t == scalar::type::absent) return std::nullopt;
    if (v.t == scalar::type::integer && v.i >= -1 && v.i <= std::numeric_limits<std::int32_t>::max())
      return static_cast<std::int32_t>(v.i);
    fail("{}.{}: expected a device ordinal (an integer from -1 to {}), found {}", event_label(e), slot_names[s],
         std::numeric_limits<std::int32_t>::max(),
         v.t == scalar::type::integer ? std::to_string(v.i) : std::string(type_name(v.t)));
  }
  std::optional<bool> get_bool(const raw_event& e, slot s) {
    const scalar& v = e.f[s];
    if (v.t == scalar::type::absent) return std::nullopt;
    if (v.t != scalar::type::boolean)
      fail("{}.{}: expected true or false, found {}", event_label(e), slot_names[s], type_name(v.t));
    return v.b;
  }
  // An id that may be written as a number or, in some traces, as text ("7", "stream 7"); nullopt for
  // named tracks such as Kineto's "Spans".
  std::optional<std::uint64_t> numeric_id(const scalar& v) {
    if (v.t == scalar::type::integer)
      return v.i >= 0 ? std::optional<std::uint64_t>(static_cast<std::uint64_t>(v.i)) : std::nullopt;
    if (v.t == scalar::type::big_unsigned) return v.u;
    if (v.t != scalar::type::string) return std::nullopt;
    std::string_view text = scratch_[v.s];
    if (text.starts_with("stream ")) text.remove_prefix(7);
    while (!text.empty() && text.back() == ' ') text.remove_suffix(1);
    std::uint64_t id = 0;
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), id);
    if (text.empty() || ec != std::errc{} || end != text.data() + text.size()) return std::nullopt;
    return id;
  }

  template <class Enum, class Parse>
  Enum get_word(const raw_event& e, slot s, Enum fallback, Parse&& parse) {
    const auto text = get_string(e, s);
    if (!text) return fallback;
    try {
      return parse(*text);
    } catch (const input_error& ex) {
      fail("{}.{}: {}", event_label(e), slot_names[s], ex.what());
    }
  }

  void convert_ferry(timeline& t);
  void convert_kineto(timeline& t);

  std::string origin_;
  read_limits limits_;
  std::size_t text_size_ = 0;
  std::vector<frame> stack_;
  string_table scratch_;
  raw_event current_;
  std::vector<raw_event> raws_;
  std::uint64_t event_count_ = 0;
  bool seen_events_ = false;
  bool is_ferry_ = false;
  bool kineto_ = false;
  // The ferry object.
  std::string source_;
  std::string device_name_;
  std::uint64_t dropped_ = 0;
  double link_h2d_ = 0;
  double link_d2h_ = 0;
  std::map<std::string, std::string> metadata_;
  std::map<std::uint64_t, std::string> thread_names_;
  std::map<std::uint64_t, std::string> stream_names_;
  // Kineto.
  std::string kineto_device_name_;
};

timeline reader::finish() {
  if (!seen_events_) fail("no traceEvents array: expected a Chrome trace (a ferry or PyTorch profiler trace)");
  timeline t;
  if (is_ferry_)
    convert_ferry(t);
  else
    convert_kineto(t);
  t.sort();
  return t;
}

void reader::convert_ferry(timeline& t) {
  t.source = std::move(source_);
  t.device_name = std::move(device_name_);
  t.dropped = dropped_;
  t.link_h2d_gbps = link_h2d_;
  t.link_d2h_gbps = link_d2h_;
  t.metadata = std::move(metadata_);
  t.thread_names = std::move(thread_names_);
  t.stream_names = std::move(stream_names_);
  // Track names come from the ferry object; the "M" events only serve the viewers.
  for (const raw_event& r : raws_) {
    if (scratch_[r.f[s_ph].s] != "X") continue;
    event e;
    const auto kind_text = get_string(r, a_kind);
    const auto cat_text = get_string(r, s_cat);
    if (!kind_text && !cat_text)
      fail("{}: no args.kind and no cat: expected one of ferry's activities", event_label(r));
    e.kind = get_word(r, kind_text ? a_kind : s_cat, activity::kernel, parse_activity);
    e.start_ns = r.ts_ns;
    e.end_ns = r.ts_ns + r.dur_ns;  // checked for overflow when read
    const bool anonymous = get_bool(r, a_anonymous).value_or(false);
    const auto name = get_string(r, s_name);
    e.name = anonymous || !name ? 0 : t.strings.intern(*name);
    if (const auto d = get_string(r, a_domain)) e.domain = t.strings.intern(*d);
    e.device = get_device(r, a_device).value_or(-1);
    e.stream = get_u64(r, a_stream).value_or(0);
    e.thread = get_u64(r, a_thread).value_or(0);
    e.correlation = get_u64(r, a_correlation).value_or(0);
    e.bytes = get_u64(r, a_bytes).value_or(0);
    e.copy = get_word(r, a_copy, copy_kind::none, parse_copy_kind);
    e.src = get_word(r, a_src, mem_kind::unknown, parse_mem_kind);
    e.dst = get_word(r, a_dst, mem_kind::unknown, parse_mem_kind);
    e.sync = get_word(r, a_sync, sync_kind::none, parse_sync_kind);
    e.async = get_bool(r, a_async).value_or(false);
    t.events.push_back(e);
  }
}

// Kineto's memory words (CUPTI's): arrays count as device memory.
mem_kind kineto_mem(std::string_view w) {
  if (w == "Pageable") return mem_kind::pageable;
  if (w == "Pinned") return mem_kind::pinned;
  if (w == "Device" || w == "Array") return mem_kind::device;
  if (w == "Managed") return mem_kind::managed;
  return mem_kind::unknown;
}

// "Memcpy HtoD (Pageable -> Device)", "Memcpy DtoH (Device -> Pinned)", "Memcpy PtoP (Device -> Device)".
void parse_kineto_copy(std::string_view name, event& e) {
  if (!name.starts_with("Memcpy ")) return;
  name.remove_prefix(7);
  const std::string_view dir = name.substr(0, name.find(' '));
  if (dir == "HtoD" || dir == "HtoA")
    e.copy = copy_kind::h2d;
  else if (dir == "DtoH" || dir == "AtoH")
    e.copy = copy_kind::d2h;
  else if (dir == "DtoD" || dir == "DtoA" || dir == "AtoD" || dir == "AtoA")
    e.copy = copy_kind::d2d;
  else if (dir == "HtoH")
    e.copy = copy_kind::h2h;
  else if (dir == "PtoP")
    e.copy = copy_kind::p2p;
  const auto open = name.find('(');
  const auto arrow = name.find(" -> ");
  const auto close = name.find(')');
  if (open == std::string_view::npos || arrow == std::string_view::npos || close == std::string_view::npos ||
      !(open < arrow && arrow < close))
    return;
  e.src = kineto_mem(name.substr(open + 1, arrow - open - 1));
  e.dst = kineto_mem(name.substr(arrow + 4, close - arrow - 4));
}

// The CPU-side wait a runtime or driver call stands for.
sync_kind api_sync(std::string_view name) {
  if (name == "cudaStreamSynchronize" || name == "cuStreamSynchronize") return sync_kind::stream;
  if (name == "cudaDeviceSynchronize" || name == "cuCtxSynchronize") return sync_kind::device;
  if (name == "cudaEventSynchronize" || name == "cuEventSynchronize") return sync_kind::event;
  if (name == "cudaStreamWaitEvent" || name == "cuStreamWaitEvent") return sync_kind::stream_wait;
  if (name == "cudaMemcpy" || name == "cuMemcpy" || name == "cuMemcpyHtoD_v2" || name == "cuMemcpyDtoH_v2" ||
      name == "cuMemcpyDtoD_v2")
    return sync_kind::copy;
  return sync_kind::none;
}

// Newer Kineto's CUPTI synchronization records ("cuda_sync").
sync_kind kineto_sync(std::string_view name) {
  if (name == "Stream Sync") return sync_kind::stream;
  if (name == "Context Sync") return sync_kind::device;
  if (name == "Event Sync") return sync_kind::event;
  if (name == "Stream Wait Event") return sync_kind::stream_wait;
  return sync_kind::none;
}

void reader::convert_kineto(timeline& t) {
  t.source = kineto_ ? "pytorch profiler (Kineto)" : "chrome trace";
  t.device_name = std::move(kineto_device_name_);

  // Pass 1: which processes are GPUs, track names, and the runtime call behind each correlation id.
  std::set<std::int64_t> gpu_pids;
  struct named_track {
    std::int64_t pid;
    std::uint64_t tid;
    std::string name;
  };
  std::vector<named_track> track_names;
  struct launch {
    std::string_view name;
    std::optional<std::uint64_t> thread;
  };
  std::unordered_map<std::uint64_t, launch> launches;  // correlation -> runtime/driver call
  auto pid_of = [&](const raw_event& r) -> std::optional<std::int64_t> {
    const scalar& v = r.f[s_pid];
    if (v.t == scalar::type::integer) return v.i;
    if (const auto id = numeric_id(v);
        id && *id <= static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))
      return static_cast<std::int64_t>(*id);
    return std::nullopt;
  };
  for (const raw_event& r : raws_) {
    const std::string_view ph = scratch_[r.f[s_ph].s];
    const std::string_view name = r.f[s_name].t == scalar::type::string ? scratch_[r.f[s_name].s] : "";
    const auto pid = pid_of(r);
    if (ph == "M") {
      if (!pid) continue;
      if (name == "process_labels") {
        const auto labels = get_string(r, a_labels);
        if (labels && labels->starts_with("GPU")) gpu_pids.insert(*pid);
      } else if (name == "thread_name") {
        const auto tid = numeric_id(r.f[s_tid]);
        const auto text = get_string(r, a_name);
        if (tid && text) track_names.push_back({*pid, *tid, std::string(*text)});
      }
      continue;
    }
    const std::string_view cat = r.f[s_cat].t == scalar::type::string ? scratch_[r.f[s_cat].s] : "";
    if (cat == "kernel" || cat == "gpu_memcpy" || cat == "gpu_memset") {
      if (pid) gpu_pids.insert(*pid);
    } else if (cat == "cuda_runtime" || cat == "cuda_driver") {
      if (const auto corr = get_u64(r, a_correlation); corr && *corr != 0)
        launches[*corr] = launch{name, numeric_id(r.f[s_tid])};
    }
  }
  for (named_track& n : track_names) {
    while (!n.name.empty() && n.name.back() == ' ') n.name.pop_back();  // Kineto writes "stream 7 "
    (gpu_pids.count(n.pid) != 0 ? t.stream_names : t.thread_names)[n.tid] = std::move(n.name);
  }

  // Pass 2: the events.
  const std::uint32_t pytorch = t.strings.intern("pytorch");
  const std::uint32_t pytorch_op = t.strings.intern("pytorch.op");
  for (const raw_event& r : raws_) {
    if (scratch_[r.f[s_ph].s] != "X") continue;
    const auto cat = get_string(r, s_cat);
    if (!cat) continue;
    const std::string_view name = get_string(r, s_name).value_or("");
    event e;
    e.start_ns = r.ts_ns;
    e.end_ns = r.ts_ns + r.dur_ns;
    e.correlation = get_u64(r, a_correlation).value_or(0);
    const bool gpu = *cat == "kernel" || *cat == "gpu_memcpy" || *cat == "gpu_memset";
    if (gpu) {
      e.kind = *cat == "kernel" ? activity::kernel : *cat == "gpu_memcpy" ? activity::memcpy : activity::memset;
      const auto stream = r.f[a_stream].t != scalar::type::absent ? get_u64(r, a_stream) : numeric_id(r.f[s_tid]);
      if (!stream) continue;  // not on a stream track
      e.stream = *stream;
      if (const auto d = get_device(r, a_device))
        e.device = *d;
      else if (const auto pid = pid_of(r); pid && *pid >= 0 && *pid <= std::numeric_limits<std::int32_t>::max())
        e.device = static_cast<std::int32_t>(*pid);
      if (e.kind != activity::kernel) e.bytes = get_u64(r, a_bytes).value_or(0);
      if (e.kind == activity::memcpy) {
        parse_kineto_copy(name, e);
        // Whether the copy was asynchronous is the launching call's business, not the copy record's.
        if (const auto it = launches.find(e.correlation); e.correlation != 0 && it != launches.end())
          e.async = it->second.name.find("Async") != std::string_view::npos;
      } else if (e.kind == activity::memset) {
        if (const auto open = name.find('('); open != std::string_view::npos) {
          const auto close = name.find(')', open);
          if (close != std::string_view::npos) e.dst = kineto_mem(name.substr(open + 1, close - open - 1));
        }
      }
    } else {
      if (*cat == "cuda_runtime" || *cat == "cuda_driver") {
        e.kind = activity::api;
        e.sync = api_sync(name);
      } else if (*cat == "cuda_sync") {
        e.kind = activity::sync;
        e.sync = kineto_sync(name);
        if (const auto s = get_u64(r, a_stream)) e.stream = *s;
        e.device = get_device(r, a_device).value_or(-1);
      } else if (*cat == "user_annotation") {
        e.kind = activity::range;
        e.domain = pytorch;
      } else if (*cat == "cpu_op" || *cat == "python_function") {
        e.kind = activity::range;
        e.domain = pytorch_op;
      } else {
        continue;  // gpu_user_annotation duplicates annotations on GPU tracks; others ferry does not use
      }
      std::optional<std::uint64_t> thread = numeric_id(r.f[s_tid]);
      // CUPTI's sync records sit on the GPU's tracks; the thread that waited made the matching call.
      if (e.kind == activity::sync)
        if (const auto it = launches.find(e.correlation);
            e.correlation != 0 && it != launches.end() && it->second.thread)
          thread = it->second.thread;
      if (!thread) continue;  // a named track such as "Spans"
      e.thread = *thread;
    }
    e.name = t.strings.intern(name);
    t.events.push_back(e);
  }
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
  out += "\n]}\n";
  return out;
}

void write_chrome_trace(const timeline& t, const std::filesystem::path& path) {
  const std::string text = to_chrome_json(t);
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out)
    throw std::system_error(errno, std::generic_category(), fmt::format("cannot open {} for writing", path.string()));
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
  out.close();
  if (!out) throw std::system_error(errno, std::generic_category(), fmt::format("cannot write {}", path.string()));
}

timeline parse_trace(std::string_view text, std::string_view origin, const read_limits& limits) {
  if (text.size() > limits.max_bytes)
    throw input_error(fmt::format("{}: {} bytes is more than read_limits::max_bytes ({} bytes)", origin, text.size(),
                                  limits.max_bytes));
  if (text.find_first_not_of(" \t\r\n") == std::string_view::npos)
    throw input_error(fmt::format("{}: empty input: expected a Chrome trace JSON object with traceEvents", origin));
  reader r(origin, limits);
  r.set_text_size(text.size());
  json::sax_parse(text.data(), text.data() + text.size(), &r);
  return r.finish();
}

timeline read_trace(const std::filesystem::path& path, const read_limits& limits) {
  std::error_code ec;
  const auto status = std::filesystem::status(path, ec);
  if (ec || !std::filesystem::exists(status))
    throw input_error(fmt::format("{}: cannot open: {}", path.string(), ec ? ec.message() : "no such file"));
  if (!std::filesystem::is_regular_file(status))
    throw input_error(fmt::format("{}: cannot read: not a regular file", path.string()));
  const std::uintmax_t size = std::filesystem::file_size(path, ec);
  if (ec) throw input_error(fmt::format("{}: cannot read its size: {}", path.string(), ec.message()));
  if (size > limits.max_bytes)
    throw input_error(fmt::format("{}: {} bytes is more than read_limits::max_bytes ({} bytes)", path.string(), size,
                                  limits.max_bytes));
  std::ifstream in(path, std::ios::binary);
  if (!in) throw input_error(fmt::format("{}: cannot open for reading", path.string()));
  std::string text(static_cast<std::size_t>(size), '\0');
  in.read(text.data(), static_cast<std::streamsize>(size));
  if (static_cast<std::uintmax_t>(in.gcount()) != size)
    throw input_error(fmt::format("{}: read {} of {} bytes (did the file shrink?)", path.string(), in.gcount(), size));
  // A file that grew while being read is read up to its size then: still within the limit.
  return parse_trace(text, path.string(), limits);
}

}  // namespace ferry::trace
