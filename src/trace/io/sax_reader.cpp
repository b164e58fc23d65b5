// The Chrome trace reader: a SAX handler over nlohmann's iterative parser fed by a byte_stream, so neither
// the text nor a DOM of it is ever held whole and nesting cannot overflow the stack. It enforces
// read_limits, reports malformed input by position and field, and hands each event to an importer as soon
// as its closing brace is read (raw_trace.hpp).
//
// Whether the input is a ferry trace is known from its top-level "ferry" object, which ferry writes before
// traceEvents. Events read before a "ferry" object are read as Kineto's; if one then appears, the input is
// read a second time as ferry's (trace_input::open is called again).
#include "ferry/trace/trace_io.hpp"

#include <fmt/format.h>

#include <fcntl.h>
#include <unistd.h>
#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <memory>

#include <cerrno>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "byte_stream.hpp"
#include "chrome_format.hpp"
#include "ferry/core/error.hpp"
#include "raw_trace.hpp"
#include "timestamps.hpp"

namespace ferry::trace {

namespace detail {
namespace {

using json = nlohmann::json;

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

class sax_reader {
 public:
  sax_reader(std::string_view origin, const read_limits& limits, byte_stream& in, bool ferry_pass)
      : raw_(origin), limits_(limits), in_(in), ferry_pass_(ferry_pass) {}

  template <class... Args>
  [[noreturn]] void fail(fmt::format_string<Args...> f, Args&&... args) const {
    raw_.fail(f, std::forward<Args>(args)...);
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
    if (keeps_text()) {
      // Texts outside an event are used at once: only an event's are kept until it closes.
      if (!in_event()) raw_.text_count = 1;
      v.s = raw_.keep_text(s);
    } else {
      v.s = 0;
    }
    return value(v, {});
  }
  bool binary(json::binary_t& /*unused*/) { fail("binary values are not JSON"); }
  bool start_object(std::size_t /*unused*/) { return open(false); }
  bool start_array(std::size_t /*unused*/) { return open(true); }
  bool key(json::string_t& k) {
    frame& top = stack_.back();
    top.key = k;
    if (top.c == ctx::root && k == "ferry" && mode_ == mode::kineto) {
      // Events were read as Kineto's: stop, and read the input again as a ferry trace.
      needs_ferry_pass_ = true;
      return false;
    }
    return true;
  }
  bool end_object() { return close(); }
  bool end_array() { return close(); }
  bool parse_error(std::size_t position, const std::string& /*last_token*/,
                   const nlohmann::detail::exception& ex) {
    // nlohmann's message reads "[json.exception.parse_error.101] parse error at line 1, column 7: ...".
    std::string_view what = ex.what();
    if (const auto bracket = what.find("] "); what.starts_with("[json.") && bracket != std::string_view::npos)
      what.remove_prefix(bracket + 2);
    // Its "last read" part quotes the input, which may be a 64 KiB string.
    if (what.size() > 300) what = what.substr(0, 300);
    // nlohmann counts the characters read, the offending one included: its offset is one less. Running
    // out of input reads one past the end.
    const bool ended = in_.ended();
    const std::uint64_t total = in_.known_size() != 0 ? in_.known_size() : ended ? in_.delivered() : 0;
    if (ended && !anything_read_ && stack_.empty() &&
        std::string_view(ex.what()).find("unexpected end of input") != std::string_view::npos)
      fail("empty input: expected a Chrome trace JSON object with traceEvents");
    const std::uint64_t at = position == 0 ? 0 : position - 1;  // in the bytes the parser was given
    const bool truncated = ended && at >= in_.passed();
    std::uint64_t offset = in_.input_offset(at);
    if (total != 0) offset = std::min<std::uint64_t>(offset, total);
    const std::string of = total != 0 && !in_.gzip() ? fmt::format(" (of {})", total)
                           : in_.gzip()              ? std::string(" of the inflated stream")
                                                     : std::string();
    fail("{} at byte {}{}: {}; expected a complete JSON document (Chrome trace format)",
         truncated ? "truncated JSON" : "invalid JSON", offset, of, what);
  }

  // Results ---------------------------------------------------------------------------------------
  /// The timeline, sorted; or nullopt when the input must be read again as a ferry trace.
  std::optional<timeline> finish();
  [[nodiscard]] bool needs_ferry_pass() const { return needs_ferry_pass_; }
  /// At most `n` events will be kept.
  void reserve_events(std::uint64_t n) { events_.reserve_upper_bound(static_cast<std::size_t>(n)); }

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
  [[nodiscard]] std::string event_label(const raw_event& e) const { return raw_.event_label(e); }

