// libFuzzer target for the trace reader and the analyzer together (the fuzz preset builds it,
// tests/fuzz/CMakeLists.txt; scripts/fuzz.sh analyze runs it).
//
// Property: for any bytes (plain JSON or gzip), parse_trace returns a timeline or throws
// ferry::input_error, and whatever timeline it returns, analyze() returns an analysis or throws
// input_error (no GPU activity to analyze), and the analysis formats as text and JSON. Anything else (another
// exception, a crash, a sanitizer report, a hang, a huge allocation) is a finding.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "ferry/analyze/analyze.hpp"
#include "ferry/core/error.hpp"
#include "ferry/trace/trace_io.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  ferry::trace::read_limits limits;
  limits.max_bytes = 1 << 20;
  limits.max_events = 4096;
  limits.max_depth = 32;
  ferry::trace::timeline t;
  try {
    t = ferry::trace::parse_trace(text, "fuzz", limits);
  } catch (const ferry::input_error&) {
    return 0;  // refused cleanly
  }
  ferry::trace::analysis a;
  try {
    a = ferry::trace::analyze(t);
  } catch (const ferry::input_error&) {
    return 0;  // nothing to analyze, said cleanly
  }
  const std::string text_out = ferry::trace::format_text(a);
  const std::string json_out = ferry::trace::to_json(a);
  if (text_out.empty() || json_out.empty()) __builtin_trap();
  return 0;
}
