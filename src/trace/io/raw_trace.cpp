// raw_trace's typed accessors: every field an importer reads is checked here, so both importers refuse
// a wrong type with the same message.
#include "raw_trace.hpp"

#include <charconv>
#include <limits>
#include <system_error>
#include <unordered_map>

namespace ferry::trace::detail {

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

std::string raw_trace::event_label(const raw_event& e) const {
  return fmt::format("traceEvents[{}]", e.index);
}

std::optional<std::string_view> raw_trace::get_string(const raw_event& e, slot s) const {
  const scalar& v = e.f[s];
  if (v.t == scalar::type::absent) return std::nullopt;
  if (v.t != scalar::type::string)
    fail("{}.{}: expected a string, found {}", event_label(e), slot_names[s], type_name(v.t));
  return texts[v.s];
}

std::optional<std::uint64_t> raw_trace::get_u64(const raw_event& e, slot s) const {
  const scalar& v = e.f[s];
  if (v.t == scalar::type::absent) return std::nullopt;
  if (v.t == scalar::type::integer && v.i >= 0) return static_cast<std::uint64_t>(v.i);
  if (v.t == scalar::type::big_unsigned) return v.u;
  fail("{}.{}: expected a non-negative integer, found {}", event_label(e), slot_names[s],
       v.t == scalar::type::integer ? std::to_string(v.i) : std::string(type_name(v.t)));
}

std::optional<std::int32_t> raw_trace::get_device(const raw_event& e, slot s) const {
  const scalar& v = e.f[s];
  if (v.t == scalar::type::absent) return std::nullopt;
  if (v.t == scalar::type::integer && v.i >= -1 && v.i <= std::numeric_limits<std::int32_t>::max())
    return static_cast<std::int32_t>(v.i);
  fail("{}.{}: expected a device ordinal (an integer from -1 to {}), found {}", event_label(e), slot_names[s],
       std::numeric_limits<std::int32_t>::max(),
       v.t == scalar::type::integer ? std::to_string(v.i) : std::string(type_name(v.t)));
}

std::optional<bool> raw_trace::get_bool(const raw_event& e, slot s) const {
  const scalar& v = e.f[s];
  if (v.t == scalar::type::absent) return std::nullopt;
  if (v.t != scalar::type::boolean)
    fail("{}.{}: expected true or false, found {}", event_label(e), slot_names[s], type_name(v.t));
  return v.b;
}

std::optional<std::uint64_t> raw_trace::numeric_id(const scalar& v) const {
  if (v.t == scalar::type::integer)
    return v.i >= 0 ? std::optional<std::uint64_t>(static_cast<std::uint64_t>(v.i)) : std::nullopt;
  if (v.t == scalar::type::big_unsigned) return v.u;
  if (v.t != scalar::type::string) return std::nullopt;
  std::string_view text = texts[v.s];
  if (text.starts_with("stream ")) text.remove_prefix(7);
  while (!text.empty() && text.back() == ' ') text.remove_suffix(1);
  std::uint64_t id = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), id);
  if (text.empty() || ec != std::errc{} || end != text.data() + text.size()) return std::nullopt;
  return id;
}

}  // namespace ferry::trace::detail