  [[nodiscard]] bool in_event() const {
    return !stack_.empty() && (stack_.back().c == ctx::event || stack_.back().c == ctx::args);
  }

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
    anything_read_ = true;
    if (stack_.size() + 1 > limits_.max_depth)
      fail("JSON nested deeper than {} levels (read_limits::max_depth) at {}", limits_.max_depth,
           stack_.empty() ? std::string("the top level") : path(child_label()));
    frame f;
    f.array = array;
    if (stack_.empty()) {
      if (array) {
        f.c = ctx::events;  // the JSON Array Format: a bare list of events
        start_events();
      } else {
        f.c = ctx::root;
      }
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
          start_events();
          return ctx::events;
        }
        if (k == "ferry") {
          if (array) fail("ferry: expected an object, found an array");
          raw_.is_ferry = true;
          return ctx::ferry;
        }
        if (k == "deviceProperties") {
          raw_.kineto = true;
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
        if (k == "ts" || k == "dur") {
          if (mode_ == mode::ferry)
            fail("{}.{}: expected a number of microseconds, found an {}", event_label(current_), k,
                 array ? "array" : "object");
          current_.time_problem = fmt::format("{} is not a number", k);
        }
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
          fail("ferry.{}: expected a {}, found an {}", k,
               (k == "source" || k == "device_name") ? "string" : "number", array ? "array" : "object");
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

  // traceEvents opens: the importer is chosen by what the top level said so far.
  void start_events() {
    if (mode_ != mode::undecided) return;
    if (ferry_pass_ || raw_.is_ferry) {
      mode_ = mode::ferry;
      ferry_.emplace(t_);
    } else {
      mode_ = mode::kineto;
      kineto_.emplace(t_);
    }
  }

  void begin_event(std::size_t index) {
    ++event_count_;
    if (event_count_ > limits_.max_events)
      fail("more than {} trace events (read_limits::max_events): traceEvents[{}] is one too many",
           limits_.max_events, index);
    if ((event_count_ & 0xffff) == 0) in_.set_events(event_count_);
    current_.index = index;
    current_.f.fill(scalar{});
    current_.has_ts = current_.has_dur = false;
    current_.ts_ns = current_.dur_ns = 0;
    current_.time_problem.clear();
    raw_.text_count = 1;
  }

  void finish_event() {
    // Only complete events ("X") and metadata ("M") carry anything ferry reads; flows, instants and
    // counters are dropped here so they cost no memory.
    const scalar& ph = current_.f[s_ph];
    const bool ferry = mode_ == mode::ferry;
    if (ph.t != scalar::type::string) {
      if (ph.t != scalar::type::absent) {
        if (ferry) fail("{}.ph: expected a string, found {}", event_label(current_), type_name(ph.t));
        kineto_->skip("a record whose ph is not a string");
      }
      return;
    }
    const std::string_view p = raw_.text(ph);
    if (p == "X") {
      if (!current_.has_ts && current_.time_problem.empty()) {
        if (ferry) fail("{}: complete event (ph \"X\") has no ts", event_label(current_));
        current_.time_problem = "no ts";
      }
      if (!current_.has_dur && current_.time_problem.empty()) {
        if (ferry) fail("{}: complete event (ph \"X\") has no dur", event_label(current_));
        current_.time_problem = "no dur";
      }
      std::int64_t end = 0;
      if (current_.time_problem.empty() && __builtin_add_overflow(current_.ts_ns, current_.dur_ns, &end)) {
        if (ferry) fail("{}: ts + dur is beyond int64 nanoseconds", event_label(current_));
        current_.time_problem = "ts + dur is beyond int64 nanoseconds";
      }
      if (ferry)
        ferry_->add(raw_, current_, events_);
      else
        kineto_->add(raw_, current_, events_);
    } else if (p == "M" && !ferry) {
      kineto_->add_metadata(raw_, current_);
    }
  }

  // A scalar arrived (number text is set for floats).
  bool value(const scalar& v, std::string_view number_text) {
    anything_read_ = true;
    if (stack_.empty()) fail("the top level is {}: expected a JSON object with traceEvents", type_name(v.t));
    frame& top = stack_.back();
    const std::string_view k = top.key;
    switch (top.c) {
      case ctx::root:
        if (k == "traceEvents") fail("traceEvents: expected an array of events, found {}", type_name(v.t));
        if (k == "ferry") fail("ferry: expected an object, found {}", type_name(v.t));
        if (k == "schemaVersion" || k == "baseTimeNanoseconds") raw_.kineto = true;
        break;
      case ctx::events:
        fail("{}[{}]: expected an event object, found {}", events_label(), top.count, type_name(v.t));
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
        raw_.ferry.metadata[std::string(k)] =
            std::string(expect_string(v, fmt::format("ferry.metadata.{}", k)));
        break;
      case ctx::ferry_thread_names:
      case ctx::ferry_stream_names: {
        const bool threads = top.c == ctx::ferry_thread_names;
        const std::string field = fmt::format("ferry.{}", threads ? "thread_names" : "stream_names");
        std::uint64_t id = 0;
        const auto [end, ec] = std::from_chars(k.data(), k.data() + k.size(), id);
        if (k.empty() || ec != std::errc{} || end != k.data() + k.size())
          fail("{}: key \"{}\" is not an id: expected a decimal integer", field, k);
        (threads ? raw_.ferry.thread_names : raw_.ferry.stream_names)[id] =
            std::string(expect_string(v, fmt::format("{}.{}", field, k)));
        break;
      }
      case ctx::device_props: break;
      case ctx::device_prop0:
        if (k == "name" && v.t == scalar::type::string) raw_.kineto_device_name = std::string(raw_.text(v));
        break;
      case ctx::skip: break;
    }
    advance();
    return true;
  }

  std::string_view expect_string(const scalar& v, const std::string& field) {
    if (v.t != scalar::type::string) fail("{}: expected a string, found {}", field, type_name(v.t));
    return raw_.text(v);
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
      raw_.ferry.source = expect_string(v, "ferry.source");
    } else if (k == "device_name") {
      raw_.ferry.device_name = expect_string(v, "ferry.device_name");
    } else if (k == "dropped") {
      if (v.t == scalar::type::integer && v.i >= 0)
        raw_.ferry.dropped = static_cast<std::uint64_t>(v.i);
      else if (v.t == scalar::type::big_unsigned)
        raw_.ferry.dropped = v.u;
      else
        fail("ferry.dropped: expected a non-negative integer, found {}",
             v.t == scalar::type::integer ? std::to_string(v.i) : std::string(type_name(v.t)));
    } else if (k == "link_h2d_gbps") {
      raw_.ferry.link_h2d = number(k);
    } else if (k == "link_d2h_gbps") {
      raw_.ferry.link_d2h = number(k);
    } else if (k == "metadata" || k == "thread_names" || k == "stream_names") {
      fail("ferry.{}: expected an object, found {}", k, type_name(v.t));
    }
  }

