// The GPU code a build of the cuda backend carries, in words a user can act on.
#pragma once

#include <string>
#include <string_view>

namespace ferry::detail {

/// Describes a CMake CUDA_ARCHITECTURES list, its entries separated by ',' or ';': "80-real" is machine
/// code for sm_80, "90-virtual" PTX for compute_90 (which the driver compiles for that GPU and newer
/// ones), "90" both. "80-real,90" gives "sm_80, sm_90 and PTX compute_90". Entries it does not know
/// ("native", "all") are kept as they are; an empty list gives "no GPU code".
[[nodiscard]] std::string describe_cuda_architectures(std::string_view list);

}  // namespace ferry::detail
