// ferry::comm reducer: averages every rank's gradients over a communicator, bucket by bucket, while
// backward is still producing them. The design: docs/COMM.md (Note [A step launches its buckets in plan
// order], Note [Plans change only between steps], Note [A codec lives as long as its bucket], Note [The
// automatic plan learns over the first steps], Note [16-bit gradients live in 4-byte slots]).
//
// Gradients live in the reducer's flat buffer, laid out by a bucket plan (bucket_plan.hpp); grad(p) is
// parameter p's gradient, and the caller's gradient tensors are views of it. A step is
//
//   begin_step();                       // before anything writes a gradient of the step
//   ... backward writes grad(p) on a producer stream, then calls mark_ready(p, producer) ...
//   finish(optimizer_stream);           // the optimizer's stream waits for the averaged gradients
//
// Each bucket's exchange is its codec's reduce_async (bucket_codec.hpp) on the communication stream, in
// plan order. Gradient views change only inside begin_step(), when generation() changes.
//
// Every rank makes its reducer with the same parameter sizes and options, and calls begin_step, mark_ready
// (in any order), finish and set_plan alike: the buckets' collectives are matched by issue order.
//
// Threads: one reducer belongs to one rank; its calls come from one thread at a time (the autograd
// thread that calls mark_ready may differ from the thread that calls begin_step/finish, if the caller
// orders them). Errors: misuse throws logic_error before any work is queued (the messages name the
// parameter, the bucket and the step); a failed or aborted group throws comm_error from the collective
// call, or at the next synchronize of the communication stream.
#pragma once

#include <any>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "ferry/comm/auto_plan.hpp"
#include "ferry/comm/bucket_codec.hpp"
#include "ferry/comm/bucket_plan.hpp"
#include "ferry/comm/codec.hpp"
#include "ferry/comm/communicator.hpp"
#include "ferry/device/device.hpp"

