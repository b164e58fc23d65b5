// What an event's name says about it, decided once for every reader of a timeline (the analyzer's
// breakdown, the HTML report's colours): names come from CUDA libraries, profilers and users, whose
// spelling of the same word varies in case.
//
// Host only.
#pragma once

#include <string_view>

namespace ferry::trace {

/// True when `text` contains `word`, ASCII letters compared without regard to case. An empty `word` is
/// contained in every text.
[[nodiscard]] bool contains_ignoring_case(std::string_view text, std::string_view word) noexcept;

/// True when `name` is a communication kernel's: NCCL's kernels and collectives, spelled "nccl" in any
/// case ("ncclDevKernel_AllReduce_Sum_f32_RING_LL", "NCCL AllReduce", "ncclKernel_..."). The analyzer
/// counts their time as comm, not compute.
[[nodiscard]] bool is_comm_kernel(std::string_view name) noexcept;

}  // namespace ferry::trace
