// The reducer's automatic plan (auto_tuner.hpp): its options' checks, the start-up measurements
// (plan_measure.hpp: the link over sizes, the codecs' local cost), the learning over the first steps and
// the decision made on rank 0 and broadcast.
#include "auto_tuner.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <exception>

#include "ferry/comm/bucket_codec.hpp"
#include "ferry/comm/f32_ops.hpp"
#include "ferry/comm/plan_measure.hpp"
#include "ferry/core/clock.hpp"
#include "ferry/core/error.hpp"
#include "ferry/core/units.hpp"

namespace ferry::comm {

namespace {

// All-reduces timed per link size (after one warm-up).
constexpr int link_iters = 3;
// More learning steps than this is a mistake (each is a step of training, and each timed probe step
// holds two events).
constexpr int max_learn_steps = 1000;

std::chrono::nanoseconds ns_of_ms(double ms) {
  return std::chrono::nanoseconds(static_cast<std::int64_t>(std::llround(ms * 1e6)));
}

}  // namespace

// ---- measurements (plan_measure.hpp) ----

std::vector<double> time_all_reduce(communicator& c, mem_view scratch, std::span<const std::uint64_t> sizes,
                                    int iters, stream_view s) {
  FERRY_EXPECTS(iters >= 1, fmt::format("time_all_reduce of {} iterations: at least 1", iters));
  for (const std::uint64_t bytes : sizes) {
    FERRY_EXPECTS(bytes > 0 && bytes % sizeof(float) == 0 && bytes <= scratch.bytes,
                  fmt::format("time_all_reduce of {} bytes: a size must be a positive multiple of 4 bytes "
                              "(fp32 elements) within the scratch's {} bytes",
                              bytes, scratch.bytes));
  }
  std::vector<double> out;
  out.reserve(sizes.size());
  for (const std::uint64_t bytes : sizes) {
    const std::size_t count = bytes / sizeof(float);
    const mem_view v = scratch.subview(0, bytes);
    static_cast<void>(c.all_reduce(v, v, count, dtype::f32, reduce_op::avg, s));
    c.barrier(s).synchronize();
    const auto t0 = steady_clock::now();
    for (int i = 0; i < iters; ++i)
      static_cast<void>(c.all_reduce(v, v, count, dtype::f32, reduce_op::avg, s));
    s.synchronize();
    // A clock too coarse for a tiny all-reduce must not make the link infinitely fast (link_table refuses).
    out.push_back(std::max(1e-9, seconds_since(t0) / iters));
  }
  return out;
}

// An element-wise codec's encode and decode (its registered parts), each timed at two sizes.
codec_cost measure_codec(codec_kind codec, mem_view scratch, mem_view wire, int world_size, stream_view s) {
  const elementwise_parts& parts = *codec_info(codec).elementwise;
  const std::size_t big = scratch.bytes / sizeof(float);
  const std::size_t small = std::min<std::size_t>(1024, big);
  auto time = [&](std::size_t count, bool encode) {
    constexpr int iters = 3;
    if (encode) parts.encode(scratch, wire, count, world_size, s);  // warm-up
    s.synchronize();
    const auto t0 = steady_clock::now();
    for (int i = 0; i < iters; ++i) {
      if (encode) {
        parts.encode(scratch, wire, count, world_size, s);
      } else {
        parts.decode(wire, scratch, count, s);
      }
    }
    s.synchronize();
    return seconds_since(t0) / iters;
  };
  codec_cost c;
  c.codec = codec;
  double per_call = 0;
  for (const bool encode : {true, false}) {
    const double t_small = time(small, encode);
    const double t_big = time(big, encode);
    const auto bytes_small = static_cast<double>(small * sizeof(float));
    const auto bytes_big = static_cast<double>(big * sizeof(float));
    const double per_byte = big > small ? std::max(0.0, (t_big - t_small) / (bytes_big - bytes_small)) : 0.0;
    (encode ? c.encode_ns_per_byte : c.decode_ns_per_byte) = per_byte * 1e9;
    per_call += std::max(0.0, t_small - per_byte * bytes_small) / 2;
  }
  c.per_call = std::chrono::nanoseconds(static_cast<std::int64_t>(per_call * 1e9));
  return c;
}

std::vector<std::uint64_t> default_link_sizes(std::uint64_t model_bytes) {
  const std::uint64_t top = model_bytes / sizeof(float) * sizeof(float);
  // Below its smallest point the link table holds that point's time, so a small model starts lower: its
  // buckets are smaller than 1 MiB, and their all-reduces faster.
  const std::uint64_t start = std::min<std::uint64_t>(1 * MiB, std::max<std::uint64_t>(4 * KiB, top / 64));
  std::vector<std::uint64_t> out;
  for (std::uint64_t s = start / sizeof(float) * sizeof(float); s < top; s *= 4) out.push_back(s);
  out.push_back(top);
  return out;
}

namespace detail {

// ---- options ----

void check_automatic(const reducer_options& options, std::uint64_t model_bytes) {
  const auto_plan_options& a = options.automatic;
  FERRY_EXPECTS(options.codec == codec_kind::none,
                fmt::format("reducer_options::codec = {} with automatic.enabled: the automatic plan chooses "
                            "each bucket's codec itself (automatic.policy allows lossy ones); leave codec "
                            "at none",
                            to_string(options.codec)));
  FERRY_EXPECTS(a.learn_steps >= 1 && a.learn_steps <= max_learn_steps,
                fmt::format("reducer_options::automatic.learn_steps = {}: must be in [1, {}] (each learning "
                            "phase needs a step; 1 + 3 x learn_steps steps run before the decision)",
                            a.learn_steps, max_learn_steps));
  FERRY_EXPECTS(a.policy == codec_policy::lossless || a.policy == codec_policy::lossy_allowed,
                fmt::format("reducer_options::automatic.policy = {} is not a codec policy",
                            static_cast<int>(a.policy)));
  FERRY_EXPECTS(std::isfinite(a.min_lossy_gain) && a.min_lossy_gain >= 0,
                fmt::format("reducer_options::automatic.min_lossy_gain = {}: must be a finite fraction >= 0",
                            a.min_lossy_gain));
  for (std::size_t k = 0; k < a.caps.size(); ++k) {
    FERRY_EXPECTS(a.caps[k] > 0,
                  fmt::format("reducer_options::automatic.caps[{}] = 0: a cap must be > 0", k));
  }
  for (std::size_t k = 0; k < a.first_buckets.size(); ++k) {
    FERRY_EXPECTS(
        a.first_buckets[k] > 0,
        fmt::format("reducer_options::automatic.first_buckets[{}] = 0: a first bucket must be > 0", k));
  }
  for (std::size_t k = 0; k < a.fixed_plans.size(); ++k) {
    const bucket_plan_options& f = a.fixed_plans[k];
    FERRY_EXPECTS(
        f.first_bucket_bytes > 0 && f.bucket_cap_bytes > 0,
        fmt::format("reducer_options::automatic.fixed_plans[{}] has a first bucket of {} and a cap of "
                    "{} bytes: both must be > 0",
                    k, f.first_bucket_bytes, f.bucket_cap_bytes));
  }
  FERRY_EXPECTS(
      a.probe.first_bucket_bytes > 0 && a.probe.bucket_cap_bytes > 0,
      fmt::format("reducer_options::automatic.probe has a first bucket of {} and a cap of {} bytes: "
                  "both must be > 0",
                  a.probe.first_bucket_bytes, a.probe.bucket_cap_bytes));
  for (std::size_t k = 0; k < a.link_sizes.size(); ++k) {
    const std::uint64_t s = a.link_sizes[k];
    FERRY_EXPECTS(
        s > 0 && s % sizeof(float) == 0 && s <= model_bytes,
        fmt::format("reducer_options::automatic.link_sizes[{}] = {} bytes: a size must be a positive "
                    "multiple of 4 (fp32 elements) up to the model's {} bytes of gradients",
                    k, s, model_bytes));
    FERRY_EXPECTS(
        k == 0 || s > a.link_sizes[k - 1],
        fmt::format("reducer_options::automatic.link_sizes[{}] = {} bytes follows {} bytes: sizes must "
                    "grow",
                    k, s, a.link_sizes[k - 1]));
  }
}

// ---- the learner ----

auto_tuner::auto_tuner(communicator& comm, std::span<const std::size_t> elements,
                       const reducer_options& options, mem_view scratch, stream_view cs)
    : comm_(comm),
      elements_(elements.begin(), elements.end()),
      alignment_(options.plan.alignment_bytes),
      options_(options.automatic) {
  device& dev = comm.dev();
  std::uint64_t model = 0;
  for (const std::size_t n : elements_) model += n * sizeof(float);
  // Finite values in the scratch: the codecs scale by the largest.
  const mem_view data = scratch.subview(0, model);
  fill_f32_async(data, model / sizeof(float),
                 f32_fill{0.5F, 1.0F, static_cast<std::uint64_t>(comm.rank()), 1}, cs);
  const std::vector<std::uint64_t> sizes =
      options_.link_sizes.empty() ? default_link_sizes(model) : options_.link_sizes;
  link_ = link_table::from_times(comm.size(), sizes, time_all_reduce(comm, data, sizes, link_iters, cs));
  codecs_ = {codec_cost{}};
  // The registry's automatic codecs: the lossless ones always, the lossy ones under the lossy policy; for
  // 16-bit gradients none alone (every other codec takes f32 gradients).
  std::vector<codec_kind> candidates;
  for (const codec_kind c : automatic_codecs()) {
    if (options.grad_type != dtype::f32) break;
    if (!lossy(c) || options_.policy == codec_policy::lossy_allowed) candidates.push_back(c);
  }
  if (!candidates.empty()) {
    const std::size_t count = model / sizeof(float);
    std::size_t wire_size = 0;
    for (const codec_kind c : candidates) wire_size = std::max(wire_size, wire_bytes(c, count));
    const buffer wire = dev.alloc_device(wire_size);
    for (const codec_kind c : candidates)
      codecs_.push_back(measure_codec(c, data, wire.view(), comm.size(), cs));
  }
  ready_.reserve(elements_.size());
  for (std::size_t p = 0; p < elements_.size(); ++p) ready_.push_back(dev.make_timing_event());
  end_ = dev.make_timing_event();
  ready_ms_.assign(elements_.size(), 0);
  for (int i = 0; i < options_.learn_steps; ++i) {
    probe_first_.push_back(dev.make_timing_event());
    probe_end_.push_back(dev.make_timing_event());
  }
}

auto_tuner::~auto_tuner() = default;

void auto_tuner::begin_step(std::uint64_t step) {
  step_ = step;
  const auto l = static_cast<std::uint64_t>(options_.learn_steps);
  if (step <= 1) {
    phase_ = phase::first;
  } else if (step <= 1 + l) {
    phase_ = phase::timeline;
  } else if (step <= 1 + 2 * l) {
    phase_ = phase::probe;
  } else {
    phase_ = phase::probe_timed;
  }
}

void auto_tuner::mark_ready(std::size_t p, stream_view producer, bool first) {
  if (phase_ == phase::timeline) {
    ready_[p].record(producer);
    if (first) first_ = p;
  } else if (phase_ == phase::probe_timed && first) {
    probe_first_[static_cast<std::size_t>(step_ - 2 - 2 * static_cast<std::uint64_t>(options_.learn_steps))]
        .record(producer);
  }
}

void auto_tuner::record_end(stream_view s) {
  if (phase_ == phase::timeline) {
    end_.record(s);
  } else if (phase_ == phase::probe_timed) {
    probe_end_[static_cast<std::size_t>(step_ - 2 - 2 * static_cast<std::uint64_t>(options_.learn_steps))]
        .record(s);
  }
}

std::optional<next_plan> auto_tuner::end_step(const bucket_plan& current, stream_view cs) {
  const auto l = static_cast<std::uint64_t>(options_.learn_steps);
  if (phase_ == phase::timeline) {
    // The reducer does not know when backward started, so every time is taken from the step's first
    // marked gradient. The model's exposed time and objective depend only on differences of these times
    // (a shift of every ready time and of backward's end moves every bucket's start and end alike), so
    // the compute before the first gradient changes nothing but backward_s, and min_lossy_gain's share of
    // it.
    device& dev = comm_.dev();
    const event& first = ready_[first_];
    end_.synchronize();
    for (std::size_t p = 0; p < elements_.size(); ++p) {
      ready_[p].synchronize();  // another producer stream than finish's may still run
      if (p != first_) ready_ms_[p] += dev.elapsed_ms(first, ready_[p]);
    }
    end_ms_ += dev.elapsed_ms(first, end_);
    ++timeline_steps_;
    if (step_ != 1 + l) return std::nullopt;
    // Next: the probe's buckets, in the order of the plan that ran (rank 0's since the rebuild, so the
    // same on every rank).
    bucket_plan probe =
        make_bucket_plan(elements_, current.order(),
                         {options_.probe.first_bucket_bytes, options_.probe.bucket_cap_bytes, alignment_});
    probe_buckets_ = probe.buckets.size();
    return next_plan{std::move(probe), {codec_kind::none}};
  }
  if (phase_ == phase::probe_timed && step_ == 1 + 3 * l) return decide(cs);
  return std::nullopt;
}

// Rank 0's inputs: the link and codecs measured at construction, the mean timeline, and what each probe
// bucket took from backward.
plan_inputs auto_tuner::inputs(double per_bucket_ms) const {
  plan_inputs in;
  in.link = link_;
  in.codecs = codecs_;
  in.policy = options_.policy;
  in.min_lossy_gain = options_.min_lossy_gain;
  in.caps = options_.caps;
  in.first_buckets = options_.first_buckets;
  in.fixed_plans = options_.fixed_plans;
  in.alignment_bytes = alignment_;
  in.per_bucket_compute = ns_of_ms(per_bucket_ms);
  const auto steps = static_cast<double>(timeline_steps_);
  // Backward ends on finish's stream, or with its last gradient if that stream saw it earlier (a
  // producer stream other than the one finish() is given).
  double end_ms = end_ms_ / steps;
  for (const double r : ready_ms_) end_ms = std::max(end_ms, r / steps);
  in.timeline.elements = elements_;
  in.timeline.backward_end = ns_of_ms(end_ms);
  for (const double r : ready_ms_)
    in.timeline.ready.push_back(
        std::clamp(ns_of_ms(r / steps), std::chrono::nanoseconds(0), in.timeline.backward_end));
  return in;
}

next_plan auto_tuner::decide(stream_view cs) {
  device& dev = comm_.dev();
  // What each bucket took from backward: its length beside the probe's buckets over its length beside
  // one bucket (both from the first gradient), per bucket beyond the first.
  double many_ms = 0;
  for (std::size_t k = 0; k < probe_end_.size(); ++k) {
    probe_first_[k].synchronize();
    probe_end_[k].synchronize();
    many_ms += dev.elapsed_ms(probe_first_[k], probe_end_[k]);
  }
  many_ms /= static_cast<double>(probe_end_.size());
  const double one_ms = end_ms_ / static_cast<double>(timeline_steps_);
  const double per_bucket_ms =
      probe_buckets_ > 1 ? std::max(0.0, many_ms - one_ms) / static_cast<double>(probe_buckets_ - 1) : 0.0;

  // Rank 0 decides; the plan's words and its per-bucket cost go to every rank. A failure on rank 0 still
  // posts the broadcast (zeros), so the other ranks learn of it instead of waiting for the timeout.
  const std::size_t params = elements_.size();
  const std::size_t words = plan_words(params) + 1;
  buffer host = dev.alloc_pageable(words * sizeof(std::uint64_t));
  buffer device_words = dev.alloc_device(words * sizeof(std::uint64_t));
  auto* w = reinterpret_cast<std::uint64_t*>(host.host_bytes());
  std::fill(w, w + words, 0);
  std::exception_ptr failed;
  if (comm_.rank() == 0) {
    try {
      const std::vector<std::uint64_t> v = to_words(choose_plan(inputs(per_bucket_ms)));
      std::copy(v.begin(), v.end(), w);
      w[words - 1] = std::bit_cast<std::uint64_t>(per_bucket_ms * 1e3);
    } catch (...) {
      failed = std::current_exception();
      std::fill(w, w + words, 0);
    }
    dev.copy(device_words.view(), host.view(), cs);
  }
  static_cast<void>(comm_.broadcast(device_words.view(), device_words.view(), words, dtype::u64, 0, cs));
  dev.copy(host.view(), device_words.view(), cs);
  if (failed) std::rethrow_exception(failed);
  FERRY_EXPECTS(w[0] != 0, fmt::format("rank {}: rank 0 could not choose the automatic plan at step {} (its "
                                       "error is raised on rank 0)",
                                       comm_.rank(), step_));
  comm_plan p = from_words(std::span<const std::uint64_t>(w, words - 1), elements_, alignment_);
  decision_ = auto_decision{p.layout.buckets.size(),
                            p.options.first_bucket_bytes,
                            p.options.bucket_cap_bytes,
                            p.lossy_buckets(),
                            p.exposed_s,
                            p.backward_end_s,
                            std::bit_cast<double>(w[words - 1]),
                            probe_buckets_,
                            step_};
  return next_plan{std::move(p.layout), std::move(p.codecs)};
}

}  // namespace detail

}  // namespace ferry::comm
