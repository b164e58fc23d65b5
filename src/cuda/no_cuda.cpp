// Factory functions of the cuda backend for builds without the CUDA toolkit.
#include "ferry/core/error.hpp"
#include "ferry/cuda/cuda.hpp"
#include "ferry/device/device.hpp"

namespace ferry {

bool cuda_available() noexcept { return false; }

int cuda_device_count() noexcept { return 0; }

std::string cuda_unavailable_reason() {
  return "ferry was built without the CUDA toolkit (host backend only)";
}

std::string cuda_architectures() { return {}; }

std::unique_ptr<device> make_cuda_device(int ordinal) {
  throw logic_error(
      "cannot make cuda device " + std::to_string(ordinal) +
      ": ferry was built without the CUDA toolkit; rebuild with nvcc on the PATH or use the host backend");
}

}  // namespace ferry