  // A ts or dur: refused in a ferry trace, noted in current_.time_problem (the record is then skipped) in
  // another.
  void time_field(std::string_view k, const scalar& v, std::string_view number_text) {
    auto field = [&] { return fmt::format("{}.{}", event_label(current_), k); };
    const bool ferry = mode_ == mode::ferry;
    std::optional<std::int64_t> ns;
    switch (v.t) {
      case scalar::type::integer:
        if (std::fabs(static_cast<double>(v.i)) <= max_abs_ts_us) ns = v.i * 1000;
        break;
      case scalar::type::big_unsigned: break;
      case scalar::type::floating: ns = us_text_to_ns(number_text, v.d); break;
      default:
        if (ferry) fail("{}: expected a number of microseconds, found {}", field(), type_name(v.t));
        current_.time_problem = fmt::format("{} is not a number", k);
        return;
    }
    if (!ns && !ferry) {
      current_.time_problem = fmt::format("{} is out of range (int64 nanoseconds)", k);
      return;
    }
    if (!ns) {
      const std::string shown = v.t == scalar::type::floating  ? std::string(number_text.substr(0, 40))
                                : v.t == scalar::type::integer ? std::to_string(v.i)
                                                               : std::to_string(v.u);
      fail("{} = {} us is out of range: expected at most {:g} us in magnitude (int64 nanoseconds)", field(),
           shown, max_abs_ts_us);
    }
    if (k == "ts") {
      current_.has_ts = true;
      current_.ts_ns = *ns;
    } else {
      if (*ns < 0) {
        if (!ferry) {
          current_.time_problem = "negative dur";
          return;
        }
        fail("{} = {} us is negative: expected a duration >= 0", field(), static_cast<double>(*ns) / 1000.0);
      }
      current_.has_dur = true;
      current_.dur_ns = *ns;
    }
  }

  enum class mode : std::uint8_t { undecided, ferry, kineto };

