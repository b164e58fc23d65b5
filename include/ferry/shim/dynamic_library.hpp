// A shared library opened at run time (dlopen), the base of every shim in this folder: ferry links no
// library that a machine may lack (NVML ships with the driver, CUPTI with the toolkit, NCCL with the
// toolkit or a Python package), and says which one is missing and why when a feature needs it.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "ferry/core/unique_handle.hpp"

namespace ferry::shim {

struct dl_traits {
  using handle_type = void*;
  static constexpr void* null() noexcept { return nullptr; }
  static bool is_null(void* h) noexcept { return h == nullptr; }
  static void close(void* h) noexcept;
};

/// An open shared library. Move-only; closing it (dlclose) happens when the owner is destroyed, but the
/// library stays mapped (RTLD_NODELETE): NCCL, cuBLAS and CUPTI keep threads and static state (their
/// own C++ runtime's exception pool among them) that must outlive the handle, so they are never unloaded.
class dynamic_library {
 public:
  /// Whether the library's symbols serve libraries loaded after it (RTLD_GLOBAL: Open MPI's components
  /// need libmpi's) or only lookups through this handle (RTLD_LOCAL, the default).
  enum class symbols : bool { local, global };

  dynamic_library() noexcept = default;

  /// Opens the first of `names` that dlopen finds (RTLD_NOW | RTLD_NODELETE, and RTLD_LOCAL or RTLD_GLOBAL
  /// as `scope` says). When none opens, the library is empty and error() says what each attempt answered,
  /// one `dlopen("name") failed: why` per name tried, in order. Never throws for a missing library.
  [[nodiscard]] static dynamic_library open(const std::vector<std::string>& names,
                                            symbols scope = symbols::local);

  [[nodiscard]] bool loaded() const noexcept { return !handle_.empty(); }
  /// Why open() failed (empty when loaded).
  [[nodiscard]] const std::string& error() const noexcept { return error_; }
  /// The name that opened, as given to open().
  [[nodiscard]] const std::string& name() const noexcept { return name_; }
  /// The file the dynamic loader opened for name() (a full path when name() was a bare soname);
  /// empty when not loaded. What NVTX_INJECTION64_PATH needs to load the very same library.
  [[nodiscard]] std::string path() const;

  /// The address of `symbol`, or nullptr when the library lacks it.
  [[nodiscard]] void* find(const char* symbol) const noexcept;
  /// The function `symbol` as a pointer of type F. Throws logic_error naming the library and the
  /// symbol when it is missing or the library is not loaded.
  template <typename F>
  [[nodiscard]] F function(const char* symbol) const {
    return reinterpret_cast<F>(require(symbol));  // NOLINT(cppcoreguidelines-pro-type-reinterpret-cast)
  }
  /// Like function(), but nullptr when missing (for optional entry points).
  template <typename F>
  [[nodiscard]] F optional_function(const char* symbol) const noexcept {
    return reinterpret_cast<F>(find(symbol));  // NOLINT(cppcoreguidelines-pro-type-reinterpret-cast)
  }
  /// Sets `fn` to the function `symbol`, or to nullptr and appends the symbol to `missing` (", "
  /// between names): a shim looks up every entry point, then names all that are missing at once.
  template <typename F>
  void look_up(const char* symbol, F& fn, std::string& missing) const {
    fn = optional_function<F>(symbol);
    if (fn != nullptr) return;
    if (!missing.empty()) missing += ", ";
    missing += symbol;
  }

  /// The items of a colon-separated list (a build's folders or sonames), empty items dropped.
  [[nodiscard]] static std::vector<std::string> split_list(std::string_view list);
  /// What open() should try for `soname`: the bare soname (the loader's search), then `soname` in each
  /// folder of the colon-separated `dirs` by absolute path, each name once.
  [[nodiscard]] static std::vector<std::string> candidates(std::string_view soname, std::string_view dirs);

 private:
  [[nodiscard]] void* require(const char* symbol) const;
  unique_handle<dl_traits> handle_;
  std::string name_;
  std::string error_;
};

}  // namespace ferry::shim
