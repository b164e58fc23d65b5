// What the SAX pass over a Chrome trace keeps (private to ferry::trace), and what the importers read it
// with.
//
// The reader (sax_reader.cpp) reduces each complete ("X") and metadata ("M") event to the few fields ferry
// reads as they stream by, and keeps the top-level "ferry" object and Kineto's hints. Whether the input is
// a ferry trace is only known once the whole input has been read (the "ferry" object may stand anywhere),
// so the conversion into a timeline comes after, in import_ferry.cpp or import_kineto.cpp. Their
// accessors check each field's type and throw input_error naming the input, the event, the field and the
// form expected.
#pragma once

#include <fmt/format.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ferry/core/error.hpp"
#include "ferry/trace/timeline.hpp"

namespace ferry::trace::detail {

/// One JSON scalar as the SAX pass saw it. Strings are ids into raw_trace::strings.
/// 16 bytes: a trace holds millions of events, each buffered with its fields until the input ends.
struct scalar {
  enum class type : std::uint8_t {
    absent,
    integer,
    big_unsigned,
    floating,
    string,
    boolean,
    null,
    container
  };
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

/// "a string", "an integer", ...: the type of a value in error messages.
[[nodiscard]] std::string_view type_name(scalar::type t);

/// The fields of an event ferry reads; everything else is skipped as it streams by.
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

/// Each slot's field as errors name it.
inline constexpr std::array<std::string_view, slot_count> slot_names{"ph",          "cat",
                                                                     "name",        "pid",
                                                                     "tid",         "args.kind",
                                                                     "args.copy",   "args.src",
                                                                     "args.dst",    "args.sync",
                                                                     "args.domain", "args.bytes",
                                                                     "args.async",  "args.correlation",
                                                                     "args.device", "args.stream",
                                                                     "args.thread", "args.anonymous",
                                                                     "args.name",   "args.labels"};

/// The slot a key of an event (event_slot) or of its args (args_slot) fills; nullopt for the keys ferry
/// does not read.
[[nodiscard]] std::optional<slot> event_slot(std::string_view key);
[[nodiscard]] std::optional<slot> args_slot(std::string_view key);

/// One event of traceEvents, reduced to its slots; ts and dur are checked and in nanoseconds.
struct raw_event {
  std::size_t index = 0;  // position in traceEvents
  std::array<scalar, slot_count> f;
  bool has_ts = false;
  bool has_dur = false;
  std::int64_t ts_ns = 0;
  std::int64_t dur_ns = 0;
};

/// The top-level "ferry" object of a ferry trace.
struct ferry_header {
  std::string source;
  std::string device_name;
  std::uint64_t dropped = 0;
  double link_h2d = 0;
  double link_d2h = 0;
  std::map<std::string, std::string> metadata;
  std::map<std::uint64_t, std::string> thread_names;
  std::map<std::uint64_t, std::string> stream_names;
};

/// The whole input as the SAX pass left it, with the typed accessors the importers read it by.
struct raw_trace {
  explicit raw_trace(std::string_view origin_name) : origin(origin_name) {}

  std::string origin;              // names the input in errors
  string_table strings;            // texts of the strings kept (scalar::s)
  std::vector<raw_event> events;   // the "X" and "M" events, in input order
  bool is_ferry = false;           // the input has a top-level "ferry" object
  bool kineto = false;             // the input has Kineto's top-level fields
  ferry_header ferry;              // read when is_ferry
  std::string kineto_device_name;  // deviceProperties[0].name

  /// Throws input_error: "<origin>: <message>".
  template <class... Args>
  [[noreturn]] void fail(fmt::format_string<Args...> f, Args&&... args) const {
    throw input_error(fmt::format("{}: {}", origin, fmt::format(f, std::forward<Args>(args)...)));
  }

  /// "traceEvents[<index>]".
  [[nodiscard]] std::string event_label(const raw_event& e) const;

  // Each accessor returns nullopt when the field is absent and throws input_error when it has another
  // type or is out of range.
  [[nodiscard]] std::optional<std::string_view> get_string(const raw_event& e, slot s) const;
  [[nodiscard]] std::optional<std::uint64_t> get_u64(const raw_event& e, slot s) const;
  [[nodiscard]] std::optional<std::int32_t> get_device(const raw_event& e, slot s) const;
  [[nodiscard]] std::optional<bool> get_bool(const raw_event& e, slot s) const;
  /// An id that may be written as a number or, in some traces, as text ("7", "stream 7"); nullopt for
  /// named tracks such as Kineto's "Spans". Never throws.
  [[nodiscard]] std::optional<std::uint64_t> numeric_id(const scalar& v) const;

  /// The string field `s` parsed by `parse` (one of timeline.hpp's parse_* functions), or `fallback`
  /// when absent; parse's input_error is rethrown naming the event and the field.
  template <class Enum, class Parse>
  [[nodiscard]] Enum get_word(const raw_event& e, slot s, Enum fallback, Parse&& parse) const {
    const auto text = get_string(e, s);
    if (!text) return fallback;
    try {
      return parse(*text);
    } catch (const input_error& ex) {
      fail("{}.{}: {}", event_label(e), slot_names[s], ex.what());
    }
  }
};

/// The timeline of a ferry trace (raw.is_ferry); takes raw.ferry's fields. Unsorted.
[[nodiscard]] timeline import_ferry(raw_trace& raw);
/// The timeline of a PyTorch profiler (Kineto) trace, or of another Chrome trace. Unsorted.
[[nodiscard]] timeline import_kineto(raw_trace& raw);

}  // namespace ferry::trace::detail
