// libFuzzer target for the trace reader (the fuzz preset builds it, tests/fuzz/CMakeLists.txt;
// scripts/fuzz.sh runs it).
//
// Property: for any bytes, parse_trace returns a timeline or throws ferry::input_error; anything else
// (another exception, a crash, a sanitizer report, a hang, a huge allocation) is a finding. A timeline it
// returns must also write back as Chrome JSON and read back equal. The same bytes go to the reader of
// `ferry trace`'s process files (parse_process_file), whose events must write back as the same lines.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "ferry/core/error.hpp"
#include "ferry/trace/process_trace.hpp"
#include "ferry/trace/trace_io.hpp"
#include "trace/timeline_compare.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  ferry::trace::read_limits limits;
  limits.max_bytes = 1 << 20;
  limits.max_events = 4096;
  limits.max_depth = 32;
  try {
    const ferry::trace::process_file f = ferry::trace::parse_process_file(text, "fuzz", limits);
    ferry::trace::process_file_writer w;
    std::string lines = ferry::trace::format_process_header(f.header);
    w.append(f.events, lines);
    const ferry::trace::process_file back = ferry::trace::parse_process_file(lines, "rewritten", limits);
    if (back.events.events.size() != f.events.events.size()) {
      std::fprintf(stderr, "process file round trip: %zu events became %zu\n", f.events.events.size(),
                   back.events.events.size());
      std::abort();
    }
  } catch (const ferry::input_error&) {
    // refused cleanly
  }
  ferry::trace::timeline t;
  try {
    t = ferry::trace::parse_trace(text, "fuzz", limits);
  } catch (const ferry::input_error&) {
    return 0;  // refused cleanly
  }
  // Uncaught: an input_error here means ferry wrote JSON it cannot read.
  const ferry::trace::timeline back = ferry::trace::parse_trace(ferry::trace::to_chrome_json(t), "rewritten");
  if (const std::string diff = ferry::test::timeline_difference(t, back); !diff.empty()) {
    std::fprintf(stderr, "round trip changed the timeline: %s\n", diff.c_str());
    std::abort();
  }
  return 0;
}
