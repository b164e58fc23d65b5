#include "ferry/shim/mpi.hpp"

#include <fmt/format.h>

#include <cstdlib>
#include <string>
#include <vector>

// Open MPI's <mpi.h>, where the build has one (src/shim/CMakeLists.txt adds its folder to this file only),
// to check that the declarations of ferry/shim/mpi.hpp match it: nothing here calls MPI through it, and its
// handle macros are not used (they would link libmpi).
#if __has_include(<mpi.h>)
#define OMPI_SKIP_MPICXX 1  // the C declarations only: the C++ bindings would need libmpi_cxx linked
#include <mpi.h>
#if defined(OPEN_MPI) && OPEN_MPI
#include <type_traits>
#define FERRY_SHIM_HAVE_OPEN_MPI_H 1
#endif
#endif

// Set by src/shim/CMakeLists.txt, ':'-separated: folders libmpi.so.40 is looked for in by absolute path.
#ifndef FERRY_MPI_DIRS
#define FERRY_MPI_DIRS "/usr/lib/x86_64-linux-gnu/openmpi/lib:/opt/hpcx/ompi/lib:/usr/local/lib"
#endif

namespace ferry::shim {

#ifdef FERRY_SHIM_HAVE_OPEN_MPI_H
static_assert(mpi_success == MPI_SUCCESS);
static_assert(mpi_thread_serialized == MPI_THREAD_SERIALIZED);
static_assert(mpi_max_error_string == MPI_MAX_ERROR_STRING);
static_assert(mpi_max_library_version_string == MPI_MAX_LIBRARY_VERSION_STRING);
static_assert(std::is_pointer_v<MPI_Comm>);
static_assert(std::is_pointer_v<MPI_Datatype>);
static_assert(std::is_pointer_v<MPI_Errhandler>);
// One check per entry point: the shim's signature is mpi.h's. (The functions taking handles are checked
// with mpi.h's handle types, which the shim declares as void*.)
template <typename Shim, typename Header>
constexpr bool same_signature = std::is_same_v<Shim, Header>;
static_assert(same_signature<decltype(mpi_api::initialized), decltype(&MPI_Initialized)>);
static_assert(same_signature<decltype(mpi_api::finalized), decltype(&MPI_Finalized)>);
static_assert(same_signature<decltype(mpi_api::init_thread), decltype(&MPI_Init_thread)>);
static_assert(same_signature<decltype(mpi_api::finalize), decltype(&MPI_Finalize)>);
static_assert(same_signature<decltype(mpi_api::error_string), decltype(&MPI_Error_string)>);
static_assert(same_signature<decltype(mpi_api::get_library_version), decltype(&MPI_Get_library_version)>);
static_assert(same_signature<int (*)(MPI_Comm, int*), decltype(&MPI_Comm_rank)>);
static_assert(same_signature<int (*)(MPI_Comm, int*), decltype(&MPI_Comm_size)>);
static_assert(same_signature<int (*)(MPI_Comm, MPI_Errhandler), decltype(&MPI_Comm_set_errhandler)>);
static_assert(same_signature<int (*)(void*, int, MPI_Datatype, int, MPI_Comm), decltype(&MPI_Bcast)>);
static_assert(same_signature<int (*)(const void*, int, MPI_Datatype, void*, int, MPI_Datatype, MPI_Comm),
                             decltype(&MPI_Allgather)>);
static_assert(same_signature<int (*)(MPI_Comm), decltype(&MPI_Barrier)>);
static_assert(same_signature<int (*)(MPI_Comm, int), decltype(&MPI_Abort)>);
#endif

std::string mpi_api::error_text(int code) const {
  std::string text(static_cast<std::size_t>(mpi_max_error_string), '\0');
  int length = 0;
  if (error_string == nullptr || error_string(code, text.data(), &length) != mpi_success || length <= 0)
    return fmt::format("unknown error (MPI {})", code);
  text.resize(static_cast<std::size_t>(length));
  return fmt::format("{} (MPI {})", text, code);
}

std::string mpi_api::version_string() const {
  std::string text(static_cast<std::size_t>(mpi_max_library_version_string), '\0');
  int length = 0;
  if (get_library_version == nullptr || get_library_version(text.data(), &length) != mpi_success ||
      length <= 0)
    return "unknown";
  text.resize(static_cast<std::size_t>(length));
  const std::size_t end = text.find_first_of(",\r\n");  // "Open MPI v4.1.4, package: ..."
  if (end != std::string::npos) text.resize(end);
  return text;
}

std::vector<std::string> mpi_library_names() {
  std::vector<std::string> names;
  // NOLINTNEXTLINE(concurrency-mt-unsafe): read before any thread of ferry's could change the environment
  if (const char* chosen = std::getenv("FERRY_MPI_LIBRARY"); chosen != nullptr && *chosen != '\0')
    names.emplace_back(chosen);
  for (std::string& name : dynamic_library::candidates(mpi_library_name, FERRY_MPI_DIRS))
    names.push_back(std::move(name));
  return names;
}

mpi_api load_mpi(const std::vector<std::string>& names) {
  mpi_api api;
  api.library = dynamic_library::open(names, dynamic_library::symbols::global);
  if (!api.library.loaded()) {
    api.error = "MPI not available: " + api.library.error() +
                " (ferry needs Open MPI's libmpi.so.40: Debian's openmpi-bin, or FERRY_MPI_LIBRARY=path)";
    return api;
  }
  const dynamic_library& lib = api.library;
  std::string missing;
  lib.look_up("MPI_Initialized", api.initialized, missing);
  lib.look_up("MPI_Finalized", api.finalized, missing);
  lib.look_up("MPI_Init_thread", api.init_thread, missing);
  lib.look_up("MPI_Finalize", api.finalize, missing);
  lib.look_up("MPI_Comm_rank", api.comm_rank, missing);
  lib.look_up("MPI_Comm_size", api.comm_size, missing);
  lib.look_up("MPI_Comm_set_errhandler", api.comm_set_errhandler, missing);
  lib.look_up("MPI_Bcast", api.bcast, missing);
  lib.look_up("MPI_Allgather", api.allgather, missing);
  lib.look_up("MPI_Barrier", api.barrier, missing);
  lib.look_up("MPI_Abort", api.abort, missing);
  lib.look_up("MPI_Error_string", api.error_string, missing);
  lib.look_up("MPI_Get_library_version", api.get_library_version, missing);
  // The predefined handles are the addresses of Open MPI's objects.
  const auto handle = [&](const char* symbol, void*& out) {
    out = lib.find(symbol);
    if (out != nullptr) return;
    if (!missing.empty()) missing += ", ";
    missing += symbol;
  };
  handle("ompi_mpi_comm_world", api.comm_world);
  handle("ompi_mpi_byte", api.byte);
  handle("ompi_mpi_errors_return", api.errors_return);
  if (!missing.empty())
    api.error = fmt::format("MPI not available: {} ({}) lacks {}; ferry needs Open MPI (libmpi.so.40)",
                            lib.name(), lib.path(), missing);
  return api;
}

const mpi_api& mpi() {
  static const mpi_api api = load_mpi(mpi_library_names());
  return api;
}

}  // namespace ferry::shim
