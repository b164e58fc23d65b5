#include "ferry/shim/cublas.hpp"

#include <fmt/format.h>

#include <string>
#include <utility>
#include <vector>

// The toolkit's <cublas_api.h>, where the build has one, only to check that the declarations of
// ferry/shim/cublas.hpp match cuBLAS's: nothing here calls cuBLAS through it.
#if __has_include(<cublas_api.h>)
#include <cublas_api.h>

#include <type_traits>
#define FERRY_SHIM_HAVE_CUBLAS_H 1
#endif

// Set by src/shim/CMakeLists.txt from the toolkit found at configure time, ':'-separated.
#ifndef FERRY_CUBLAS_DIRS
#define FERRY_CUBLAS_DIRS "/usr/local/cuda/lib64"
#endif

namespace ferry::shim {

#ifdef FERRY_SHIM_HAVE_CUBLAS_H
static_assert(sizeof(cublas_status) == sizeof(cublasStatus_t) && cublas_success == CUBLAS_STATUS_SUCCESS);
static_assert(std::is_pointer_v<cublas_handle> && std::is_pointer_v<cublasHandle_t>);
static_assert(sizeof(cublas_op) == sizeof(cublasOperation_t) &&
              static_cast<int>(cublas_op::n) == CUBLAS_OP_N && static_cast<int>(cublas_op::t) == CUBLAS_OP_T);
static_assert(sizeof(cublas_math) == sizeof(cublasMath_t) &&
              static_cast<int>(cublas_math::default_math) == CUBLAS_DEFAULT_MATH &&
              static_cast<int>(cublas_math::pedantic) == CUBLAS_PEDANTIC_MATH);
// The entry points' parameter lists, with cudaStream_t as void* (a pointer to an opaque struct).
static_assert(std::is_same_v<decltype(&cublasCreate_v2), cublasStatus_t (*)(cublasHandle_t*)>);
static_assert(std::is_same_v<decltype(&cublasDestroy_v2), cublasStatus_t (*)(cublasHandle_t)>);
static_assert(
    std::is_same_v<decltype(&cublasSetStream_v2), cublasStatus_t (*)(cublasHandle_t, cudaStream_t)>);
static_assert(
    std::is_same_v<decltype(&cublasSetWorkspace_v2), cublasStatus_t (*)(cublasHandle_t, void*, size_t)>);
static_assert(std::is_same_v<decltype(&cublasSetMathMode), cublasStatus_t (*)(cublasHandle_t, cublasMath_t)>);
static_assert(
    std::is_same_v<decltype(&cublasSgemmBatched),
                   cublasStatus_t (*)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int,
                                      const float*, const float* const[], int, const float* const[], int,
                                      const float*, float* const[], int, int)>);
static_assert(std::is_same_v<decltype(&cublasGetStatusString), const char* (*)(cublasStatus_t)>);
static_assert(std::is_pointer_v<cudaStream_t> && sizeof(cudaStream_t) == sizeof(void*));
#endif

namespace {}  // namespace

std::string cublas_api::error_string(cublas_status s) const {
  const char* text = status_string != nullptr ? status_string(s) : nullptr;
  return fmt::format("{} (cuBLAS {})", text != nullptr ? text : "unknown status", s);
}

const std::vector<std::string>& cublas_library_names() {
  static const std::vector<std::string> names =
      dynamic_library::candidates(cublas_library_name, FERRY_CUBLAS_DIRS);
  return names;
}

cublas_api load_cublas(const std::vector<std::string>& names) {
  cublas_api api;
  api.library = dynamic_library::open(names);
  if (!api.library.loaded()) {
    api.error = "cuBLAS not available: " + api.library.error();
    return api;
  }
  const dynamic_library& lib = api.library;
  std::string missing;
  lib.look_up("cublasCreate_v2", api.create, missing);
  lib.look_up("cublasDestroy_v2", api.destroy, missing);
  lib.look_up("cublasSetStream_v2", api.set_stream, missing);
  lib.look_up("cublasSetWorkspace_v2", api.set_workspace, missing);
  lib.look_up("cublasSetMathMode", api.set_math_mode, missing);
  lib.look_up("cublasSgemmBatched", api.sgemm_batched, missing);
  api.status_string = lib.optional_function<decltype(api.status_string)>("cublasGetStatusString");
  if (!missing.empty()) {
    api.error = fmt::format("cuBLAS not available: {} ({}) lacks {}", lib.name(), lib.path(), missing);
  }
  return api;
}

const cublas_api& cublas() {
  static const cublas_api api = load_cublas(cublas_library_names());
  return api;
}

}  // namespace ferry::shim
