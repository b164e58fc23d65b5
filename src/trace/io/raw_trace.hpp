// What the SAX pass over a Chrome trace reads of each event (private to ferry::trace), and what the
// importers read it with.
//
// The reader (sax_reader.cpp) reduces each event of traceEvents to the few fields ferry reads as they stream
// by (a raw_event, reused from one event to the next) and hands each complete ("X") and metadata ("M")
// event to an importer, which turns it into a timeline event at once: import_ferry.cpp for a trace with a
// top-level "ferry" object, import_kineto.cpp for the rest. Their accessors check each field's type and
// throw input_error naming the input, the event, the field and the form expected; the Kineto importer
// catches those for one record, skips it and counts why.
#pragma once

#include <fmt/format.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ferry/core/error.hpp"
#include "ferry/trace/timeline.hpp"

namespace ferry::trace::detail {

/// One JSON scalar as the SAX pass saw it. Strings are indices into raw_trace::texts.
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
    std::uint32_t s;     // string: index into raw_trace::texts (0, the empty text, when not kept)
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

/// One event of traceEvents, reduced to its slots; ts and dur are checked and in nanoseconds, or
/// time_problem says what is wrong with them.
struct raw_event {
  std::size_t index = 0;  // position in traceEvents
  std::array<scalar, slot_count> f;
  bool has_ts = false;
  bool has_dur = false;
  std::int64_t ts_ns = 0;
  std::int64_t dur_ns = 0;
  std::string time_problem;  // why ts or dur cannot be used (empty when they can)
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

/// What the SAX pass keeps besides the events, with the typed accessors the importers read events by.
struct raw_trace {
  explicit raw_trace(std::string_view origin_name) : origin(origin_name) { texts.emplace_back(); }

  std::string origin;              // names the input in errors
  std::vector<std::string> texts;  // texts of the strings of the current event (scalar::s); [0] is ""
  std::size_t text_count = 1;      // texts in use
  bool is_ferry = false;           // the input has a top-level "ferry" object
  bool kineto = false;             // the input has Kineto's top-level fields
  ferry_header ferry;              // read when is_ferry
  std::string kineto_device_name;  // deviceProperties[0].name

  /// Keeps `text` for the current event; returns its index.
  std::uint32_t keep_text(std::string_view text) {
    if (text_count == texts.size()) texts.emplace_back();
    texts[text_count].assign(text.data(), text.size());
    return static_cast<std::uint32_t>(text_count++);
  }
  [[nodiscard]] std::string_view text(const scalar& v) const { return texts[v.s]; }

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

/// Events as they are imported. With an upper bound on their number (from the input's size) they go
/// straight into one vector reserved for that many: its untouched tail costs address space, not memory.
/// Without one they go into chunks, so that no reallocation ever holds two copies of them all.
class event_buffer {
 public:
  /// At most `n` events will come (more still work, at the cost of a copy at the end).
  void reserve_upper_bound(std::size_t n) { flat_.reserve(n); }
  void push_back(const event& e) {
    if (chunks_.empty() && flat_.size() < flat_.capacity()) {
      flat_.push_back(e);
      return;
    }
    if (chunks_.empty() || chunks_.back().size() == chunk_events) chunks_.emplace_back();
    chunks_.back().push_back(e);
    ++chunked_;
  }
  [[nodiscard]] std::size_t size() const noexcept { return flat_.size() + chunked_; }
  /// Every event, in order, in one vector; empties the buffer (chunk by chunk).
  [[nodiscard]] std::vector<event> take() {
    std::vector<event> out;
    if (chunks_.empty()) {
      out.swap(flat_);
      return out;
    }
    out.reserve(size());
    out.insert(out.end(), flat_.begin(), flat_.end());
    std::vector<event>().swap(flat_);
    for (auto& c : chunks_) {
      out.insert(out.end(), c.begin(), c.end());
      std::vector<event>().swap(c);
    }
    chunks_.clear();
    chunked_ = 0;
    return out;
  }

 private:
  static constexpr std::size_t chunk_events = std::size_t{1} << 16;
  std::vector<event> flat_;
  std::vector<std::vector<event>> chunks_;
  std::size_t chunked_ = 0;
};

/// Turns the events of a ferry trace into timeline events; every odd field refuses the file (ferry wrote
/// it, so the file is damaged).
class ferry_importer {
 public:
  explicit ferry_importer(timeline& t) : t_(t) {}
  /// A complete ("X") event, its times checked.
  void add(const raw_trace& raw, const raw_event& r, event_buffer& out);
  /// Takes raw.ferry's header fields into the timeline.
  void finish(raw_trace& raw);

 private:
  timeline& t_;
};

/// Turns the events of a PyTorch profiler (Kineto) trace, or of another Chrome trace, into timeline
/// events. A record with an odd field is skipped and counted in timeline::skipped by reason.
class kineto_importer {
 public:
  explicit kineto_importer(timeline& t);
  /// A complete ("X") event; its times may have a time_problem.
  void add(const raw_trace& raw, const raw_event& r, event_buffer& out);
  /// A metadata ("M") event: track names and GPU process labels.
  void add_metadata(const raw_trace& raw, const raw_event& r);
  /// Counts one record skipped for `reason`.
  void skip(const std::string& reason) { ++t_.skipped[reason]; }
  /// Completes the timeline once every event is in t.events (moved there from the buffer): names the
  /// tracks, resolves what needs the runtime call behind a correlation id (a copy's asynchrony, the
  /// thread a CUPTI sync record waited on).
  void finish(raw_trace& raw);

 private:
  timeline& t_;
  std::uint32_t pytorch_;
  std::uint32_t pytorch_op_;
  std::set<std::int64_t> gpu_pids_;
  std::map<std::pair<std::int64_t, std::uint64_t>, std::string> track_names_;  // (pid, tid) -> name
  std::vector<std::size_t> copies_;    // memcpy events whose launching call decides `async`
  std::vector<std::size_t> syncs_;     // sync events whose thread is the launching call's
  std::vector<bool> sync_has_thread_;  // per syncs_: the record's own track gave a thread
  // Runtime calls on tracks without a numeric thread: (correlation, name id), for copies' asynchrony.
  std::vector<std::pair<std::uint64_t, std::uint32_t>> trackless_calls_;
};

}  // namespace ferry::trace::detail
