// The host communicator's arithmetic (private to src/comm/host): one rank's share of a collective's bytes.
// Every function touches only the elements or the copies it is given, so the ranks of a group can each run
// their share at the same time on their own stream threads.
#pragma once

#include <cstddef>
#include <span>

#include "ferry/comm/communicator.hpp"

namespace ferry::comm::host {

/// Elements [begin, end) of an all-reduce: for each element, the sum over every rank's send (in float,
/// rank 0 first), divided by the number of ranks for avg, rounded back to `type` once, and written into
/// every rank's recv. Integer types sum exactly, modulo 2^bits (op is sum: communicator refuses avg). A
/// rank's send may be its recv (in place): each block is read whole before it is written.
void reduce_range(dtype type, reduce_op op, std::span<const void* const> sends, std::span<void* const> recvs,
                  std::size_t begin, std::size_t end) noexcept;

/// Rank `rank`'s share of an all-gather: its `bytes` of send into part `rank` of every rank's recv.
void gather_part(int rank, const void* send, std::span<void* const> recvs, std::size_t bytes) noexcept;

/// The elements [begin, end) of [0, count) that rank `rank` of `ranks` works on: an even split.
struct range {
  std::size_t begin;
  std::size_t end;
};
[[nodiscard]] range share_of(int rank, int ranks, std::size_t count) noexcept;

}  // namespace ferry::comm::host
