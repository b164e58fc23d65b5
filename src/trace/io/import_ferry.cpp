// ferry's own traces: every field of an event is in its "args" (chrome_writer.cpp), and the track names
// and the trace's header are in the top-level "ferry" object; the "M" events only serve the viewers.
#include <string_view>
#include <utility>

#include "raw_trace.hpp"

namespace ferry::trace::detail {

void ferry_importer::add(const raw_trace& raw, const raw_event& r, event_buffer& out) {
  event e;
  const auto kind_text = raw.get_string(r, a_kind);
  const auto cat_text = raw.get_string(r, s_cat);
  if (!kind_text && !cat_text)
    raw.fail("{}: no args.kind and no cat: expected one of ferry's activities", raw.event_label(r));
  e.kind = raw.get_word(r, kind_text ? a_kind : s_cat, activity::kernel, parse_activity);
  e.start_ns = r.ts_ns;
  e.end_ns = r.ts_ns + r.dur_ns;  // checked for overflow when read
  const bool anonymous = raw.get_bool(r, a_anonymous).value_or(false);
  const auto name = raw.get_string(r, s_name);
  e.name = anonymous || !name ? 0 : t_.strings.intern(*name);
  if (const auto d = raw.get_string(r, a_domain)) e.domain = t_.strings.intern(*d);
  e.device = raw.get_device(r, a_device).value_or(-1);
  e.stream = raw.get_u64(r, a_stream).value_or(0);
  e.thread = raw.get_u64(r, a_thread).value_or(0);
  e.correlation = raw.get_u64(r, a_correlation).value_or(0);
  e.bytes = raw.get_u64(r, a_bytes).value_or(0);
  e.copy = raw.get_word(r, a_copy, copy_kind::none, parse_copy_kind);
  e.src = raw.get_word(r, a_src, mem_kind::unknown, parse_mem_kind);
  e.dst = raw.get_word(r, a_dst, mem_kind::unknown, parse_mem_kind);
  e.sync = raw.get_word(r, a_sync, sync_kind::none, parse_sync_kind);
  e.async = raw.get_bool(r, a_async).value_or(false);
  out.push_back(e);
}

void ferry_importer::finish(raw_trace& raw) {
  t_.source = std::move(raw.ferry.source);
  t_.device_name = std::move(raw.ferry.device_name);
  t_.dropped = raw.ferry.dropped;
  t_.link_h2d_gbps = raw.ferry.link_h2d;
  t_.link_d2h_gbps = raw.ferry.link_d2h;
  t_.metadata = std::move(raw.ferry.metadata);
  t_.thread_names = std::move(raw.ferry.thread_names);
  t_.stream_names = std::move(raw.ferry.stream_names);
}

}  // namespace ferry::trace::detail
