// The default device: the cuda backend when a GPU is visible, else the emulated host device.
#include "ferry/cuda/cuda.hpp"

namespace ferry {

std::unique_ptr<device> make_default_device(std::string* reason) {
  if (cuda_available()) {
    if (reason != nullptr) *reason = "a GPU is visible: using the cuda backend on GPU 0";
    return make_cuda_device(0);
  }
  if (reason != nullptr) *reason = "using the emulated host device: " + cuda_unavailable_reason();
  return make_host_device();
}

}  // namespace ferry
