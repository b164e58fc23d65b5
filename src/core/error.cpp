#include "ferry/core/error.hpp"

#include <cstdint>
#include <cstdio>
#include <mutex>
#include <set>
#include <string_view>
#include <tuple>

namespace ferry::detail {
namespace {

// Only the file's base name: full build paths make messages long and leak the build machine's layout.
std::string_view base_name(const char* path) {
  std::string_view p(path);
  const auto slash = p.find_last_of('/');
  return slash == std::string_view::npos ? p : p.substr(slash + 1);
}

std::string with_location(const std::string& msg, std::source_location where) {
  std::string out = msg;
  out += " [";
  out += base_name(where.file_name());
  out += ':';
  out += std::to_string(where.line());
  out += ']';
  return out;
}

using site = std::tuple<std::string_view, std::uint_least32_t, std::uint_least32_t>;

struct reported_sites {
  std::mutex mu;
  std::set<site> sites;  // guarded by mu
};

// Never destroyed: destructors of static objects may still report while the program exits.
reported_sites& reported() {
  static auto* const instance = new reported_sites;
  return *instance;
}

// A destructor that fails once per object would otherwise flood stderr when thousands of objects share
// the same fault; one line per call site is enough to find it.
bool first_report_from(std::source_location where) noexcept {
  try {
    reported_sites& r = reported();
    const std::lock_guard lock(r.mu);
    return r.sites.emplace(where.file_name(), where.line(), where.column()).second;
  } catch (...) {
    // Out of memory while bookkeeping: better a repeated line than a lost one.
    return true;
  }
}

}  // namespace

void throw_logic_error(const std::string& msg, std::source_location where) {
  throw logic_error(with_location(msg, where));
}

void report_destructor_error(const std::string& msg, std::source_location where) noexcept {
  if (!first_report_from(where)) return;
  try {
    const std::string line =
        "ferry: ignored error (reported where throwing is not allowed): " + with_location(msg, where) + "\n";
    std::fputs(line.c_str(), stderr);
  } catch (...) {
    std::fputs("ferry: ignored error (message lost: out of memory)\n", stderr);
  }
}

void forget_reported_destructor_errors() noexcept {
  try {
    reported_sites& r = reported();
    const std::lock_guard lock(r.mu);
    r.sites.clear();
  } catch (...) {
    // Nothing was ever recorded if the bookkeeping cannot even be created.
  }
}

}  // namespace ferry::detail
