#include "ferry/device/capture.hpp"

#include <exception>
#include <string>

#include "ferry/core/error.hpp"
#include "ferry/device/device.hpp"
#include "ferry/trace/range.hpp"

namespace ferry::trace {

capture_window::capture_window(device& dev, std::uint64_t warmup, std::uint64_t steps)
    : capture_window([&dev] { dev.profiler_start(); }, [&dev] { dev.profiler_stop(); }, warmup, steps) {}

capture_window::capture_window(std::function<void()> start, std::function<void()> stop, std::uint64_t warmup,
                               std::uint64_t steps)
    : start_(std::move(start)), stop_(std::move(stop)), warmup_(warmup), steps_(steps) {
  FERRY_EXPECTS(steps_ > 0, "capture window of 0 steps would capture nothing; ask for at least 1 step");
  FERRY_EXPECTS(start_ && stop_, "capture window needs both a start and a stop function");
}

capture_window::~capture_window() {
  if (!open_) return;
  try {
    stop_();
  } catch (const std::exception& e) {
    detail::report_destructor_error(std::string("capture window stop failed: ") + e.what(),
                                    std::source_location::current());
  }
}

void capture_window::step() {
  if (open_ && seen_ == warmup_ + steps_) {
    stop_();
    open_ = false;
    closed_ = true;
    mark("ferry.capture.stop", color::red);
  }
  if (!open_ && !closed_ && seen_ == warmup_) {
    mark("ferry.capture.start", color::red);
    start_();
    open_ = true;
  }
  ++seen_;
}

}  // namespace ferry::trace
