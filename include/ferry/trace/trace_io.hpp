// Reading and writing timelines as Chrome trace JSON (the format chrome://tracing and Perfetto UI load).
//
// ferry writes one track per GPU stream (process "GPU <device>") and one per CPU thread (process
// "CPU"); kernels, copies and memsets carry distinct categories and colours, and every event keeps
// ferry's fields in "args", so a written trace reads back into the same timeline. ferry also reads
// PyTorch profiler (Kineto) traces: `torch.profiler.profile(...).export_chrome_trace(path)`.
//
// Host only.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>

#include "ferry/trace/timeline.hpp"

namespace ferry::trace {

/// Limits on what a reader accepts; inputs beyond them are refused with input_error, never read in part.
struct read_limits {
  std::uint64_t max_bytes = std::uint64_t{2} << 30;   // file size
  std::uint64_t max_events = std::uint64_t{1} << 24;  // entries of traceEvents (flows, metadata included)
  std::size_t max_depth = 64;                         // JSON nesting
};

/// Chrome trace JSON of `t`.
[[nodiscard]] std::string to_chrome_json(const timeline& t);
/// Writes to_chrome_json(t) to `path` (replacing it) whole: under a temporary name in the same directory,
/// renamed once flushed, so `path` never holds a partial trace. Throws std::system_error naming the path
/// (and then leaves no temporary).
void write_chrome_trace(const timeline& t, const std::filesystem::path& path);

/// Parses a ferry Chrome trace or a PyTorch profiler (Kineto) trace; `origin` names the input in
/// errors. Malformed, truncated, or over-limit input throws input_error naming origin, the position or
/// field, and the limit or expected form.
[[nodiscard]] timeline parse_trace(std::string_view text, std::string_view origin,
                                   const read_limits& limits = {});
/// Reads and parses the file at `path`; also throws input_error when it cannot be opened or is too big.
[[nodiscard]] timeline read_trace(const std::filesystem::path& path, const read_limits& limits = {});

}  // namespace ferry::trace
