// PyTorch profiler (Kineto) traces, and other Chrome traces with CUPTI's categories: which processes are
// GPUs, the runtime call behind each GPU activity (by correlation id), and each event's kind, copy
// direction and memory kinds from Kineto's names ("Memcpy HtoD (Pageable -> Device)").
//
// ferry did not write these files, so one odd record does not refuse the file: a field ferry needs with a
// value it cannot use skips that record, counted in timeline::skipped under a fixed reason (never the
// value, so a hostile file cannot grow the map). Values with a known meaning are mapped instead: Kineto
// writes `"stream": -1` on sync records that wait on no stream, and -1 for "no correlation".
#include <algorithm>
#include <cctype>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "raw_trace.hpp"

namespace ferry::trace::detail {

namespace {

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

// What a category makes of a record. Older PyTorch (1.8 to 1.10) wrote "Kernel", "Memcpy", "Memset",
// "Runtime", "Operator" and "Python"; "User" (1.8) and gpu_user_annotation are annotations mirrored on
// GPU tracks, which the CPU-side record already gives.
enum class kcat : std::uint8_t { other, kernel, memcpy, memset, runtime, sync, annotation, op };

bool iequals(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) == std::tolower(static_cast<unsigned char>(y));
         });
}

kcat category(std::string_view cat) {
  struct entry {
    std::string_view name;
    kcat c;
  };
  static constexpr entry table[] = {
      {"kernel", kcat::kernel},       {"gpu_memcpy", kcat::memcpy},
      {"memcpy", kcat::memcpy},       {"gpu_memset", kcat::memset},
      {"memset", kcat::memset},       {"cuda_runtime", kcat::runtime},
      {"cuda_driver", kcat::runtime}, {"runtime", kcat::runtime},
      {"cuda_sync", kcat::sync},      {"user_annotation", kcat::annotation},
      {"cpu_op", kcat::op},           {"operator", kcat::op},
      {"python_function", kcat::op},  {"python", kcat::op},
  };
  // Every event asks: the spellings as Kineto writes them first, then any case.
  for (const entry& e : table)
    if (cat == e.name) return e.c;
  for (const entry& e : table)
    if (iequals(cat, e.name)) return e.c;
  return kcat::other;
}

// The category as reasons name it (fixed text, whatever the spelling in the file).
std::string_view category_name(kcat c) {
  switch (c) {
    case kcat::kernel: return "kernel";
    case kcat::memcpy: return "gpu_memcpy";
    case kcat::memset: return "gpu_memset";
    case kcat::runtime: return "cuda_runtime";
    case kcat::sync: return "cuda_sync";
    case kcat::annotation: return "user_annotation";
    case kcat::op: return "cpu_op";
    case kcat::other: break;
  }
  return "other";
}

enum class got : std::uint8_t { absent, ok, bad };

// A non-negative integer field.
got read_u64(const scalar& v, std::uint64_t& out) {
  if (v.t == scalar::type::absent) return got::absent;
  if (v.t == scalar::type::integer && v.i >= 0) {
    out = static_cast<std::uint64_t>(v.i);
    return got::ok;
  }
  if (v.t == scalar::type::big_unsigned) {
    out = v.u;
    return got::ok;
  }
  return got::bad;
}

// A device ordinal, -1 for none.
got read_device(const scalar& v, std::int32_t& out) {
  if (v.t == scalar::type::absent) return got::absent;
  if (v.t == scalar::type::integer && v.i >= -1 && v.i <= std::numeric_limits<std::int32_t>::max()) {
    out = static_cast<std::int32_t>(v.i);
    return got::ok;
  }
  return got::bad;
}

std::optional<std::int64_t> pid_of(const raw_trace& raw, const raw_event& r) {
  const scalar& v = r.f[s_pid];
  if (v.t == scalar::type::integer) return v.i;
  if (const auto id = raw.numeric_id(v);
      id && *id <= static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))
    return static_cast<std::int64_t>(*id);
  return std::nullopt;
}

}  // namespace

kineto_importer::kineto_importer(timeline& t)
    : t_(t), pytorch_(t.strings.intern("pytorch")), pytorch_op_(t.strings.intern("pytorch.op")) {}