  raw_trace raw_;
  read_limits limits_;
  byte_stream& in_;
  const bool ferry_pass_;  // read the events as ferry's whatever comes first
  mode mode_ = mode::undecided;
  bool needs_ferry_pass_ = false;
  bool anything_read_ = false;
  std::vector<frame> stack_;
  raw_event current_;
  std::uint64_t event_count_ = 0;
  bool seen_events_ = false;
  timeline t_;
  event_buffer events_;
  std::optional<ferry_importer> ferry_;
  std::optional<kineto_importer> kineto_;
};

std::optional<timeline> sax_reader::finish() {
  if (needs_ferry_pass_ || (raw_.is_ferry && mode_ == mode::kineto)) return std::nullopt;
  if (!seen_events_)
    fail("no traceEvents array: expected a Chrome trace (a ferry or PyTorch profiler trace)");
  t_.events = events_.take();
  if (ferry_)
    ferry_->finish(raw_);
  else
    kineto_->finish(raw_);
  t_.sort();
  return std::move(t_);
}

// One reading of the input; nullopt when it must be read again as a ferry trace.
std::optional<timeline> read_once(const trace_input& in, const read_limits& limits,
                                  const progress_fn& progress, bool ferry_pass) {
  byte_stream bytes(in, limits, progress);
  sax_reader r(in.origin, limits, bytes, ferry_pass);
  // The smallest event kept, {"ph":"X","ts":0,"dur":0,"cat":"api"} and a comma, is 38 bytes.
  if (in.size != 0 && !bytes.gzip())
    r.reserve_events(std::min<std::uint64_t>(limits.max_events, in.size / 36 + 1));
  const bool complete = nlohmann::json::sax_parse(byte_iterator(&bytes), byte_iterator(), &r);
  if (!complete && !r.needs_ferry_pass())
    throw input_error(fmt::format("{}: the JSON parser stopped early", in.origin));
  return r.finish();
}

// Reads a file with read(2), retrying interrupted calls.
class file_reader {
 public:
  explicit file_reader(const std::filesystem::path& path) : path_(path.string()) {
    fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0)
      throw input_error(
          fmt::format("{}: cannot open for reading: {}", path_, std::generic_category().message(errno)));
  }
  file_reader(const file_reader&) = delete;
  file_reader& operator=(const file_reader&) = delete;
  ~file_reader() {
    if (fd_ >= 0) ::close(fd_);
  }
  std::size_t read(char* buf, std::size_t capacity) {
    while (true) {
      const ssize_t n = ::read(fd_, buf, capacity);
      if (n >= 0) return static_cast<std::size_t>(n);
      if (errno != EINTR)
        throw input_error(fmt::format("{}: read failed: {}", path_, std::generic_category().message(errno)));
    }
  }

 private:
  std::string path_;
  int fd_ = -1;
};

}  // namespace
}  // namespace detail

timeline read_trace(const trace_input& in, const read_limits& limits, const progress_fn& progress) {
  if (in.size > limits.max_bytes)
    throw input_error(fmt::format("{}: {} bytes is more than read_limits::max_bytes ({} bytes)", in.origin,
                                  in.size, limits.max_bytes));
  if (auto t = detail::read_once(in, limits, progress, false)) return std::move(*t);
  auto t = detail::read_once(in, limits, progress, true);
  if (!t) throw input_error(fmt::format("{}: the \"ferry\" object could not be read", in.origin));
  return std::move(*t);
}

timeline parse_trace(std::string_view text, std::string_view origin, const read_limits& limits) {
  trace_input in;
  in.origin = origin;
  in.size = text.size();
  in.open = [text] {
    return [text, at = std::size_t{0}](char* buf, std::size_t capacity) mutable {
      const std::size_t n = std::min(capacity, text.size() - at);
      std::copy_n(text.data() + at, n, buf);
      at += n;
      return n;
    };
  };
  return read_trace(in, limits);
}

timeline read_trace(const std::filesystem::path& path, const read_limits& limits,
                    const progress_fn& progress) {
  std::error_code ec;
  const auto status = std::filesystem::status(path, ec);
  if (ec || !std::filesystem::exists(status))
    throw input_error(fmt::format("{}: cannot open: {}", path.string(), ec ? ec.message() : "no such file"));
  if (!std::filesystem::is_regular_file(status))
    throw input_error(fmt::format("{}: cannot read: not a regular file", path.string()));
  const std::uintmax_t size = std::filesystem::file_size(path, ec);
  if (ec) throw input_error(fmt::format("{}: cannot read its size: {}", path.string(), ec.message()));
  trace_input in;
  in.origin = path.string();
  in.size = size;
  in.open = [path] {
    auto file = std::make_shared<detail::file_reader>(path);
    return [file](char* buf, std::size_t capacity) { return file->read(buf, capacity); };
  };
  // A file that grows while it is read is read to its end: the byte_stream keeps max_bytes.
  return read_trace(in, limits, progress);
}

}  // namespace ferry::trace
