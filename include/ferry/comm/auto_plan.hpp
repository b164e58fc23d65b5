// ferry::comm's automatic plan: which gradient buckets, and which codec for each, leave the least
// communication exposed after backward on this link.
//
// A pure host function of measured inputs:
// - the link: the all-reduce's bus bandwidth over message sizes (nccl-tests' busbw), measured with the
//   communicator at start-up;
// - the backward's gradient-ready timeline: for each parameter its gradient's size and when it became
//   ready, relative to the start of backward, and when backward ended (learned over the first steps from
//   timing events on the producer's stream);
// - the codecs' local costs: encode and decode time per fp32 byte (measured at start-up), the bytes each
//   puts on the wire, and whether it is lossy;
// - a policy: lossless only (the default), or lossy codecs allowed.
//
// The model (simulate()): gradients fill buckets in ready order (the reducer's bucket plan,
// make_bucket_plan, with the candidate's first bucket and cap), a bucket is launched when its last
// gradient is ready and the previous bucket's communication finished (one communication stream: buckets
// go out in order); a bucket occupies that stream for its encode, its all-reduce of the codec's wire bytes
// and its decode. The exposed time is how long the last bucket's communication outlasts backward; codec
// kernels that run while backward computes take that time from it, and so does each bucket a fixed
// measured amount (per_bucket_compute), so the objective is the exposed time plus the codec time spent
// before backward ended plus the buckets' share.
//
// The search (choose_plan()): every (first bucket, cap) pair of log-spaced candidates from 1 MiB to
// 400 MiB (and a single bucket), and DDP's fixed plans (ddp_plans(): its default 1 MiB then 25 MiB, and
// 100 MiB), so that the search never loses, in the model, to a plan a user gets without it. Under the
// lossless policy every bucket is fp32 (codec none); under the lossy one each candidate gets the best codec
// per bucket: every assignment when there are at most 4096, else the best uniform codec improved one bucket
// at a time while that lowers the objective; and a plan with lossy buckets wins only when it beats the best
// lossless plan by min_lossy_gain of the backward. Ties keep the earlier choice: fewer lossy buckets, larger
// buckets. Deterministic: equal inputs give the identical plan on every rank and every run. How ranks agree:
// rank 0 measures, decides and broadcasts the decision (to_words/from_words: the ready order, the first
// bucket and cap, a codec per bucket, in a fixed-size array of 64-bit words that goes through the
// communicator's broadcast); every rank rebuilds the same bucket plan from it with make_bucket_plan and hands
// it to its reducer between steps.
//
// Host only.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "ferry/comm/bucket_plan.hpp"
#include "ferry/comm/codec.hpp"

namespace ferry::comm {

/// One measured point of a link: an all-reduce of `bytes` bytes ran at `bus_gbps` (nccl-tests' bus
/// bandwidth: bytes * 2(n-1)/n / time, GB = 1e9 bytes).
struct link_point {
  std::uint64_t bytes = 0;
  double bus_gbps = 0;
};

/// The link's all-reduce speed over sizes, for a group of `ranks` ranks. The time of an all-reduce of S
/// bytes is S * 2(n-1)/n / busbw(S), busbw interpolated linearly in log(size) between the points and held
/// at the last point's above it; below the smallest point the time is the smallest point's (a latency
/// floor). One rank: no communication, every all-reduce takes 0, and the bus factor is 0
/// (all_reduce_bus_factor), so a table measured at one rank holds 0 GB/s points.
struct link_table {
  int ranks = 2;
  std::vector<link_point> points;  // sorted by bytes, at least one, every bus_gbps > 0 (or 0 at one rank)

  /// A table from measured (bytes, seconds) pairs of an all-reduce over `ranks` ranks. Throws logic_error
  /// for sizes and times of different counts, a time that is not positive, or a table check() refuses.
  [[nodiscard]] static link_table from_times(int ranks, std::span<const std::uint64_t> bytes,
                                             std::span<const double> seconds);
  /// Seconds of one all-reduce of `bytes` bytes. Throws logic_error for a table check() refuses.
  [[nodiscard]] double all_reduce_seconds(std::uint64_t bytes) const;
  /// Throws logic_error naming the problem: ranks < 1, no point, points not growing in size, a bus
  /// bandwidth that is not a positive finite number (0 is allowed at one rank).
  void check() const;
};

/// A codec's local cost: encode and decode time per byte of the fp32 bucket, plus a fixed cost per call
/// (a kernel launch). What it puts on the wire and whether it is lossy follow from the codec (codec.hpp).
struct codec_cost {
  codec_kind codec = codec_kind::none;
  double encode_ns_per_byte = 0;         // before the all-reduce
  double decode_ns_per_byte = 0;         // after it
  std::chrono::nanoseconds per_call{0};  // per encode and per decode

