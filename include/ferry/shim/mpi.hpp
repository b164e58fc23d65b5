// Open MPI (libmpi.so.40: Debian's openmpi, Ubuntu's, NVIDIA HPC-X), opened at run time, so ferry builds
// without linking MPI and its tools run where MPI is missing. ferry uses MPI only to bootstrap: to learn a
// process's rank in a job started by mpirun and to pass a few hundred bytes between the processes (a
// group's NCCL unique id, the GPUs each process drives); gradients never pass through it.
//
// Only the part of mpi.h that ferry::comm's bootstrap uses is declared here, with types of its own
// (src/shim/mpi.cpp checks them against Open MPI's <mpi.h> where one is found at build time). Open MPI's
// handles are pointers to its predefined objects (MPI_COMM_WORLD is &ompi_mpi_comm_world), which is what
// this shim looks up; MPICH's integer handles are not supported.
#pragma once

#include <string>
#include <vector>

#include "ferry/shim/dynamic_library.hpp"

namespace ferry::shim {

/// The soname Open MPI is opened by first (the dynamic loader's search: LD_LIBRARY_PATH, ld.so.cache, ...).
inline constexpr const char* mpi_library_name = "libmpi.so.40";

inline constexpr int mpi_success = 0;
/// MPI_THREAD_SERIALIZED: one thread at a time calls MPI, which is how ferry's bootstrap uses it.
inline constexpr int mpi_thread_serialized = 2;
/// MPI_MAX_ERROR_STRING and MPI_MAX_LIBRARY_VERSION_STRING of Open MPI.
inline constexpr int mpi_max_error_string = 256;
inline constexpr int mpi_max_library_version_string = 256;

/// MPI_Comm, MPI_Datatype and MPI_Errhandler: pointers to Open MPI's objects.
using mpi_comm = void*;
using mpi_datatype = void*;
using mpi_errhandler = void*;

/// Open MPI's entry points, each with the signature mpi.h declares, the predefined handles ferry uses and
/// the library they come from. Move-only; valid while `library` is open.
struct mpi_api {
  int (*initialized)(int*) = nullptr;
  int (*finalized)(int*) = nullptr;
  int (*init_thread)(int*, char***, int, int*) = nullptr;
  int (*finalize)() = nullptr;
  int (*comm_rank)(mpi_comm, int*) = nullptr;
  int (*comm_size)(mpi_comm, int*) = nullptr;
  int (*comm_set_errhandler)(mpi_comm, mpi_errhandler) = nullptr;
  int (*bcast)(void*, int, mpi_datatype, int, mpi_comm) = nullptr;
  int (*allgather)(const void*, int, mpi_datatype, void*, int, mpi_datatype, mpi_comm) = nullptr;
  int (*barrier)(mpi_comm) = nullptr;
  int (*abort)(mpi_comm, int) = nullptr;
  int (*error_string)(int, char*, int*) = nullptr;
  int (*get_library_version)(char*, int*) = nullptr;

  mpi_comm comm_world = nullptr;           // MPI_COMM_WORLD
  mpi_datatype byte = nullptr;             // MPI_BYTE
  mpi_errhandler errors_return = nullptr;  // MPI_ERRORS_RETURN

  dynamic_library library;
  /// Why MPI is not usable (empty when ok()): what dlopen said for every name tried, or the symbols the
  /// library lacks (an MPI that is not Open MPI lacks the ompi_mpi_* handles).
  std::string error;

  [[nodiscard]] bool ok() const noexcept { return error.empty() && library.loaded(); }
  /// MPI error code `code` in MPI's words with its number: "MPI_ERR_TRUNCATE: message truncated (MPI 15)".
  [[nodiscard]] std::string error_text(int code) const;
  /// MPI_Get_library_version's text up to its first comma or line end ("Open MPI v4.1.4"); "unknown"
  /// when it fails.
  [[nodiscard]] std::string version_string() const;
};

/// The libraries tried for Open MPI, in order: FERRY_MPI_LIBRARY when set (a path or a soname), then
/// libmpi.so.40 by the loader's search, then libmpi.so.40 in Debian's, HPC-X's and /usr/local's library
/// folders by absolute path.
[[nodiscard]] std::vector<std::string> mpi_library_names();

/// Opens the first of `names` that loads, with its symbols global (Open MPI's components, loaded by it,
/// resolve their symbols against libmpi), and looks up every entry point and handle. Never throws for a
/// missing or unusable MPI: ok() is false and `error` says why.
[[nodiscard]] mpi_api load_mpi(const std::vector<std::string>& names);

/// Open MPI, loaded on the first call with mpi_library_names() (thread-safe) and kept until the process
/// exits. Check ok().
[[nodiscard]] const mpi_api& mpi();

}  // namespace ferry::shim
