#include "ferry/shim/dynamic_library.hpp"

#include <dlfcn.h>
#include <link.h>

#include <algorithm>

#include "ferry/core/error.hpp"

namespace ferry::shim {

void dl_traits::close(void* h) noexcept { static_cast<void>(::dlclose(h)); }

dynamic_library dynamic_library::open(const std::vector<std::string>& names, symbols scope) {
  dynamic_library lib;
  const int visibility = scope == symbols::global ? RTLD_GLOBAL : RTLD_LOCAL;
  for (const std::string& name : names) {
    void* h = ::dlopen(name.c_str(), RTLD_NOW | visibility | RTLD_NODELETE);
    if (h != nullptr) {
      lib.handle_.reset(h);
      lib.name_ = name;
      lib.error_.clear();
      return lib;
    }
    const char* why = ::dlerror();  // NOLINT(concurrency-mt-unsafe): glibc keeps dlerror's state per thread
    if (!lib.error_.empty()) lib.error_ += "; ";
    lib.error_ += "dlopen(\"" + name + "\") failed: " + (why != nullptr ? why : "unknown error");
  }
  if (names.empty()) lib.error_ = "no library name given";
  return lib;
}

void* dynamic_library::find(const char* symbol) const noexcept {
  if (handle_.empty()) return nullptr;
  return ::dlsym(handle_.get(), symbol);
}

std::string dynamic_library::path() const {
  if (handle_.empty()) return {};
  link_map* map = nullptr;
  if (::dlinfo(handle_.get(), RTLD_DI_LINKMAP, &map) != 0 || map == nullptr || map->l_name == nullptr)
    return name_;
  return map->l_name[0] != '\0' ? std::string(map->l_name) : name_;
}

void* dynamic_library::require(const char* symbol) const {
  FERRY_EXPECTS(!handle_.empty(),
                std::string("cannot look up ") + symbol + ": the library is not loaded (" + error_ + ")");
  void* p = find(symbol);
  FERRY_EXPECTS(p != nullptr, std::string("library ") + name_ + " has no symbol " + symbol +
                                  "; it may be older than ferry needs");
  return p;
}

std::vector<std::string> dynamic_library::split_list(std::string_view list) {
  std::vector<std::string> out;
  while (!list.empty()) {
    const std::size_t colon = list.find(':');
    const std::string_view item = list.substr(0, colon);
    if (!item.empty()) out.emplace_back(item);
    if (colon == std::string_view::npos) break;
    list.remove_prefix(colon + 1);
  }
  return out;
}

std::vector<std::string> dynamic_library::candidates(std::string_view soname, std::string_view dirs) {
  std::vector<std::string> out{std::string(soname)};
  for (const std::string& dir : split_list(dirs)) {
    std::string path = dir + "/" + std::string(soname);
    if (std::find(out.begin(), out.end(), path) == out.end()) out.push_back(std::move(path));
  }
  return out;
}

}  // namespace ferry::shim
