// PyTorch profiler (Kineto) traces, and other Chrome traces with CUPTI's categories: which processes are
// GPUs, the runtime call behind each GPU activity (by correlation id), and each event's kind, copy
// direction and memory kinds from Kineto's names ("Memcpy HtoD (Pageable -> Device)").
#include <cstdint>
#include <limits>
#include <optional>
#include <set>
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

}  // namespace

timeline import_kineto(raw_trace& raw) {
  timeline t;
  t.source = raw.kineto ? "pytorch profiler (Kineto)" : "chrome trace";
  t.device_name = std::move(raw.kineto_device_name);

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
    if (const auto id = raw.numeric_id(v);
        id && *id <= static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))
      return static_cast<std::int64_t>(*id);
    return std::nullopt;
  };
  for (const raw_event& r : raw.events) {
    const std::string_view ph = raw.strings[r.f[s_ph].s];
    const std::string_view name = r.f[s_name].t == scalar::type::string ? raw.strings[r.f[s_name].s] : "";
    const auto pid = pid_of(r);
    if (ph == "M") {
      if (!pid) continue;
      if (name == "process_labels") {
        const auto labels = raw.get_string(r, a_labels);
        if (labels && labels->starts_with("GPU")) gpu_pids.insert(*pid);
      } else if (name == "thread_name") {
        const auto tid = raw.numeric_id(r.f[s_tid]);
        const auto text = raw.get_string(r, a_name);
        if (tid && text) track_names.push_back({*pid, *tid, std::string(*text)});
      }
      continue;
    }
    const std::string_view cat = r.f[s_cat].t == scalar::type::string ? raw.strings[r.f[s_cat].s] : "";
    if (cat == "kernel" || cat == "gpu_memcpy" || cat == "gpu_memset") {
      if (pid) gpu_pids.insert(*pid);
    } else if (cat == "cuda_runtime" || cat == "cuda_driver") {
      if (const auto corr = raw.get_u64(r, a_correlation); corr && *corr != 0)
        launches[*corr] = launch{name, raw.numeric_id(r.f[s_tid])};
    }
  }
  for (named_track& n : track_names) {
    while (!n.name.empty() && n.name.back() == ' ') n.name.pop_back();  // Kineto writes "stream 7 "
    (gpu_pids.count(n.pid) != 0 ? t.stream_names : t.thread_names)[n.tid] = std::move(n.name);
  }

  // Pass 2: the events.
  const std::uint32_t pytorch = t.strings.intern("pytorch");
  const std::uint32_t pytorch_op = t.strings.intern("pytorch.op");
  std::uint64_t last_thread = 0;  // the thread whose process was looked up last (events come in runs)
  for (const raw_event& r : raw.events) {
    if (raw.strings[r.f[s_ph].s] != "X") continue;
    const auto cat = raw.get_string(r, s_cat);
    if (!cat) continue;
    const std::string_view name = raw.get_string(r, s_name).value_or("");
    event e;
    e.start_ns = r.ts_ns;
    e.end_ns = r.ts_ns + r.dur_ns;
    e.correlation = raw.get_u64(r, a_correlation).value_or(0);
    const bool gpu = *cat == "kernel" || *cat == "gpu_memcpy" || *cat == "gpu_memset";
    if (gpu) {
      e.kind = *cat == "kernel"       ? activity::kernel
               : *cat == "gpu_memcpy" ? activity::memcpy
                                      : activity::memset;
      const auto stream =
          r.f[a_stream].t != scalar::type::absent ? raw.get_u64(r, a_stream) : raw.numeric_id(r.f[s_tid]);
      if (!stream) continue;  // not on a stream track
      e.stream = *stream;
      if (const auto d = raw.get_device(r, a_device))
        e.device = *d;
      else if (const auto pid = pid_of(r);
               pid && *pid >= 0 && *pid <= std::numeric_limits<std::int32_t>::max())
        e.device = static_cast<std::int32_t>(*pid);
      if (e.kind != activity::kernel) e.bytes = raw.get_u64(r, a_bytes).value_or(0);
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
        if (const auto s = raw.get_u64(r, a_stream)) e.stream = *s;
        e.device = raw.get_device(r, a_device).value_or(-1);
      } else if (*cat == "user_annotation") {
        e.kind = activity::range;
        e.domain = pytorch;
      } else if (*cat == "cpu_op" || *cat == "python_function") {
        e.kind = activity::range;
        e.domain = pytorch_op;
      } else {
        continue;  // gpu_user_annotation duplicates annotations on GPU tracks; others ferry does not use
      }
      std::optional<std::uint64_t> thread = raw.numeric_id(r.f[s_tid]);
      // CUPTI's sync records sit on the GPU's tracks; the thread that waited made the matching call.
      if (e.kind == activity::sync)
        if (const auto it = launches.find(e.correlation);
            e.correlation != 0 && it != launches.end() && it->second.thread)
          thread = it->second.thread;
      if (!thread) continue;  // a named track such as "Spans"
      e.thread = *thread;
      if (e.kind != activity::sync && *thread != last_thread) {
        last_thread = *thread;
        if (const auto pid = pid_of(r); pid && *pid >= 0)
          t.thread_processes.emplace(*thread, static_cast<std::uint64_t>(*pid));
      }
    }
    e.name = t.strings.intern(name);
    t.events.push_back(e);
  }
  return t;
}

}  // namespace ferry::trace::detail
