// Error types and checking macros used throughout ferry.
//
// ferry reports misuse with ferry::logic_error, failed CUDA calls with ferry::cuda_error (which keeps the
// CUDA error code), and exhausted memory (device, pinned, or locked-page limits) with ferry::out_of_memory.
// Messages name the offending value and the limit it broke.
#pragma once

#include <exception>
#include <source_location>
#include <stdexcept>
#include <string>

namespace ferry {

/// Misuse of the API: a bad argument, a call in the wrong state. The message names value and limit.
class logic_error : public std::logic_error {
 public:
  using std::logic_error::logic_error;
};

/// A CUDA runtime call failed. `code()` is the cudaError_t value as an int (no CUDA header needed).
class cuda_error : public std::runtime_error {
 public:
  cuda_error(int code, const std::string& what) : std::runtime_error(what), code_(code) {}
  [[nodiscard]] int code() const noexcept { return code_; }

 private:
  int code_;
};

/// Memory could not be had: device memory, pinned host memory, or locked pages beyond RLIMIT_MEMLOCK.
class out_of_memory : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Input ferry reads (a trace file, say) is malformed, truncated or too large. The message names the
/// input, where in it the problem is, and the limit or the form that was expected.
class input_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// A pipeline or queue was stopped (closed) while a caller waited on it.
class stopped_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

namespace detail {
[[noreturn]] void throw_logic_error(const std::string& msg, std::source_location where);
/// Reports an error from a destructor (which must not throw): prints it to stderr once per call site.
void report_destructor_error(const std::string& msg, std::source_location where) noexcept;
/// Forgets which call sites have reported, so each reports again (for tests that run more than once).
void forget_reported_destructor_errors() noexcept;
}  // namespace detail

}  // namespace ferry

/// Throws ferry::logic_error with `msg` when `cond` is false. `msg` is evaluated only on failure, so it
/// may be an expensive expression such as a fmt::format call.
#define FERRY_EXPECTS(cond, msg)                                                  \
  do {                                                                            \
    if (!(cond)) [[unlikely]]                                                     \
      ::ferry::detail::throw_logic_error((msg), std::source_location::current()); \
  } while (0)

/// For destructors and other noexcept paths: reports (never throws) when `cond` is false.
#define FERRY_ASSERT_NOTHROW(cond, msg)                                                 \
  do {                                                                                  \
    if (!(cond)) [[unlikely]]                                                           \
      ::ferry::detail::report_destructor_error((msg), std::source_location::current()); \
  } while (0)
