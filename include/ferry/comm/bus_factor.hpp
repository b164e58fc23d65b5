// The bus-bandwidth factors of the collectives (nccl-tests' PERFORMANCE.md), in one place: the share of a
// collective's S bytes that crosses each rank's link, so that busbw = S * factor / time compares with the
// link's peak whatever the number of ranks. Host-only; the link model, the automatic plan's link table and
// the benches all take their factor from here.
//
// One rank: every factor but broadcast's is 0, as nccl-tests' all_reduce_perf reports (busbw 0 at -g 1). A
// group of one moves nothing over a link, so the link model and the plan's cost model charge no transfer
// time for it, and a bench row of one rank shows busbw 0 rather than the memory copy rate under a bus name.
#pragma once

#include <string>

#include "ferry/core/error.hpp"

namespace ferry::comm {

/// An all-reduce over `ranks` ranks: 2(n-1)/n (a reduce-scatter and an all-gather, each (n-1)/n); 0 for one
/// rank. Throws logic_error for ranks < 1.
[[nodiscard]] inline double all_reduce_bus_factor(int ranks) {
  FERRY_EXPECTS(ranks >= 1, "all-reduce bus factor over " + std::to_string(ranks) +
                                " ranks: a group has at least 1 rank");
  return 2.0 * (ranks - 1) / ranks;
}

/// An all-gather of S gathered bytes over `ranks` ranks: (n-1)/n; 0 for one rank. Throws logic_error for
/// ranks < 1.
[[nodiscard]] inline double all_gather_bus_factor(int ranks) {
  FERRY_EXPECTS(ranks >= 1, "all-gather bus factor over " + std::to_string(ranks) +
                                " ranks: a group has at least 1 rank");
  return static_cast<double>(ranks - 1) / ranks;
}

/// A broadcast: 1 (the root's S bytes reach every other rank through its link), whatever the ranks.
[[nodiscard]] constexpr double broadcast_bus_factor() noexcept { return 1.0; }

}  // namespace ferry::comm