namespace ferry::comm {

namespace detail {
class auto_tuner;
}

/// The automatic plan's options (docs/COMM.md, Note [The automatic plan learns over the first steps]). Sizes
/// are bytes of fp32 gradient.
struct auto_plan_options {
  /// The reducer learns and chooses its plan itself.
  bool enabled = false;
  /// Lossy codecs (bf16, fp16) only when allowed.
  codec_policy policy = codec_policy::lossless;
  /// Steps of each learning phase (>= 1): the timeline, then twice this many with the probe's buckets.
  int learn_steps = 3;
  /// plan_inputs::min_lossy_gain: the fraction of backward a lossy plan must gain over the lossless one.
  double min_lossy_gain = 0.01;
  /// Candidates of the search; empty: default_caps() and default_first_buckets().
  std::vector<std::size_t> caps, first_buckets;
  /// All-reduce sizes timed at construction (growing, multiples of 4, at most the model's bytes); empty:
  /// default_link_sizes(), x4 from 1 MiB (less for a small model) to the model's bytes.
  std::vector<std::uint64_t> link_sizes;
  /// plan_inputs::fixed_plans: DDP's plans the search always compares; empty: ddp_plans().
  std::vector<bucket_plan_options> fixed_plans;
  /// The buckets of the probe steps (first bucket, cap; the alignment is options.plan's): DDP's default.
  /// A caller that scales its model scales this, the caps, the fixed plans and the link sizes alike.
  bucket_plan_options probe{};
};

/// Options of a reducer.
struct reducer_options {
  /// Caps and alignment of the plans the reducer makes itself (the first one and the rebuild).
  bucket_plan_options plan{};
  /// The codec of every bucket of the plans the reducer makes itself (set_plan gives one per bucket).
  codec_kind codec = codec_kind::none;
  /// Options of the codecs that take some (powersgd_options for powersgd_kind: rank, compression rule,
  /// warm start, seed), each of the type of its registry entry's options (bucket_codec.hpp); a codec
  /// missing here takes its entry's defaults. The constructor checks them (check_codec_options).
  std::map<codec_kind, std::any> codec_options;
  /// Rebuild the plan once, from the order gradients became ready in the first step (rank 0's).
  bool rebuild = true;
  /// Record timing events around each bucket's work on the communication stream (last_step_timing).
  bool timing = false;
  /// The automatic plan: learned over the first steps, chosen on rank 0, the same on every rank.
  auto_plan_options automatic{};
  /// The gradients' element type: f32, or bf16 / f16 for parameters trained in that type (pure
  /// low-precision training; mixed precision under autocast keeps f32 gradients). 16-bit gradients take
  /// codec none only (the lossy codecs compress f32), under the lossless policy.
  dtype grad_type = dtype::f32;
  /// The type the average is computed in: empty for grad_type itself (16-bit gradients all-reduced as
  /// they are, half the bytes of f32), or f32 for 16-bit gradients widened into the scratch, averaged in
  /// f32 and rounded back once (twice the bytes on the wire, one rounding instead of one per partial sum).
  std::optional<dtype> reduce_type;
};

/// The automatic plan's decision, identical on every rank (rank 0's, broadcast).
struct auto_decision {
  std::size_t buckets = 0;             // of the chosen plan
  std::size_t first_bucket_bytes = 0;  // the plan's first bucket and cap (one bucket: both its bytes)
  std::size_t bucket_cap_bytes = 0;
  std::size_t lossy_buckets = 0;      // buckets whose codec is lossy
  double predicted_exposed_s = 0;     // the model's exposed communication after backward (0 at one rank)
  double backward_s = 0;              // the learned backward, from its first gradient (0 at one rank)
  double per_bucket_compute_us = 0;   // what each bucket took from backward in the probe steps
  std::size_t probe_buckets = 0;      // buckets of the probe steps (0 at one rank: no probe)
  std::uint64_t decided_at_step = 0;  // the step at whose finish() it was made (0: at construction)
};

/// Counters since construction (bucket_launches: since the current plan took effect).
struct reducer_stats {
  std::uint64_t steps = 0;             // finished steps
  std::uint64_t buckets_launched = 0;  // all-reduces issued
  /// Bytes this rank handed to its all-reduces (count * wire element size): the payload. A ring
  /// all-reduce moves 2(n-1)/n of it in and out of each rank.
  std::uint64_t wire_bytes = 0;      // a codec's bucket_codec::wire_bytes (PowerSGD: both all-reduces')
  std::uint64_t gradient_bytes = 0;  // gradient bytes those all-reduces averaged (padding included)
  std::uint64_t plan_changes = 0;    // plans (new layouts or new codecs) that took effect after the first
  std::vector<std::uint64_t> bucket_launches;  // per bucket of the current plan
};

/// One bucket of the last finished step on the communication stream, in milliseconds since the step's
/// begin_step() (as that stream saw it; modelled time on the host backend).
/// A codec with several all-reduces marks them as one (PowerSGD: its whole work, stages included).
struct bucket_timing {
  double start_ms = 0;         // the bucket's first operation (encode, or the all-reduce) started
  double reduce_start_ms = 0;  // its all-reduce started
  double reduce_end_ms = 0;    // its all-reduce ended
  double end_ms = 0;           // its last operation (decode, or the all-reduce) ended
};

/// See the header's comment.
class reducer {
 public:
  /// A reducer for parameters of `param_elements` elements each (registration order; of
  /// options.grad_type, f32 by default), over `comm`,
  /// which must outlive it. Allocates the flat buffer, the wire buffer and its events, and makes its
  /// communication stream on comm.dev(). Throws logic_error for bad options or sizes (as
  /// make_bucket_plan).
  reducer(communicator& comm, std::span<const std::size_t> param_elements, reducer_options options = {});
  /// The same for parameters of known 2-D shapes (a gradient is a row-major rows x cols matrix; a 1-D
  /// tensor of n elements is {n, 1}; a higher-dimensional one is {first dimension, the product of the
  /// others}, as PyTorch's PowerSGD views it). The codecs see them (bucket_setup::shapes; PowerSGD is the
  /// built-in one that uses them); the reducer of param_elements gives every parameter the shape {n, 1},
  /// so PowerSGD sends it whole.
  reducer(communicator& comm, std::span<const matrix_shape> param_shapes, reducer_options options = {});
  reducer(const reducer&) = delete;
  reducer& operator=(const reducer&) = delete;
  /// Waits for the communication stream (never throws: an error of the group is reported, not raised).
  ~reducer();
  // With options.automatic.enabled, both constructors also measure the link (collective) and the codecs
  // on the communication stream, and throw logic_error for automatic options out of range, naming the
  // field, its value and the limit.