void kineto_importer::add_metadata(const raw_trace& raw, const raw_event& r) {
  const auto pid = pid_of(raw, r);
  if (!pid || r.f[s_name].t != scalar::type::string) return;
  const std::string_view name = raw.text(r.f[s_name]);
  if (name == "process_labels") {
    if (r.f[a_labels].t == scalar::type::string && raw.text(r.f[a_labels]).starts_with("GPU"))
      gpu_pids_.insert(*pid);
  } else if (name == "thread_name") {
    const auto tid = raw.numeric_id(r.f[s_tid]);
    if (tid && r.f[a_name].t == scalar::type::string) {
      std::string text(raw.text(r.f[a_name]));
      while (!text.empty() && text.back() == ' ') text.pop_back();  // Kineto writes "stream 7 "
      track_names_[{*pid, *tid}] = std::move(text);
    }
  }
}

void kineto_importer::add(const raw_trace& raw, const raw_event& r, event_buffer& out) {
  const scalar& cat_v = r.f[s_cat];
  if (cat_v.t == scalar::type::absent) return;
  if (cat_v.t != scalar::type::string) return skip("a record whose cat is not a string");
  const kcat c = category(raw.text(cat_v));
  if (c == kcat::other) return;  // "Trace" spans, gpu_user_annotation, ...: nothing ferry uses
  const std::string_view cname = category_name(c);
  auto skip_for = [&](std::string_view why) { skip(fmt::format("{} record: {}", cname, why)); };
  if (!r.time_problem.empty()) return skip_for(r.time_problem);
  std::string_view name;
  if (r.f[s_name].t == scalar::type::string)
    name = raw.text(r.f[s_name]);
  else if (r.f[s_name].t != scalar::type::absent)
    return skip_for("name is not a string");

  event e;
  e.start_ns = r.ts_ns;
  e.end_ns = r.ts_ns + r.dur_ns;
  // Kineto writes -1 for "no correlation".
  if (const scalar& v = r.f[a_correlation]; !(v.t == scalar::type::integer && v.i < 0))
    if (read_u64(v, e.correlation) == got::bad) return skip_for("args.correlation is not an integer");
  const auto pid = pid_of(raw, r);
  const bool gpu = c == kcat::kernel || c == kcat::memcpy || c == kcat::memset;
  if (gpu) {
    e.kind = c == kcat::kernel ? activity::kernel : c == kcat::memcpy ? activity::memcpy : activity::memset;
    if (pid) gpu_pids_.insert(*pid);
    if (r.f[a_stream].t != scalar::type::absent) {
      if (read_u64(r.f[a_stream], e.stream) != got::ok)
        return skip_for("args.stream is not a stream id (a non-negative integer)");
    } else if (const auto id = raw.numeric_id(r.f[s_tid])) {
      e.stream = *id;
    } else {
      return;  // not on a stream track
    }
    const got dev = read_device(r.f[a_device], e.device);
    if (dev == got::bad) return skip_for("args.device is not a device ordinal");
    if (dev == got::absent && pid && *pid >= 0 && *pid <= std::numeric_limits<std::int32_t>::max())
      e.device = static_cast<std::int32_t>(*pid);
    if (e.kind != activity::kernel && read_u64(r.f[a_bytes], e.bytes) == got::bad)
      return skip_for("args.bytes is not a byte count (a non-negative integer)");
    if (e.kind == activity::memcpy) {
      parse_kineto_copy(name, e);
      // Whether the copy was asynchronous is the launching call's business (finish() looks it up).
      if (e.correlation != 0) copies_.push_back(out.size());
    } else if (e.kind == activity::memset) {
      if (const auto open = name.find('('); open != std::string_view::npos) {
        const auto close = name.find(')', open);
        if (close != std::string_view::npos) e.dst = kineto_mem(name.substr(open + 1, close - open - 1));
      }
    }
  } else {
    const std::optional<std::uint64_t> thread = raw.numeric_id(r.f[s_tid]);
    switch (c) {
      case kcat::runtime:
        e.kind = activity::api;
        e.sync = api_sync(name);
        if (!thread) {
          // A call on a named track: not a thread's activity, but it still says how it copied.
          if (e.correlation != 0) trackless_calls_.emplace_back(e.correlation, t_.strings.intern(name));
          return;
        }
        break;
      case kcat::sync: {
        e.kind = activity::sync;
        e.sync = kineto_sync(name);
        // Kineto writes "stream": -1 on records that wait on no one stream (Event Sync, Context Sync).
        if (const scalar& v = r.f[a_stream]; !(v.t == scalar::type::integer && v.i == -1))
          if (read_u64(v, e.stream) == got::bad) return skip_for("args.stream is not a stream id");
        if (read_device(r.f[a_device], e.device) == got::bad)
          return skip_for("args.device is not a device ordinal");
        // CUPTI's sync records sit on the GPU's tracks; the thread that waited made the matching call.
        if (!thread && e.correlation == 0)
          return skip_for("no thread and no correlation with a runtime call");
        syncs_.push_back(out.size());
        sync_has_thread_.push_back(thread.has_value());
        break;
      }
      case kcat::annotation:
        e.kind = activity::range;
        e.domain = pytorch_;
        break;
      default:
        e.kind = activity::range;
        e.domain = pytorch_op_;
        break;
    }
    if (c != kcat::sync && !thread) return;  // a named track such as "Spans"
    e.thread = thread.value_or(0);
  }
  e.name = t_.strings.intern(name);
  out.push_back(e);
}

