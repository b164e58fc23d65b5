#include "ferry/trace/names.hpp"

#include <algorithm>

namespace ferry::trace {

namespace {

// ASCII only: the C library's tolower depends on the locale, and names are compared byte by byte.
constexpr char ascii_lower(char c) noexcept {
  return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c;
}

}  // namespace

bool contains_ignoring_case(std::string_view text, std::string_view word) noexcept {
  return word.empty() || std::search(text.begin(), text.end(), word.begin(), word.end(), [](char a, char b) {
                           return ascii_lower(a) == ascii_lower(b);
                         }) != text.end();
}

bool is_comm_kernel(std::string_view name) noexcept { return contains_ignoring_case(name, "nccl"); }

}  // namespace ferry::trace
