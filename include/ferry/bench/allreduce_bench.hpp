// `ferry bench allreduce`: the all-reduce's speed over message sizes, in the vocabulary of NVIDIA's
// nccl-tests (all_reduce_perf), so the two read side by side, plus the codecs of ferry::comm.
//
// For each size from min_bytes to max_bytes (times step_factor) and each codec, every rank (one thread
// per rank) runs `warmup` untimed operations, then `iters` out-of-place operations and `iters` in-place
// ones back to back on its stream, each batch timed on the host from a barrier of the group to the stream's
// completion; the figures are the mean over ranks of the time per operation. With a codec an operation is
// what the reducer does with a bucket: encode (scale by 1/n and cast) into a wire buffer, all-reduce the
// wire buffer (sum), decode back to fp32; without (fp32) it is one all-reduce with reduce_op::avg.
//
// Formulas (docs/PERFORMANCE.md): size S = count * 4 bytes of fp32; wire W = the bytes each rank sends
// into the all-reduce (S, or S/2 with a 16-bit codec); time t per operation; algbw = W / t and
// busbw = algbw * 2(n-1)/n (GB = 1e9 bytes), as nccl-tests; effbw = S / t, the fp32 gradient bytes a
// training step gets reduced per second; codec time = encode + decode alone, per operation. The footer's
// average bus bandwidth is the mean busbw over every size, out-of-place and in-place, per codec.
//
// --check: after the timed runs, every rank fills its buffer with its own deterministic values
// (comm::f32_fill), runs one operation out of place and one in place, and compares every element with the
// exact mean over ranks on the device; #wrong counts elements beyond the codec's error bound
// (comm::error_bound), and must be 0.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "ferry/bench/ladder.hpp"
#include "ferry/comm/codec.hpp"
#include "ferry/comm/communicator.hpp"
#include "ferry/core/units.hpp"

namespace ferry::bench {

/// What `ferry bench allreduce` runs. Defaults as nccl-tests': 32 MiB, 20 iterations.
struct allreduce_options {
  std::uint64_t min_bytes = 32 * MiB;  // -b
  std::uint64_t max_bytes = 32 * MiB;  // -e
  std::uint64_t step_factor = 2;       // -f: each size is the previous times this
  int iters = 20;                      // -n: timed operations per size, out of place and in place each
  int warmup = 5;                      // -w: untimed operations per size and codec
  bool check = true;                   // compare every element with the exact mean (#wrong)
  std::vector<comm::codec_kind> codecs{comm::codec_kind::none};
};

/// The sizes a run measures: min_bytes, times step_factor, up to max_bytes, each rounded down to whole
/// fp32 elements. Throws logic_error for a size under 4 bytes, min above max, a factor under 2, iters
/// under 1, warmup under 0, no codec, or PowerSGD (the reducer's alone).
[[nodiscard]] std::vector<std::uint64_t> allreduce_sizes(const allreduce_options& o);

/// One timed batch of operations: nccl-tests' columns and the fp32 bandwidth.
struct allreduce_timing {
  double time_us = 0;  // per operation, mean over ranks
  double algbw = 0;    // GB/s of wire bytes
  double busbw = 0;    // algbw * 2(n-1)/n
  double effbw = 0;    // GB/s of fp32 bytes
  std::uint64_t wrong = 0;
};

/// One size with one codec.
struct allreduce_row {
  std::uint64_t bytes = 0;  // S: fp32 bytes
  std::uint64_t count = 0;  // elements
  comm::codec_kind codec = comm::codec_kind::none;
  std::uint64_t wire_bytes = 0;  // W
  allreduce_timing out_of_place;
  allreduce_timing in_place;
  double codec_us = 0;        // encode + decode alone, per operation, mean over ranks (0 for fp32)
  std::uint64_t checked = 0;  // elements compared, out of place and in place (0 without check)
};

/// A run.
struct allreduce_result {
  device_info device;   // rank 0's
  std::string backend;  // the communicator's: "host" or "nccl"
  int ranks = 0;
  std::string link;  // host backend: the modelled link ("nvlink, 330 GB/s bus"); else ""
  std::vector<allreduce_row> rows;
  /// Mean busbw over every row of codec `c`, out of place and in place (0 when none ran).
  [[nodiscard]] double average_busbw(comm::codec_kind c) const noexcept;
  /// Wrong elements over every row.
  [[nodiscard]] std::uint64_t wrong() const noexcept;
};

/// Runs the sizes and codecs of `o` on every rank of one group (one thread per rank). `ranks`: every
/// communicator of the group, rank order. Throws logic_error for bad options or ranks that are not one
/// whole group, out_of_memory when the buffers (send, receive and wire: 2.5 x max_bytes per rank) cannot
/// be had, comm_error when a collective fails (the group is aborted, so no rank waits forever).
[[nodiscard]] allreduce_result run_allreduce(std::span<comm::communicator* const> ranks,
                                             const allreduce_options& o, progress_fn progress = {});
/// The same over the processes of `job` (collective: every process calls it with the same options):
/// `ranks` are this process's ranks of the group, consecutive, the group spanning every process's. The
/// figures are the means over every rank of the group and #wrong their sum, the same result on every
/// process (gathered through the bootstrap); progress is reported by the process holding rank 0.
[[nodiscard]] allreduce_result run_allreduce(comm::bootstrap& job, std::span<comm::communicator* const> ranks,
                                             const allreduce_options& o, progress_fn progress = {});

/// The nccl-tests-style table with the codec columns and the footer.
[[nodiscard]] std::string format_text(const allreduce_result& r);
/// The run as JSON: the stamp, the options, each row (out_of_place and in_place objects with time_us,
/// algbw, busbw, effbw, nwrong), average_bus_bandwidth per codec and the total wrong.
[[nodiscard]] nlohmann::json to_json(const allreduce_result& r, const allreduce_options& o,
                                     const run_stamp& stamp);

}  // namespace ferry::bench
