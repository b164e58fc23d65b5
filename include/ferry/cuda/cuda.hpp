// The cuda backend: a device on a GPU through the CUDA runtime (linked statically). This header is
// host-only C++; it is the one way in to the backend, which lives in the ferry::cuda target. When ferry
// is built without the CUDA toolkit, these functions exist and say so.
#pragma once

#include <memory>
#include <string>

#include "ferry/device/device.hpp"

namespace ferry {

/// True when ferry was built with the cuda backend and the CUDA runtime sees at least one GPU.
[[nodiscard]] bool cuda_available() noexcept;
/// How many GPUs the CUDA runtime sees: 0 when ferry was built without CUDA or no driver or GPU is there.
[[nodiscard]] int cuda_device_count() noexcept;
/// Why cuda_available() is false (or an empty string when it is true).
[[nodiscard]] std::string cuda_unavailable_reason();
/// The GPU code this build carries, e.g. "sm_80, sm_86, sm_89, sm_90 and PTX compute_90"; empty when
/// ferry was built without CUDA. A GPU none of it serves is refused when its device is made.
[[nodiscard]] std::string cuda_architectures();
/// Makes a device for GPU `ordinal` on the cuda backend. Throws logic_error when ferry was built
/// without CUDA or the ordinal is out of range, cuda_error when the runtime fails or the GPU cannot load
/// the kernels this build carries (the message names its compute capability and cuda_architectures()).
[[nodiscard]] std::unique_ptr<device> make_cuda_device(int ordinal = 0);

/// The default choice: cuda when a GPU is visible, else host. `reason` receives why, for the user.
[[nodiscard]] std::unique_ptr<device> make_default_device(std::string* reason = nullptr);

}  // namespace ferry