  /// Seconds to encode plus decode `bytes` fp32 bytes.
  [[nodiscard]] double local_seconds(std::uint64_t bytes) const;
};

/// When each gradient became ready in a backward pass (learned over the first steps), and when backward
/// ended (its last compute), both from the start of backward.
struct ready_timeline {
  std::vector<std::size_t> elements;            // per parameter (registration order): fp32 elements
  std::vector<std::chrono::nanoseconds> ready;  // per parameter
  std::chrono::nanoseconds backward_end{};
};

/// Which codecs the plan may pick. Lossless is the default; lossy codecs only when the caller allows them.
enum class codec_policy : std::uint8_t { lossless, lossy_allowed };

/// What the plan decides from.
struct plan_inputs {
  link_table link;
  ready_timeline timeline;
  std::vector<codec_cost> codecs{codec_cost{}};  // candidates; none (lossless) must be among them
  codec_policy policy = codec_policy::lossless;
  /// Fixed time each bucket adds on the communication stream (its launch and bookkeeping).
  std::chrono::nanoseconds per_bucket{0};
  /// Time each bucket takes from the step's compute while it runs beside backward (its kernels share the
  /// GPU; overlap is not free). Measured, it is what keeps the plan from cutting buckets finer than they
  /// pay: the reducer's bench learns it from how much longer backward runs with many buckets than with one.
  std::chrono::nanoseconds per_bucket_compute{0};
  /// Candidate caps and first-bucket sizes; empty: default_caps() and default_first_buckets().
  std::vector<std::size_t> caps;
  std::vector<std::size_t> first_buckets;
  /// Fixed plans (first bucket, cap) the search always compares besides its candidates; empty:
  /// ddp_plans(). A caller that scales its model scales these as it scales the caps. Their
  /// alignment_bytes is ignored (alignment_bytes below holds).
  std::vector<bucket_plan_options> fixed_plans;
  std::size_t alignment_bytes = 256;  // the reducer's (bucket_plan_options::alignment_bytes)
  /// A plan with lossy buckets is taken only when it beats the best lossless plan by this fraction of
  /// the backward's length: precision is not traded for noise.
  double min_lossy_gain = 0.01;
};

/// 20 caps log-spaced from 1 MiB to 400 MiB.
[[nodiscard]] std::vector<std::size_t> default_caps();
/// First-bucket sizes: 1, 2, 4, 8, 16 and 32 MiB (and, always, "as the cap").
[[nodiscard]] std::vector<std::size_t> default_first_buckets();
/// PyTorch DDP's fixed plans: its default (the first 1 MiB, then 25 MiB) and 100 MiB buckets. One bucket of
/// every gradient is always a candidate besides them. Every plan is searched with codec none and, under
/// the lossy policy, with every codec (the uniform bf16 and fp16 plans among them).
[[nodiscard]] std::vector<bucket_plan_options> ddp_plans();

/// The predicted times of one bucket, in seconds from the start of backward.
struct bucket_forecast {
  double ready_s = 0;  // its last gradient is ready
  double start_s = 0;  // its encode starts: ready, and the previous bucket's communication done
  double end_s = 0;    // its decode ends
};

/// A plan and its prediction.
struct comm_plan {
  bucket_plan_options options;          // first bucket and cap of the candidate (alignment: the inputs')
  bucket_plan layout;                   // make_bucket_plan(elements, ready order, options)
  std::vector<codec_kind> codecs;       // one per bucket of layout
  std::vector<bucket_forecast> timing;  // one per bucket (empty in a plan from from_words)
  double backward_end_s = 0;
  double comm_end_s = 0;  // the last bucket's decode ends
  double exposed_s = 0;   // max(0, comm_end - backward_end)
  double codec_s = 0;     // codec time spent before backward ended (taken from backward's compute)
  double comm_s = 0;      // time the communication stream is busy (encode + all-reduce + decode)
  double bucket_s = 0;    // buckets * per_bucket_compute: what the buckets take from the step's compute
  /// What the search minimises.
  [[nodiscard]] double objective_s() const noexcept { return exposed_s + codec_s + bucket_s; }
  /// Buckets whose codec is lossy.
  [[nodiscard]] std::size_t lossy_buckets() const noexcept;
};

/// Checks the inputs: a link table check() accepts; a timeline with one element count (> 0) and one ready
/// time in [0, backward_end] per parameter; codecs with none among them and costs finite and not negative;
/// caps, first buckets, fixed plans and the alignment as bucket_plan_options allows. Throws logic_error
/// naming the value and the limit.
void check(const plan_inputs& in);

/// The parameters in ready order: by ready time, ties by parameter index.
[[nodiscard]] std::vector<std::size_t> ready_order(const ready_timeline& t);

/// The prediction of an explicit plan: `layout` (a bucket plan of the timeline's parameters) with
/// `codecs[k]` for bucket k. Throws logic_error for a layout of other parameters or a codec count that
/// is not the bucket count.
[[nodiscard]] comm_plan simulate(const plan_inputs& in, const bucket_plan& layout,
                                 std::span<const codec_kind> codecs);

/// The plan of least objective (exposed + codec time during backward + the buckets' share) among the
/// candidates and the fixed plans; a plan with
/// lossy buckets only under the lossy policy and only when it gains min_lossy_gain over the best lossless
/// one. Throws logic_error for inputs check() refuses.
[[nodiscard]] comm_plan choose_plan(const plan_inputs& in);

/// Words of the broadcast form of a plan of `params` parameters: fixed for a group, so every rank posts
/// the same broadcast.
[[nodiscard]] std::size_t plan_words(std::size_t params) noexcept;
/// The decision of `p` (ready order, first bucket and cap, codecs, predicted figures) as plan_words words.
[[nodiscard]] std::vector<std::uint64_t> to_words(const comm_plan& p);
/// The plan of those words, its layout rebuilt with make_bucket_plan from `elements` (the parameters'
/// element counts); no per-bucket timing. Throws logic_error when the words are not a plan of those
/// parameters.
[[nodiscard]] comm_plan from_words(std::span<const std::uint64_t> words,
                                   std::span<const std::size_t> elements, std::size_t alignment_bytes = 256);

}  // namespace ferry::comm
