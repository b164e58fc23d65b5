#include "ferry/shim/dynamic_library.hpp"

#include <dlfcn.h>
#include <link.h>

#include "ferry/core/error.hpp"

namespace ferry::shim {

void dl_traits::close(void* h) noexcept { static_cast<void>(::dlclose(h)); }

dynamic_library dynamic_library::open(const std::vector<std::string>& names) {
  dynamic_library lib;
  for (const std::string& name : names) {
    void* h = ::dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
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

}  // namespace ferry::shim