  [[nodiscard]] std::size_t param_count() const noexcept { return sizes_.size(); }
  /// The gradients' element type (options.grad_type).
  [[nodiscard]] dtype grad_type() const noexcept { return options_.grad_type; }
  /// What the plans count per parameter: its elements for f32 gradients, its 4-byte slots for 16-bit
  /// ones (docs/COMM.md, Note [16-bit gradients live in 4-byte slots]). A plan for set_plan is made over
  /// these (make_bucket_plan).
  [[nodiscard]] std::span<const std::size_t> plan_sizes() const noexcept { return sizes_; }
  [[nodiscard]] communicator& comm() const noexcept { return *comm_; }
  /// The communication stream: bucket work runs on it.
  [[nodiscard]] stream_view comm_stream() const { return comm_stream_.view(); }

  /// The current plan and the codec of each of its buckets.
  [[nodiscard]] const bucket_plan& plan() const noexcept { return plan_; }
  [[nodiscard]] std::span<const codec_kind> codecs() const noexcept { return codecs_; }
  /// Counts the layouts that took effect: 0 for the first, +1 at every change of the buckets (in
  /// begin_step); a change of codecs alone keeps the layout, its views and this count.
  [[nodiscard]] std::uint64_t generation() const noexcept { return generation_; }
  /// True while a new plan waits for the next begin_step().
  [[nodiscard]] bool plan_pending() const noexcept { return pending_ != nullptr; }
  /// True while the first step's rebuild is still to be done (at the next begin_step()).
  [[nodiscard]] bool rebuild_due() const noexcept { return rebuild_due_; }

  /// Parameter p's gradient: device memory of comm.dev(), valid until generation() changes. Throws
  /// logic_error for p out of range.
  [[nodiscard]] mem_view grad(std::size_t p) const;
  /// The whole flat buffer (every gradient and the padding between them), e.g. to zero them all at once.
  [[nodiscard]] mem_view flat() const noexcept { return flat_.view(); }

  /// Opens a step. Applies a pending plan (docs/COMM.md, Note [Plans change only between steps]) and does the
  /// first step's rebuild: these are host syncs, once per plan change. Throws logic_error while a step is
  /// open.
  void begin_step();
  /// Parameter p's gradient is complete on `producer` (work queued on it so far writes it). Launches the
  /// buckets that can go, in order, on the communication stream. Throws logic_error, with nothing queued,
  /// outside a step, for p out of range, for p already marked this step, or a producer stream of another
  /// device; comm_error when the group was aborted.
  void mark_ready(std::size_t p, stream_view producer);
  /// Closes the step: `s` waits for the last bucket's work. Throws logic_error naming the parameters that
  /// were never marked (the step stays open: mark them, then finish again), outside a step, or for a
  /// stream of another device. While learning(), `s` should be the stream backward ran on (its end is
  /// timed there), and the last learning step's finish() makes the decision: a broadcast from rank 0 and
  /// a host sync; it throws comm_error when the group fails, logic_error when rank 0 could not decide (the
  /// step is closed either way).
  void finish(stream_view s);

  /// Replaces the plan at the next begin_step(): `plan` must lay out this reducer's parameters (validate
  /// against plan_sizes(): slots for 16-bit gradients) with the reducer's alignment; for 16-bit gradients
  /// every codec must be none; `codecs` holds one codec per bucket, or one for all. Cancels a rebuild
  /// not yet done. Call it between steps, with the same arguments on every rank. Throws logic_error, also
  /// while learning() (the automatic plan sets the plans then).
  void set_plan(bucket_plan plan, std::vector<codec_kind> codecs);

