// cuBLAS (libcublas.so.13: in the CUDA toolkit's lib64 or the nvidia-cublas Python package), opened at run
// time, so ferry builds without linking cuBLAS and runs where it is missing. Only the part of cublas_api.h
// that ferry::comm's PowerSGD uses is declared here, with types of its own (src/shim/cublas.cpp checks
// them against the toolkit's <cublas_api.h> where one is found at build time), so this header needs no
// CUDA header.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "ferry/shim/dynamic_library.hpp"

namespace ferry::shim {

/// The soname cuBLAS is opened by first (the dynamic loader's search: LD_LIBRARY_PATH, ld.so.cache, ...).
inline constexpr const char* cublas_library_name = "libcublas.so.13";

/// cublasStatus_t.
using cublas_status = int;
inline constexpr cublas_status cublas_success = 0;

/// cublasOperation_t: N (as stored) or T (transposed).
enum class cublas_op : int { n = 0, t = 1 };
/// cublasMath_t: the modes ferry sets (default: fp32 products in fp32, no TF32).
enum class cublas_math : int { default_math = 0, pedantic = 2 };

struct cublas_context;
/// cublasHandle_t.
using cublas_handle = cublas_context*;

/// cuBLAS's entry points, each with the signature cublas_api.h declares (cudaStream_t as void*), and the
/// library they come from. Move-only; valid while `library` is open.
struct cublas_api {
  cublas_status (*create)(cublas_handle*) = nullptr;
  cublas_status (*destroy)(cublas_handle) = nullptr;
  cublas_status (*set_stream)(cublas_handle, void*) = nullptr;
  cublas_status (*set_workspace)(cublas_handle, void*, std::size_t) = nullptr;
  cublas_status (*set_math_mode)(cublas_handle, cublas_math) = nullptr;
  /// cublasSgemmBatched: C_i = alpha op(A_i) op(B_i) + beta C_i, column-major, arrays of device pointers in
  /// device memory.
  cublas_status (*sgemm_batched)(cublas_handle, cublas_op, cublas_op, int, int, int, const float*,
                                 const float* const[], int, const float* const[], int, const float*,
                                 float* const[], int, int) = nullptr;
  /// cublasGetStatusString: optional.
  const char* (*status_string)(cublas_status) = nullptr;

  dynamic_library library;
  /// Why cuBLAS is not usable (empty when ok()): what dlopen said for every name tried, or the entry
  /// point it lacks.
  std::string error;

  [[nodiscard]] bool ok() const noexcept { return error.empty() && library.loaded(); }
  /// `s` in words with its number: "CUBLAS_STATUS_NOT_INITIALIZED (cuBLAS 1)".
  [[nodiscard]] std::string error_string(cublas_status s) const;
};

/// The libraries tried for cuBLAS, in order: libcublas.so.13 by the loader's search, then libcublas.so.13
/// in the build's toolkit library folder and /usr/local/cuda/lib64 by absolute path.
[[nodiscard]] const std::vector<std::string>& cublas_library_names();

/// Opens the first of `names` that loads and looks up every entry point. Never throws for a missing or
/// unusable cuBLAS: ok() is false and `error` says why.
[[nodiscard]] cublas_api load_cublas(const std::vector<std::string>& names);

/// cuBLAS, loaded on the first call with cublas_library_names() (thread-safe) and kept until the process
/// exits. Check ok().
[[nodiscard]] const cublas_api& cublas();

}  // namespace ferry::shim
