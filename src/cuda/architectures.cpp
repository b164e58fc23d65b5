#include "ferry/cuda/detail/architectures.hpp"

#include <cctype>
#include <vector>

namespace ferry::detail {
namespace {

bool all_digits(std::string_view s) {
  if (s.empty()) return false;
  for (const char c : s)
    if (std::isdigit(static_cast<unsigned char>(c)) == 0) return false;
  return true;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front())) != 0) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back())) != 0) s.remove_suffix(1);
  return s;
}

std::string join(const std::vector<std::string>& parts) {
  std::string out;
  for (std::size_t i = 0; i < parts.size(); ++i) {
    if (i > 0) out += i + 1 == parts.size() ? " and " : ", ";
    out += parts[i];
  }
  return out;
}

}  // namespace

std::string describe_cuda_architectures(std::string_view list) {
  std::vector<std::string> machine_code;
  std::vector<std::string> ptx;
  std::vector<std::string> other;
  while (!list.empty()) {
    const std::size_t end = list.find_first_of(",;");
    const std::string_view entry = trim(list.substr(0, end));
    list = end == std::string_view::npos ? std::string_view{} : list.substr(end + 1);
    if (entry.empty()) continue;
    const std::size_t dash = entry.find('-');
    const std::string_view number = entry.substr(0, dash);
    const std::string_view kind =
        dash == std::string_view::npos ? std::string_view{} : entry.substr(dash + 1);
    if (!all_digits(number) || (!kind.empty() && kind != "real" && kind != "virtual")) {
      other.emplace_back(entry);
      continue;
    }
    if (kind != "virtual") machine_code.push_back("sm_" + std::string(number));
    if (kind != "real") ptx.push_back("PTX compute_" + std::string(number));
  }
  machine_code.insert(machine_code.end(), ptx.begin(), ptx.end());
  machine_code.insert(machine_code.end(), other.begin(), other.end());
  return machine_code.empty() ? std::string("no GPU code") : join(machine_code);
}

}  // namespace ferry::detail