  /// The parameters in the order they were marked ready in the current (or else the last) step.
  [[nodiscard]] std::span<const std::size_t> observed_order() const noexcept { return observed_; }
  [[nodiscard]] reducer_stats stats() const { return stats_; }
  /// Bucket b's codec (bucket_codec.hpp), e.g. its state between steps: error_feedback() is in the
  /// bucket's layout (element i of the bucket is flat element plan().buckets[b].offset + i), and
  /// powersgd_state() (powersgd_codec.hpp) gives a PowerSGD bucket's. Valid until the bucket's codec or
  /// the layout changes (begin_step after set_plan). Throws logic_error for b out of range.
  [[nodiscard]] const bucket_codec& codec(std::size_t b) const;
  /// Each bucket's times in the last finished step. Waits for the step's timing events (a host sync).
  /// Throws logic_error without options.timing, before any step finished, or while a step is open.
  [[nodiscard]] std::vector<bucket_timing> last_step_timing() const;

  /// The automatic plan's decision: present from the finish() of the last learning step (at world size 1,
  /// from construction); empty without options.automatic.enabled.
  [[nodiscard]] const std::optional<auto_decision>& auto_result() const noexcept { return auto_result_; }
  /// True while the automatic plan learns: from construction until the begin_step() that puts the decided
  /// plan into effect. False at world size 1 and without options.automatic.enabled.
  [[nodiscard]] bool learning() const noexcept { return tuner_ != nullptr; }

 private:
  struct bucket_state;

  void install(const bucket_plan& plan, std::vector<codec_kind> codecs);
  [[nodiscard]] std::unique_ptr<bucket_codec> make_codec(const bucket_plan& plan, std::size_t b,
                                                         codec_kind c);
  void exchange_order();
  void apply_pending();
  void launch(std::size_t b);
  void flush_producers();
  void queue_plan(bucket_plan plan, std::vector<codec_kind> codecs);
  void start_automatic();

  communicator* comm_;
  // The plans see every parameter as sizes_[p] 4-byte slots (its bytes rounded up to 4): for f32
  // gradients its elements, for 16-bit ones half of them, rounded up (the odd one's last 2 bytes are
  // padding). elements_[p] counts its elements of options_.grad_type.
  std::vector<std::size_t> sizes_;
  std::vector<std::size_t> elements_;
  std::vector<matrix_shape> shapes_;
  reducer_options options_;
  stream comm_stream_;

  bucket_plan plan_;
  std::vector<codec_kind> codecs_;
  buffer flat_;
  buffer wire_;  // scratch lent to every bucket's codec: they run one after another on comm_stream_
  std::vector<bucket_state> buckets_;
  std::vector<std::size_t> bucket_of_;

  struct pending_plan;
  std::unique_ptr<pending_plan> pending_;
  bool rebuild_due_ = false;
  buffer order_dev_;   // the rebuild's exchange of rank 0's order (device memory)
  buffer order_host_;  // and its pinned staging

  // The step.
  bool open_ = false;
  bool finished_once_ = false;
  std::uint64_t step_ = 0;  // the current or last step, from 1; marked_[p] == step_ once p is marked in it
  std::vector<std::uint64_t> marked_;   // per parameter
  std::vector<std::size_t> observed_;   // marks of the step, in order (capacity reserved)
  std::size_t next_launch_ = 0;         // the next bucket to launch
  std::vector<stream_view> producers_;  // producer streams that marked since the last launch
  event ready_;                         // recorded on producers, waited for by comm_stream_
  event done_;                          // recorded on comm_stream_ after the last bucket
  event step_start_;                    // timing: the step's begin on comm_stream_
  std::uint64_t generation_ = 0;
  reducer_stats stats_;

  // The automatic plan: its learner while it learns (null after, and without it), and its decision.
  std::unique_ptr<detail::auto_tuner> tuner_;
  std::optional<auto_decision> auto_result_;
};

}  // namespace ferry::comm
