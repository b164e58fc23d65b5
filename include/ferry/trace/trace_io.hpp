// Reading and writing timelines as Chrome trace JSON (the format chrome://tracing and Perfetto UI load).
//
// ferry writes one track per GPU stream (process "GPU <device>") and one per CPU thread (process
// "CPU"); kernels, copies and memsets carry distinct categories and colours, and every event keeps
// ferry's fields in "args", so a written trace reads back into the same timeline. ferry also reads
// PyTorch profiler (Kineto) traces: `torch.profiler.profile(...).export_chrome_trace(path)`, and the
// `.json.gz` files `tensorboard_trace_handler` writes (gzip is recognised by its magic bytes, not by name).
//
// Reading streams: the input is parsed in chunks as it is read (or inflated), each event is reduced to
// ferry's 72-byte event as it goes by, and nothing else of the text is kept, so memory grows with the
// number of events ferry keeps, not with the size of the file.
//
// Host only.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <string_view>

#include "ferry/core/progress.hpp"
#include "ferry/trace/timeline.hpp"

namespace ferry::trace {

/// Limits on what a reader accepts; inputs beyond them are refused with input_error, never read in part.
struct read_limits {
  std::uint64_t max_bytes = std::uint64_t{2} << 30;   // JSON text: the file, and a gzip file inflated
  std::uint64_t max_events = std::uint64_t{1} << 24;  // entries of traceEvents (flows, metadata included)
  std::size_t max_depth = 64;                         // JSON nesting
};

/// Chrome trace JSON of `t`.
[[nodiscard]] std::string to_chrome_json(const timeline& t);
/// Writes to_chrome_json(t) to `path` (replacing it) whole: under a temporary name in the same directory,
/// renamed once flushed, so `path` never holds a partial trace. Throws std::system_error naming the path
/// (and then leaves no temporary).
void write_chrome_trace(const timeline& t, const std::filesystem::path& path);

/// Fills up to `capacity` bytes at `buf` with the input's next bytes and returns how many; 0 at its end.
/// May throw (input_error for a read error, naming the input).
using trace_reader = std::function<std::size_t(char* buf, std::size_t capacity)>;

/// A trace to read as a stream of bytes (plain JSON, or gzip).
struct trace_input {
  std::string origin;      // names the input in errors and progress lines
  std::uint64_t size = 0;  // bytes its readers deliver, when known (progress, error offsets); 0 = unknown
  // A reader from the input's first byte. Called once, or twice for a ferry trace whose top-level
  // "ferry" object follows its traceEvents (the events are then read again as ferry's).
  std::function<trace_reader()> open;
};

/// Parses a ferry Chrome trace or a PyTorch profiler (Kineto) trace, plain or gzip. Malformed,
/// truncated, or over-limit input (the inflated size of gzip input included) throws input_error naming
/// the input, the position or field, and the limit or expected form. In a trace ferry did not write,
/// a record with an odd field (`"stream": -1` on a kernel, a negative duration) is skipped and counted in
/// timeline::skipped instead; in a ferry trace it is refused. `progress`, when set, receives a line
/// (bytes read of the total, events) about every second once reading has taken 2 s.
[[nodiscard]] timeline read_trace(const trace_input& in, const read_limits& limits = {},
                                  const progress_fn& progress = {});
/// read_trace of the bytes of `text`; `origin` names them in errors.
[[nodiscard]] timeline parse_trace(std::string_view text, std::string_view origin,
                                   const read_limits& limits = {});
/// read_trace of the file at `path`; also throws input_error when it cannot be opened or read, or is
/// bigger than limits.max_bytes (before reading it).
[[nodiscard]] timeline read_trace(const std::filesystem::path& path, const read_limits& limits = {},
                                  const progress_fn& progress = {});

}  // namespace ferry::trace