void kineto_importer::finish(raw_trace& raw) {
  t_.source = raw.kineto ? "pytorch profiler (Kineto)" : "chrome trace";
  t_.device_name = std::move(raw.kineto_device_name);
  for (auto& [track, name] : track_names_) {
    const bool gpu = gpu_pids_.contains(track.first);
    (gpu ? t_.stream_names : t_.thread_names)[track.second] = std::move(name);
    if (!gpu && track.first >= 0)
      t_.thread_processes.emplace(track.second, static_cast<std::uint64_t>(track.first));
  }

  // The runtime call behind each correlation id that a copy or a sync record needs.
  std::vector<std::uint64_t> wanted;
  for (const std::size_t i : copies_) wanted.push_back(t_.events[i].correlation);
  for (const std::size_t i : syncs_)
    if (t_.events[i].correlation != 0) wanted.push_back(t_.events[i].correlation);
  std::sort(wanted.begin(), wanted.end());
  wanted.erase(std::unique(wanted.begin(), wanted.end()), wanted.end());
  struct call {
    std::uint32_t name = 0;
    bool found = false;
    bool has_thread = false;
    std::uint64_t thread = 0;
  };
  std::vector<call> calls(wanted.size());
  auto slot_of = [&](std::uint64_t corr) -> call* {
    const auto it = std::lower_bound(wanted.begin(), wanted.end(), corr);
    return it != wanted.end() && *it == corr ? &calls[static_cast<std::size_t>(it - wanted.begin())]
                                             : nullptr;
  };
  if (!wanted.empty()) {
    for (const auto& [corr, name] : trackless_calls_)
      if (call* c = slot_of(corr)) *c = call{name, true, false, 0};
    for (const event& e : t_.events)
      if (e.kind == activity::api && e.correlation != 0)
        if (call* c = slot_of(e.correlation)) *c = call{e.name, true, true, e.thread};
  }
  for (const std::size_t i : copies_) {
    event& e = t_.events[i];
    if (const call* c = slot_of(e.correlation); c != nullptr && c->found)
      e.async = t_.strings[c->name].find("Async") != std::string_view::npos;
  }
  std::vector<std::size_t> drop;
  for (std::size_t k = 0; k < syncs_.size(); ++k) {
    event& e = t_.events[syncs_[k]];
    const call* c = e.correlation != 0 ? slot_of(e.correlation) : nullptr;
    if (c != nullptr && c->found && c->has_thread) {
      e.thread = c->thread;
    } else if (!sync_has_thread_[k]) {
      drop.push_back(syncs_[k]);
      skip(
          "cuda_sync record: no thread (its track is not a thread, and no runtime call has its correlation)");
    }
  }
  if (!drop.empty()) {
    std::size_t out = 0;
    std::size_t d = 0;
    for (std::size_t i = 0; i < t_.events.size(); ++i) {
      if (d < drop.size() && drop[d] == i) {
        ++d;
        continue;
      }
      t_.events[out++] = t_.events[i];
    }
    t_.events.resize(out);
  }
}

}  // namespace ferry::trace::detail
