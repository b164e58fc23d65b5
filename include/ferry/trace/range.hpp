// NVTX ranges in the "ferry" domain, so that Nsight Systems and other NVTX tools show ferry's stages.
//
//   FERRY_RANGE("egress.copy", ferry::trace::color::green);
//
// opens a range that closes at the end of the enclosing scope. The range is also a stage span of ferry's
// own timeline when a trace::recorder is recording (see timeline.hpp). Without an NVTX tool attached and
// no recorder a range costs two function calls and an atomic load. Build with -DFERRY_WITH_NVTX=OFF to
// leave NVTX out; the stage spans stay.
#pragma once

#include <cstdint>

#include "ferry/trace/timeline.hpp"

#ifndef FERRY_NVTX
#define FERRY_NVTX 0
#endif

namespace ferry::trace {

/// ARGB colours for ranges; a stage keeps its colour across tools and runs.
enum class color : std::uint32_t {
  gray = 0xFF9E9E9Eu,
  green = 0xFF4CAF50u,
  blue = 0xFF2196F3u,
  orange = 0xFFFF9800u,
  red = 0xFFF44336u,
  purple = 0xFF9C27B0u,
  yellow = 0xFFFFEB3Bu,
  cyan = 0xFF00BCD4u,
};

/// True when ferry was built with NVTX ranges (FERRY_WITH_NVTX=ON and the NVTX3 headers found).
[[nodiscard]] constexpr bool nvtx_enabled() noexcept { return FERRY_NVTX != 0; }

/// Pushes a range named `name` (a string that outlives the range, e.g. a literal) in the ferry domain.
void push_range(const char* name, color c) noexcept;
/// Pops the innermost range of the calling thread in the ferry domain.
void pop_range() noexcept;
/// Marks an instant event in the ferry domain.
void mark(const char* name, color c) noexcept;

/// An NVTX range, and a stage span of the current recorder, open for the lifetime of the object. Prefer
/// the FERRY_RANGE macro.
class scoped_range {
 public:
  scoped_range(const char* name, color c) noexcept : name_(name) {
    push_range(name, c);
    if (current_recorder() != nullptr) start_ns_ = now_ns();
  }
  scoped_range(const scoped_range&) = delete;
  scoped_range& operator=(const scoped_range&) = delete;
  ~scoped_range() {
    pop_range();
    if (start_ns_ != 0) record_stage(name_, start_ns_);
  }

 private:
  const char* name_;
  std::int64_t start_ns_ = 0;
};

}  // namespace ferry::trace

#define FERRY_TRACE_CONCAT_INNER(a, b) a##b
#define FERRY_TRACE_CONCAT(a, b) FERRY_TRACE_CONCAT_INNER(a, b)

/// Opens an NVTX range in the "ferry" domain (and a stage span) until the end of the enclosing scope.
#define FERRY_RANGE(name, c) \
  const ::ferry::trace::scoped_range FERRY_TRACE_CONCAT(ferry_range_, __LINE__) { (name), (c) }
