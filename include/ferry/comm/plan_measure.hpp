// ferry::comm: what the automatic plan (auto_plan.hpp) measures on a live group at start-up: the
// all-reduce's time over message sizes (the link table) and a codec's local cost on this device. The
// reducer's automatic mode (reducer_options::automatic) calls these when it is constructed; benches call
// them to probe a link the same way.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "ferry/comm/auto_plan.hpp"
#include "ferry/comm/codec.hpp"
#include "ferry/comm/communicator.hpp"

namespace ferry::comm {

/// Seconds of one fp32 average all-reduce of each of `sizes` bytes (multiples of 4, at most
/// scratch.bytes) on `s`, as this rank sees it: per size one warm-up, a barrier of the group, then the mean
/// of `iters` all-reduces timed on the host until `s` is done (at least 1 ns). Collective: every rank of
/// the group calls it with the same sizes at the same point. Overwrites scratch. Throws logic_error for a
/// size that is not a positive multiple of 4 or exceeds scratch, or iters < 1 (naming it); comm_error
/// when the group fails.
[[nodiscard]] std::vector<double> time_all_reduce(communicator& c, mem_view scratch,
                                                  std::span<const std::uint64_t> sizes, int iters,
                                                  stream_view s);

/// A 16-bit codec's encode and decode cost on s's device, by timing each over all of `scratch` (fp32
/// values) and over 1024 elements: the difference gives the cost per byte, the rest is the cost per call.
/// `wire` holds wire_bytes(codec, scratch.bytes / 4). Host syncs of `s`. Throws logic_error as
/// encode_async (none and powersgd are not measured here: none costs nothing locally).
[[nodiscard]] codec_cost measure_codec(codec_kind codec, mem_view scratch, mem_view wire, int world_size,
                                       stream_view s);

/// The all-reduce sizes the automatic plan times a model of `model_bytes` at: x4 from 1 MiB (from a 64th of
/// the model, at least 4 KiB, for a model under 64 MiB) while below the model's bytes, then the model's
/// bytes (rounded down to whole fp32 elements).
[[nodiscard]] std::vector<std::uint64_t> default_link_sizes(std::uint64_t model_bytes);

}  // namespace ferry::comm
