// What the C ABI's translation units share: the structs behind the opaque handles, and guard(), which
// turns every exception into a status and the thread's last error message.
#pragma once

#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>

#include <fmt/format.h>

#include "ferry/c/ferry.h"
#include "ferry/core/error.hpp"
#include "ferry/device/device.hpp"

namespace ferry::c_api {

/// A callback sink's function returned non-zero: FERRY_ERROR_CALLBACK, whenever the pipeline rethrows it.
class callback_failed : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// A device and what bridging the default streams needs. Shared by every handle made from it, so the
/// device outlives them whatever order they are destroyed in.
struct device_state {
  std::unique_ptr<device> dev;
  std::string reason;  // why "auto" chose this backend
  int ordinal = 0;     // the device's ordinal (DLPack device ids)
  std::mutex bridge_mu;
  stream bridge;  // cuda only, made on first use: stands in for a default stream (interop.hpp)
  ~device_state() { bridge = stream(); }
};

/// Stores `what` as this thread's last error.
void set_last_error(std::string what) noexcept;

/// The status of the exception being handled; records its message.
int status_of_current_exception() noexcept;

/// Runs `fn`, returning FERRY_OK, or the status of the exception it threw (its message kept for
/// ferry_last_error).
template <class F>
int guard(F&& fn) noexcept {
  try {
    fn();
    return FERRY_OK;
  } catch (...) {
    return status_of_current_exception();
  }
}

/// A copy of `s` the caller frees with ferry_string_free.
char* dup_string(const std::string& s);

/// *h, or logic_error naming the function when the handle is NULL.
template <class Handle>
Handle& checked(Handle* h, const char* fn) {
  FERRY_EXPECTS(h != nullptr, fmt::format("{}: the handle is NULL", fn));
  return *h;
}

/// logic_error naming the function when its output pointer is NULL.
inline void expect_out(const void* out, const char* fn) {
  FERRY_EXPECTS(out != nullptr, fmt::format("{}: the output pointer is NULL", fn));
}

}  // namespace ferry::c_api

struct ferry_device {
  std::shared_ptr<ferry::c_api::device_state> state;
};

struct ferry_stream {
  std::shared_ptr<ferry::c_api::device_state> state;
  ferry::stream s;
};

struct ferry_event {
  std::shared_ptr<ferry::c_api::device_state> state;
  ferry::event e;
};
