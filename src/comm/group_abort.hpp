// abort() of one rank of a backend's group object (private to src/comm): the host and NCCL communicators
// both forward it to their group, naming the rank.
#pragma once

#include <fmt/format.h>

#include <string>

namespace ferry::comm::detail {

/// Aborts `group` (anything with abort(std::string) noexcept) with `why`, naming `rank` as the caller; with
/// no memory to format that, with `why` alone.
template <class Group>
void abort_group(Group& group, int rank, const std::string& why) noexcept {
  try {
    group.abort(fmt::format("abort() on rank {}: {}", rank, why));
  } catch (...) {
    group.abort(why);
  }
}

}  // namespace ferry::comm::detail
