// The reducer's automatic plan learner (reducer_options::automatic; reducer.hpp says what users see):
// the start-up measurements, the learning schedule over the first steps and the decision on rank 0.
// Private to ferry::comm: the reducer owns one while it learns and calls its hooks from begin_step,
// mark_ready and finish; after the decision took effect the reducer drops it, so the steps after it pay
// nothing for it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "ferry/comm/auto_plan.hpp"
#include "ferry/comm/reducer.hpp"

namespace ferry::comm::detail {

/// Throws logic_error, naming the field, its value and the limit, for automatic options (and the codec
/// beside them) that a reducer of `model_bytes` bytes of fp32 gradients cannot use.
void check_automatic(const reducer_options& options, std::uint64_t model_bytes);

/// A plan the reducer takes at its next begin_step (set_plan's arguments, already valid).
struct next_plan {
  bucket_plan plan;
  std::vector<codec_kind> codecs;
};

/// See the header's comment. Steps are the reducer's, from 1; with L = learn_steps:
///   1            the first step (one bucket; the reducer's rebuild follows it)
///   2 .. 1+L     timeline: a timing event per parameter on its producer, backward's end on finish's stream
///   2+L .. 1+2L  the probe's buckets, untimed: the host gets ahead of the device as in training
///   2+2L .. 1+3L the probe's buckets, timed from the first gradient to backward's end
/// At the finish of 1+L the probe plan is handed over, at the finish of 1+3L the decision.
class auto_tuner {
 public:
  /// Measures the link (collective: every rank constructs its reducer at the same point) and, under the
  /// lossy policy, the codecs, on `cs` over `scratch` (at least the model's bytes, overwritten), and makes
  /// every event the learning needs. `options` passed check_automatic.
  auto_tuner(communicator& comm, std::span<const std::size_t> elements, const reducer_options& options,
             mem_view scratch, stream_view cs);
  auto_tuner(const auto_tuner&) = delete;
  auto_tuner& operator=(const auto_tuner&) = delete;
  ~auto_tuner();

  /// The reducer opened step `step`.
  void begin_step(std::uint64_t step);
  /// Parameter p was marked ready on `producer`; `first`: the first mark of the step.
  void mark_ready(std::size_t p, stream_view producer, bool first);
  /// finish(s) of a step whose marks are all in: backward ends here on `s` (before s waits for the buckets).
  void record_end(stream_view s);
  /// After finish(): learns from the step (host syncs), and returns the plan to take next, if any. At the
  /// last learning step, decides: rank 0 chooses, the decision is broadcast on `cs`. `current` is the
  /// plan that ran (its order, rank 0's since the rebuild, is the probe's).
  [[nodiscard]] std::optional<next_plan> end_step(const bucket_plan& current, stream_view cs);
  /// The decision, once end_step made it.
  [[nodiscard]] const std::optional<auto_decision>& decision() const noexcept { return decision_; }

 private:
  enum class phase : std::uint8_t { first, timeline, probe, probe_timed };

  [[nodiscard]] plan_inputs inputs(double per_bucket_ms) const;
  [[nodiscard]] next_plan decide(stream_view cs);

  communicator& comm_;
  std::vector<std::size_t> elements_;
  std::size_t alignment_;
  auto_plan_options options_;
  link_table link_;
  std::vector<codec_cost> codecs_;

  std::uint64_t step_ = 0;
  phase phase_ = phase::first;
  std::size_t first_ = 0;  // the first parameter marked in the step
  // Timeline steps: an event per parameter, backward's end, and the sums over the steps (ms from the first
  // mark).
  std::vector<event> ready_;
  event end_;
  std::vector<double> ready_ms_;
  double end_ms_ = 0;
  int timeline_steps_ = 0;
  // Timed probe steps: the first mark and backward's end of each.
  std::vector<event> probe_first_, probe_end_;
  std::size_t probe_buckets_ = 0;
  std::optional<auto_decision> decision_;
};

}  // namespace ferry::comm::detail
