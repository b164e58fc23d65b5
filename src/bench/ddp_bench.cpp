// `ferry bench ddp` (ddp_bench.hpp): data-parallel steps of a synthetic ViT-L/32 over ferry::comm's reducer.
#include "ferry/bench/ddp_bench.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <exception>
#include <functional>
#include <limits>
#include <mutex>
#include <optional>
#include <span>
#include <thread>
#include <vector>

#include "ferry/comm/auto_plan.hpp"
#include "ferry/comm/bus_factor.hpp"
#include "ferry/comm/codec.hpp"
#include "ferry/comm/f32_ops.hpp"
#include "ferry/comm/plan_measure.hpp"
#include "ferry/comm/powersgd_codec.hpp"
#include "ferry/comm/reducer.hpp"
#include "ferry/core/clock.hpp"
#include "ferry/core/error.hpp"
#include "ferry/core/units.hpp"
#include "ferry/trace/range.hpp"

namespace ferry::bench {
namespace {

using comm::codec_kind;

constexpr double reference_step_ms = 83.0;
constexpr int model_units = 26;            // the patch embedding, 24 encoder layers, the head
constexpr std::uint64_t max_ranks = 1024;  // fill seeds: parameter * max_ranks + rank
constexpr std::size_t alignment = 256;     // the reducer's (bucket_plan_options::alignment_bytes)

// ---- the model ----

std::vector<model_param> make_vit_l32() {
  std::vector<model_param> p;
  // A parameter of `rows` x `cols` (PowerSGD's view of it); a 1-D one of n elements is n x 1.
  auto add = [&p](std::string name, std::size_t rows, std::size_t cols, int unit) {
    p.push_back({std::move(name), rows * cols, unit, {rows, cols}});
  };
  // VisionTransformer's own parameter, then conv_proj, then the encoder's own (pos_embedding): the patch
  // embedding unit.
  add("class_token", 1, 1024, 0);  // 1 x 1 x 1024
  add("conv_proj.weight", 1024, 3 * 32 * 32, 0);
  add("conv_proj.bias", 1024, 1, 0);
  add("encoder.pos_embedding", 1, 50 * 1024, 0);  // 1 x 50 x 1024
  for (int l = 0; l < 24; ++l) {
    const std::string pre = fmt::format("encoder.layers.encoder_layer_{}.", l);
    const int u = l + 1;
    add(pre + "ln_1.weight", 1024, 1, u);
    add(pre + "ln_1.bias", 1024, 1, u);
    add(pre + "self_attention.in_proj_weight", 3072, 1024, u);
    add(pre + "self_attention.in_proj_bias", 3072, 1, u);
    add(pre + "self_attention.out_proj.weight", 1024, 1024, u);
    add(pre + "self_attention.out_proj.bias", 1024, 1, u);
    add(pre + "ln_2.weight", 1024, 1, u);
    add(pre + "ln_2.bias", 1024, 1, u);
    add(pre + "mlp.0.weight", 4096, 1024, u);
    add(pre + "mlp.0.bias", 4096, 1, u);
    add(pre + "mlp.3.weight", 1024, 4096, u);
    add(pre + "mlp.3.bias", 1024, 1, u);
  }
  add("encoder.ln.weight", 1024, 1, 25);
  add("encoder.ln.bias", 1024, 1, 25);
  add("heads.head.weight", 1000, 1024, 25);
  add("heads.head.bias", 1000, 1, 25);
  return p;
}

// ---- levels ----

enum class level_kind : std::uint8_t { single, fixed, automatic };

// What a level runs: the reducer's own plan (caps at the reference scale) and codec, or the automatic
// plan under a policy.
struct level_setting {
  level_kind kind = level_kind::fixed;
  std::size_t first_bytes = 0;  // 0: one bucket of everything
  std::size_t cap_bytes = 0;
  codec_kind codec = codec_kind::none;
  comm::codec_policy policy = comm::codec_policy::lossless;
};

struct level_entry {
  level_info info;
  level_setting setting;
};

const std::vector<level_entry>& level_table() {
  static const std::vector<level_entry> table{
      {{"single", "each GPU alone: the same steps with no communication", "the ceiling", "compute_bound"},
       {level_kind::single}},
      {{"one-bucket", "every gradient in one bucket, all-reduced once backward has ended (DDP, 2000 MB)",
        "the whole all-reduce runs after backward", "exposed_comm"},
       {level_kind::fixed, 0, 0}},
      {{"25MB", "DDP's default buckets: the first 1 MiB, then 25 MiB, launched as they fill in backward",
        "what backward cannot hide: the last buckets, and the launches of many small all-reduces",
        "exposed_comm"},
       {level_kind::fixed, 1 * MiB, 25 * MiB}},
      {{"100MB", "100 MiB buckets (DDP's best fixed setting on the reference pair)",
        "the last 100 MiB bucket's all-reduce after backward", "exposed_comm"},
       {level_kind::fixed, 100 * MiB, 100 * MiB}},
      {{"fp16", "fp16 codec (scaled, saturating) over DDP's 25 MiB buckets: half the bytes on the wire",
        "the casts' local cost, and the last buckets", "exposed_comm"},
       {level_kind::fixed, 1 * MiB, 25 * MiB, codec_kind::fp16}},
      {{"bf16", "bf16 codec over DDP's 25 MiB buckets: half the bytes on the wire",
        "the casts' local cost, and the last buckets", "exposed_comm"},
       {level_kind::fixed, 1 * MiB, 25 * MiB, codec_kind::bf16}},
      {{"powersgd",
        "PowerSGD rank 1 (error feedback, warm start) over DDP's 25 MiB buckets: two all-reduces a bucket",
        "its products and orthogonalization beside backward, and the last buckets", "exposed_comm"},
       {level_kind::fixed, 1 * MiB, 25 * MiB, comm::powersgd_kind}},
      {{"auto",
        "ferry's automatic plan, lossless: buckets chosen from the measured link and the learned backward",
        "the last bucket's all-reduce after backward, and the model's error", "compute_bound"},
       {level_kind::automatic, 0, 0, codec_kind::none, comm::codec_policy::lossless}},
      {{"auto-lossy", "ferry's automatic plan with lossy codecs allowed: buckets and a codec per bucket",
        "the last bucket after backward and the codecs' local cost", "compute_bound"},
       {level_kind::automatic, 0, 0, codec_kind::none, comm::codec_policy::lossy_allowed}},
  };
  return table;
}

std::vector<level_info> infos() {
  std::vector<level_info> out;
  for (const level_entry& e : level_table()) out.push_back(e.info);
  return out;
}

std::vector<ladder_column> columns() {
  auto count = [](std::string header, int width, std::string name) {
    return extra_column(std::move(header), width, 0, std::move(name));
  };
  return {
      {"steps/s", 8, 3, false, [](const ladder_row& r) { return r.steps_per_s; }},
      {"x single", 8, 3, false, [](const ladder_row& r) { return r.ratio_to_ideal; }},
      {"hidden", 7, 1, true, [](const ladder_row& r) { return r.extra("hidden"); }},
      extra_column("exposed ms", 10, 2, "exposed_ms"),
      extra_column("comm ms", 8, 2, "comm_ms"),
      count("buckets", 7, "buckets"),
      count("lossy", 5, "lossy_buckets"),
      extra_column("wire MB", 8, 1, "wire_mb"),
      {"GPU idle", 8, 1, true, [](const ladder_row& r) { return r.gpu_idle; }},
      wrong_column(6),
  };
}

// ---- one rank ----

// Scales a reference byte count: at least one aligned slot.
std::size_t scaled_bytes(std::size_t bytes, double scale) {
  return std::max<std::size_t>(alignment, static_cast<std::size_t>(static_cast<double>(bytes) * scale));
}

// Rank r's values of parameter p, and their mean over n ranks.
comm::f32_fill fill_of(std::size_t p, int rank) {
  return {0.5F, 1.0F, static_cast<std::uint64_t>(p) * max_ranks + static_cast<std::uint64_t>(rank), 1};
}
comm::f32_fill mean_of(std::size_t p, int ranks) {
  return {0.5F, 1.0F, static_cast<std::uint64_t>(p) * max_ranks, static_cast<std::uint32_t>(ranks)};
}

// What one rank's check found; every rank of the group receives every rank's (as to_words).
struct rank_check {
  std::uint64_t checked = 0;
  std::uint64_t approximated = 0;  // PowerSGD's compressed matrices: no element-wise bound
  std::uint64_t wrong = 0;
  std::vector<std::uint64_t> checksums;  // per bucket
};

// A rank_check as words of equal length on every rank, for the group's all-gather: checked, approximated,
// wrong, the number of checksums, then the checksums (at most one per parameter: a bucket holds at least
// one), zero-padded.
std::size_t check_words(std::size_t params) { return 4 + params; }
std::vector<std::uint64_t> to_words(const rank_check& c, std::size_t params) {
  std::vector<std::uint64_t> w(check_words(params), 0);
  w[0] = c.checked;
  w[1] = c.approximated;
  w[2] = c.wrong;
  w[3] = c.checksums.size();
  std::copy(c.checksums.begin(), c.checksums.end(), w.begin() + 4);
  return w;
}
rank_check from_words(std::span<const std::uint64_t> w) {
  rank_check c;
  c.checked = w[0];
  c.approximated = w[1];
  c.wrong = w[2];
  const std::size_t n = std::min<std::size_t>(w[3], w.size() - 4);
  c.checksums.assign(w.begin() + 4, w.begin() + 4 + static_cast<std::ptrdiff_t>(n));
  return c;
}

// What a rank found; the timing figures only on rank 0.
struct rank_outcome {
  std::vector<rank_check> group;   // every rank's check, in rank order (gathered over the communicator)
  double comm_ms = 0, hidden = 0;  // the last step, on the communication stream
  // Means over the timed steps on the compute stream: forward, backward, the wait for the reducer after
  // backward (the exposed communication), the optimizer, and the gap before the next step's forward.
  double forward_ms = 0, backward_ms = 0, exposed_ms = 0, optimizer_ms = 0, between_ms = 0;
  std::size_t buckets = 0, lossy = 0;
  double wire_mb = 0;  // per step
  double first_mib = 0, cap_mib = 0;
  double predicted_exposed_ms = -1;  // auto levels
  double per_bucket_us = -1;         // auto levels: what a bucket took from backward
};

// The sizes the automatic plan measures the link at: x4 from about a 4096th of the gradients to all of them.
std::vector<std::uint64_t> link_sizes(std::uint64_t total) {
  std::vector<std::uint64_t> out;
  std::uint64_t s = std::max<std::uint64_t>(4 * KiB, total / 4096) / 4 * 4;
  for (; s < total; s *= 4) out.push_back(s);
  out.push_back(total / 4 * 4);
  return out;
}

// The shared state of one level's run over every rank.
struct level_run {
  const ddp_options& cfg;
  const level_setting& setting;
  std::span<comm::communicator* const> ranks;  // this process's ranks of the group
  level_window& window;
  progress_fn progress;
  std::vector<std::size_t> elements;
  std::vector<comm::matrix_shape> shapes;
  std::vector<int> unit_of;
  std::vector<rank_outcome> outcome;  // per entry of ranks
  std::string window_level;           // the level's name, for progress lines
};

// The points of one step on the compute stream, as timing events.
struct step_marks {
  event forward, backward, backward_end, waited, end;
};

// One rank's model and its steps: the rank of run.ranks[local] (its rank in the group may differ when the
// group spans processes).
class rank_model {
 public:
  rank_model(level_run& run, std::size_t local)
      : run_(run),
        local_(local),
        comm_(*run.ranks[local]),
        rank_(comm_.rank()),
        dev_(comm_.dev()),
        compute_(dev_.make_stream()),
        t0_(dev_.make_timing_event()),
        backward_end_(dev_.make_timing_event()) {
    const ddp_options& cfg = run.cfg;
    const auto step = std::chrono::duration<double, std::nano>(cfg.compute).count();
    const double optimizer = step * cfg.optimizer_fraction;
    const double forward = (step - optimizer) * cfg.forward_fraction;
    const double backward = step - optimizer - forward;
    std::vector<double> unit_params(model_units, 0);
    double total = 0;
    for (const model_param& p : vit_l32_params()) {
      unit_params[static_cast<std::size_t>(p.unit)] += static_cast<double>(p.elements);
      total += static_cast<double>(p.elements);
    }
    for (int u = 0; u < model_units; ++u) {
      const double share = unit_params[static_cast<std::size_t>(u)] / total;
      forward_.emplace_back(static_cast<std::int64_t>(forward * share));
      backward_.emplace_back(static_cast<std::int64_t>(backward * share));
    }
    optimizer_ = std::chrono::nanoseconds(static_cast<std::int64_t>(optimizer));
    for (int i = 0; i < cfg.steps; ++i) {
      step_marks m;
      for (event* e : {&m.forward, &m.backward, &m.backward_end, &m.waited, &m.end})
        *e = dev_.make_timing_event();
      marks_.push_back(std::move(m));
    }
    for (std::size_t p = 0; p < run.elements.size(); ++p) {
      const int u = run.unit_of[p];
      if (first_of_.size() <= static_cast<std::size_t>(u))
        first_of_.resize(static_cast<std::size_t>(u) + 1, p);
      last_of_.resize(first_of_.size());
      last_of_[static_cast<std::size_t>(u)] = p;
    }
  }

  void run() {
    const level_setting& s = run_.setting;
    const ddp_options& cfg = run_.cfg;
    if (s.kind == level_kind::single) {
      std::size_t total = 0;
      for (std::size_t n : run_.elements) total += n;
      plain_ = dev_.alloc_device(total * sizeof(float));
    } else {
      comm::reducer_options o;
      o.timing = true;
      o.codec = s.codec;
      if (s.kind == level_kind::automatic) {
        o.automatic = automatic_options();
      } else if (s.first_bytes == 0) {
        o.plan.first_bucket_bytes = o.plan.bucket_cap_bytes = std::numeric_limits<std::size_t>::max() / 16;
      } else {
        o.plan.first_bucket_bytes = scaled_bytes(s.first_bytes, cfg.scale);
        o.plan.bucket_cap_bytes = scaled_bytes(s.cap_bytes, cfg.scale);
        plan_first_ = o.plan.first_bucket_bytes;
        plan_cap_ = o.plan.bucket_cap_bytes;
      }
      o.codec_options[comm::powersgd_kind] = comm::powersgd_options{.rank = 1};
      red_.emplace(comm_, run_.shapes, o);
    }
    // Auto levels: the reducer learns and decides over its first steps (1 + 3 x learn_steps; none at one
    // rank), the same number on every rank; they run before the warm-up.
    if (s.kind == level_kind::automatic) {
      while (!red_->auto_result()) one_step(-1);
      decided();
    }
    const int total = cfg.warmup + cfg.steps;
    for (int step = 0; step < total; ++step) {
      if (rank_ == 0 && step == cfg.warmup) run_.window.begin();
      one_step(step);
    }
    if (rank_ == 0) run_.window.end(last_row_);
    compute_.synchronize();
    if (red_) red_->comm_stream().synchronize();
    report();
  }

  [[nodiscard]] ladder_row& row() { return last_row_; }
  /// The rank's place in the group.
  [[nodiscard]] int rank() const noexcept { return rank_; }

 private:
  mem_view grad(std::size_t p) const {
    if (red_) return red_->grad(p);
    return plain_.view(offset_of(p) * sizeof(float), run_.elements[p] * sizeof(float));
  }
  std::size_t offset_of(std::size_t p) const {
    std::size_t o = 0;
    for (std::size_t q = 0; q < p; ++q) o += run_.elements[q];
    return o;
  }

  // `widx`: the step's index from the first warm-up step (negative: the auto levels' learning steps).
  void one_step(int widx) {
    std::optional<trace::scoped_range> range;
    if (rank_ == 0) range.emplace("step", trace::color::gray);
    const bool timed = rank_ == 0 && widx >= 0;
    if (red_) {
      red_->begin_step();
      t0_.record(red_->comm_stream());
    }
    if (timed) run_.window.compute_started(widx, compute_);
    // The timed steps' points on the compute stream (every rank records them; rank 0 reports them).
    const int t = widx - run_.cfg.warmup;
    step_marks* marks =
        t >= 0 && t < static_cast<int>(marks_.size()) ? &marks_[static_cast<std::size_t>(t)] : nullptr;
    if (marks) marks->forward.record(compute_);
    for (int u = 0; u < model_units; ++u)
      if (forward_[static_cast<std::size_t>(u)].count() > 0)
        dev_.spin_async(forward_[static_cast<std::size_t>(u)], compute_);
    if (marks) marks->backward.record(compute_);
    for (int u = model_units - 1; u >= 0; --u) {
      if (backward_[static_cast<std::size_t>(u)].count() > 0)
        dev_.spin_async(backward_[static_cast<std::size_t>(u)], compute_);
      const std::size_t first = first_of_[static_cast<std::size_t>(u)],
                        last = last_of_[static_cast<std::size_t>(u)];
      for (std::size_t p = last + 1; p-- > first;) {
        comm::fill_f32_async(grad(p), run_.elements[p], fill_of(p, rank_), compute_);
        if (red_) red_->mark_ready(p, compute_);
      }
    }
    backward_end_.record(compute_);
    if (marks) marks->backward_end.record(compute_);
    if (red_) red_->finish(compute_);
    if (marks) marks->waited.record(compute_);
    dev_.spin_async(optimizer_, compute_);
    if (marks) marks->end.record(compute_);
    if (timed) run_.window.compute_done(widx, compute_);
  }

  // The auto levels' reducer option: the automatic plan under the level's policy, its sizes (candidates,
  // DDP's plans it compares and probes with, the link sizes) scaled with the model.
  comm::auto_plan_options automatic_options() const {
    const ddp_options& cfg = run_.cfg;
    auto scaled = [&cfg](const comm::bucket_plan_options& o) {
      return comm::bucket_plan_options{scaled_bytes(o.first_bucket_bytes, cfg.scale),
                                       scaled_bytes(o.bucket_cap_bytes, cfg.scale), alignment};
    };
    comm::auto_plan_options a;
    a.enabled = true;
    a.policy = run_.setting.policy;
    a.learn_steps = cfg.learn_steps;
    a.min_lossy_gain = cfg.min_lossy_gain;
    for (std::size_t c : comm::default_caps()) a.caps.push_back(scaled_bytes(c, cfg.scale));
    for (std::size_t f : comm::default_first_buckets()) a.first_buckets.push_back(scaled_bytes(f, cfg.scale));
    for (const comm::bucket_plan_options& f : comm::ddp_plans()) a.fixed_plans.push_back(scaled(f));
    a.probe = scaled(comm::bucket_plan_options{});
    std::uint64_t total = 0;
    for (std::size_t n : run_.elements) total += n * sizeof(float);
    a.link_sizes = link_sizes(total);
    return a;
  }

  // The share of the last finished step's bucket time on the communication stream that ran before
  // backward ended, and that time (ms).
  std::pair<double, double> hidden_share() {
    red_->comm_stream().synchronize();
    const std::vector<comm::bucket_timing> t = red_->last_step_timing();
    const double backward_end = dev_.elapsed_ms(t0_, backward_end_);
    double busy = 0, before = 0;
    for (const comm::bucket_timing& b : t) {
      busy += b.end_ms - b.start_ms;
      before += std::max(0.0, std::min(b.end_ms, backward_end) - b.start_ms);
    }
    return {busy > 0 ? before / busy : 0, busy};
  }

  // The automatic plan's decision, on every rank: the plan's limits for the row; on rank 0 a progress
  // line, with how much of the last learning step's communication (the probe's buckets) ran beside backward.
  void decided() {
    const comm::auto_decision& d = *red_->auto_result();
    plan_first_ = d.first_bucket_bytes;
    plan_cap_ = d.bucket_cap_bytes;
    if (rank_ != 0 || !run_.progress) return;
    if (d.probe_buckets == 0) {
      run_.progress(fmt::format("{}: one rank: one bucket of {}, decided without learning (no link to hide)",
                                run_.window_level, format_bytes(d.bucket_cap_bytes)));
      return;
    }
    const auto [hidden, busy] = hidden_share();
    run_.progress(fmt::format(
        "{}: plan of {} buckets (first {}, cap {}), {} lossy; predicted exposed {:.2f} ms after a {:.2f} ms "
        "backward, each bucket taking {:.1f} us from it (measured with {} buckets, {:.0f}% of their {:.2f} "
        "ms "
        "beside backward)",
        run_.window_level, d.buckets, format_bytes(d.first_bucket_bytes), format_bytes(d.bucket_cap_bytes),
        d.lossy_buckets, d.predicted_exposed_s * 1e3, d.backward_s * 1e3, d.per_bucket_compute_us,
        d.probe_buckets, hidden * 100, busy));
  }

  // After the timed steps: the check, and (rank 0) the last step's communication against its backward.
  void report() {
    rank_outcome& out = run_.outcome[local_];
    if (rank_ == 0) step_phases(out);
    rank_check mine;
    const int n = comm_.size();
    const std::size_t params = run_.elements.size();
    buffer results = dev_.alloc_device(params * comm::f32_diff_bytes);
    dev_.memset_async(results, 0, compute_);  // the slots of matrices left unchecked read as no difference
    for (std::size_t p = 0; p < params; ++p) {
      const mem_view r = results.view(p * comm::f32_diff_bytes, comm::f32_diff_bytes);
      if (red_) {
        const std::size_t b = red_->plan().places[p].bucket;
        codec_kind c = red_->codecs()[b];
        if (c == comm::powersgd_kind) {
          // A compressed matrix is a rank-1 approximation (checked across ranks only, by the checksums);
          // what PowerSGD sends whole comes back as the exact fp32 mean.
          const std::vector<std::size_t>& in = red_->plan().buckets[b].params;
          const auto k = static_cast<std::size_t>(std::find(in.begin(), in.end(), p) - in.begin());
          if (comm::powersgd_state(red_->codec(b))->compressed(k)) {
            mine.approximated += run_.elements[p];
            continue;
          }
          c = codec_kind::none;
        }
        const auto tol = static_cast<float>(comm::error_bound(c, n, fill_of(p, rank_).max_abs()));
        comm::compare_f32_async(grad(p), mean_of(p, n), run_.elements[p], tol, r, compute_);
      } else {
        comm::compare_f32_async(grad(p), fill_of(p, rank_), run_.elements[p], 0.0F, r, compute_);
      }
      mine.checked += run_.elements[p];
    }
    buffer host = dev_.alloc_pageable(params * comm::f32_diff_bytes);
    dev_.copy(host, results, compute_);
    for (std::size_t p = 0; p < params; ++p)
      mine.wrong += comm::read_f32_diff(host.host_bytes() + p * comm::f32_diff_bytes).wrong;
    if (red_) {
      // Every bucket's bytes, for the comparison across ranks.
      const comm::bucket_plan& plan = red_->plan();
      buffer sums = dev_.alloc_device(plan.buckets.size() * 8);
      for (std::size_t b = 0; b < plan.buckets.size(); ++b)
        dev_.checksum_async(
            red_->flat().subview(plan.buckets[b].offset * sizeof(float), plan.buckets[b].bytes()),
            sums.view(b * 8, 8), compute_);
      buffer sums_host = dev_.alloc_pageable(plan.buckets.size() * 8);
      dev_.copy(sums_host, sums, compute_);
      mine.checksums.assign(plan.buckets.size(), 0);
      std::memcpy(mine.checksums.data(), sums_host.host_bytes(), plan.buckets.size() * 8);
    }
    out.group = gather_checks(mine);
    if (!red_) return;

    const comm::bucket_plan& plan = red_->plan();
    const comm::reducer_stats st = red_->stats();
    out.buckets = plan.buckets.size();
    out.lossy = static_cast<std::size_t>(std::count_if(red_->codecs().begin(), red_->codecs().end(),
                                                       [](codec_kind c) { return comm::lossy(c); }));
    out.wire_mb = static_cast<double>(st.wire_bytes) / static_cast<double>(st.steps) / 1e6;
    if (const std::optional<comm::auto_decision>& d = red_->auto_result()) {
      out.predicted_exposed_ms = d->predicted_exposed_s * 1e3;
      out.per_bucket_us = d->per_bucket_compute_us;
    }
    // The plan's limits at the reference scale (0: one bucket of everything).
    out.first_mib = static_cast<double>(plan_first_) / run_.cfg.scale / static_cast<double>(MiB);
    out.cap_mib = static_cast<double>(plan_cap_) / run_.cfg.scale / static_cast<double>(MiB);
    if (rank_ != 0) return;
    // The last step: each bucket's span on the communication stream against the end of backward, both
    // from the step's start on that stream.
    const auto [hidden, busy] = hidden_share();
    out.comm_ms = busy;
    out.hidden = hidden;
  }

  // Every rank's check, gathered over the group (the ranks may live in other processes).
  std::vector<rank_check> gather_checks(const rank_check& mine) {
    const std::size_t params = run_.elements.size();
    const std::size_t words = check_words(params);
    const auto n = static_cast<std::size_t>(comm_.size());
    const std::size_t bytes = words * sizeof(std::uint64_t);
    buffer host = dev_.alloc_pageable(n * bytes);
    buffer gathered = dev_.alloc_device(n * bytes);
    const std::vector<std::uint64_t> w = to_words(mine, params);
    std::memcpy(host.host_bytes(), w.data(), bytes);
    // This rank's words go in its own place of the gathered buffer (the in-place layout).
    const mem_view own = gathered.view(static_cast<std::size_t>(rank_) * bytes, bytes);
    dev_.copy(own, host.view(0, bytes), compute_);
    comm_.all_gather(own, gathered, words, comm::dtype::u64, compute_).synchronize();
    dev_.copy(host, gathered, compute_);
    std::vector<std::uint64_t> all(n * words);
    std::memcpy(all.data(), host.host_bytes(), n * bytes);
    std::vector<rank_check> out;
    for (std::size_t r = 0; r < n; ++r) out.push_back(from_words(std::span(all).subspan(r * words, words)));
    return out;
  }

  // Rank 0, every level: where the timed steps' time went on the compute stream, as means over the steps.
  void step_phases(rank_outcome& out) {
    const std::size_t n = marks_.size();
    double forward = 0, backward = 0, waited = 0, optimizer = 0, between = 0;
    for (std::size_t i = 0; i < n; ++i) {
      const step_marks& m = marks_[i];
      forward += dev_.elapsed_ms(m.forward, m.backward);
      backward += dev_.elapsed_ms(m.backward, m.backward_end);
      waited += dev_.elapsed_ms(m.backward_end, m.waited);
      optimizer += dev_.elapsed_ms(m.waited, m.end);
      if (i + 1 < n) between += dev_.elapsed_ms(m.end, marks_[i + 1].forward);
    }
    const auto steps = static_cast<double>(n);
    out.forward_ms = forward / steps;
    out.backward_ms = backward / steps;
    out.exposed_ms = waited / steps;
    out.optimizer_ms = optimizer / steps;
    out.between_ms = n > 1 ? between / static_cast<double>(n - 1) : 0;
  }

  level_run& run_;
  std::size_t local_;
  comm::communicator& comm_;
  int rank_;
  device& dev_;
  stream compute_;
  std::optional<comm::reducer> red_;
  buffer plain_;
  std::vector<std::chrono::nanoseconds> forward_, backward_;
  std::chrono::nanoseconds optimizer_{};
  std::vector<std::size_t> first_of_, last_of_;  // per unit: its first and last parameter
  event t0_, backward_end_;
  std::vector<step_marks> marks_;              // per timed step
  std::size_t plan_first_ = 0, plan_cap_ = 0;  // the bucket limits of the plan that ran (0: one bucket)
  ladder_row last_row_;
};

}  // namespace

const std::vector<model_param>& vit_l32_params() {
  static const std::vector<model_param> params = make_vit_l32();
  return params;
}

ddp_options::ddp_options()
    : ladder_options(std::chrono::nanoseconds(static_cast<std::int64_t>(reference_step_ms * 1e6)),
                     names_of(infos())) {
  warmup = 3;
  steps = 20;
}

std::vector<comm::matrix_shape> ddp_options::shapes() const {
  auto times = [](std::size_t n, double f) {
    return std::max<std::size_t>(1, static_cast<std::size_t>(std::llround(static_cast<double>(n) * f)));
  };
  std::vector<comm::matrix_shape> out;
  for (const model_param& p : vit_l32_params()) {
    if (p.shape.cols == 1) {
      out.push_back({times(p.shape.rows, scale), 1});
    } else {
      out.push_back({times(p.shape.rows, std::sqrt(scale)), times(p.shape.cols, std::sqrt(scale))});
    }
  }
  return out;
}

std::vector<std::size_t> ddp_options::elements() const {
  std::vector<std::size_t> out;
  for (const comm::matrix_shape& s : shapes()) out.push_back(s.elements());
  return out;
}

std::uint64_t ddp_options::gradient_bytes() const {
  std::uint64_t total = 0;
  for (std::size_t n : elements()) total += n * sizeof(float);
  return total;
}

ddp_options default_ddp_options(backend b) {
  ddp_options o;
  if (b == backend::host) {
    o.scale = 1e-3;
    o.compute = std::chrono::milliseconds(40);
    o.warmup = 2;
    o.steps = 5;
  }
  return o;
}

comm::comm_link ddp_host_link(const comm::comm_link& preset, double scale, std::chrono::nanoseconds step) {
  FERRY_EXPECTS(scale > 0 && std::isfinite(scale),
                fmt::format("ddp scale {} must be a positive number", scale));
  FERRY_EXPECTS(step.count() > 0, fmt::format("ddp step of {} ns must be positive", step.count()));
  const double step_ratio = reference_step_ms * 1e6 / static_cast<double>(step.count());
  comm::comm_link l = preset;
  l.bus_gbps = preset.bus_gbps * scale * step_ratio;
  l.latency = std::chrono::nanoseconds(
      static_cast<std::int64_t>(static_cast<double>(preset.latency.count()) / step_ratio));
  return l;
}

const ladder_spec& ddp_spec() {
  static const ladder_spec spec = [] {
    ladder_spec s{"ddp", copy_direction::device_to_device, "gradient", "elements", infos(), 10, columns(),
                  {}};
    s.ceiling = "single";
    s.probed_name = "all-reduce busbw of the step's gradients";
    return s;
  }();
  return spec;
}

NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(ddp_options, scale, forward_fraction, optimizer_fraction, learn_steps,
                                   min_lossy_gain)

ddp_result run_ddp(std::span<comm::communicator* const> ranks, const ddp_options& cfg, progress_fn progress) {
  FERRY_EXPECTS(!ranks.empty() && ranks[0] != nullptr, "ddp bench needs at least one rank");
  const int n = ranks[0]->size();
  const int first = ranks[0]->rank();
  FERRY_EXPECTS(static_cast<std::uint64_t>(n) <= max_ranks,
                fmt::format("ddp bench of {} ranks: at most {}", n, max_ranks));
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    const comm::communicator* c = ranks[i];
    const int want = first + static_cast<int>(i);
    FERRY_EXPECTS(c != nullptr && c->rank() == want && c->size() == n,
                  fmt::format("ddp ranks must be consecutive ranks of one group in rank order: entry {} is "
                              "not rank {} of {}",
                              i, want, n));
  }
  const std::size_t local = ranks.size();
  FERRY_EXPECTS(cfg.scale > 0 && cfg.scale <= 1, fmt::format("ddp scale {} is outside (0, 1]", cfg.scale));
  FERRY_EXPECTS(cfg.compute.count() > 0, "ddp step time must be positive");
  FERRY_EXPECTS(cfg.forward_fraction > 0 && cfg.forward_fraction < 1,
                fmt::format("ddp forward fraction {} is outside (0, 1)", cfg.forward_fraction));
  FERRY_EXPECTS(cfg.optimizer_fraction >= 0 && cfg.optimizer_fraction < 1,
                fmt::format("ddp optimizer fraction {} is outside [0, 1)", cfg.optimizer_fraction));
  FERRY_EXPECTS(cfg.learn_steps >= 1, fmt::format("ddp learn steps {} must be at least 1", cfg.learn_steps));
  FERRY_EXPECTS(cfg.warmup >= 1,
                fmt::format("ddp warmup {} must be at least 1 (the first step builds the plan)", cfg.warmup));

  for (const std::string& level : cfg.levels) static_cast<void>(level_index(ddp_spec(), level));

  const std::vector<comm::matrix_shape> shapes = cfg.shapes();
  const std::vector<std::size_t> elements = cfg.elements();
  std::vector<int> unit_of;
  for (const model_param& p : vit_l32_params()) unit_of.push_back(p.unit);
  const std::uint64_t step_bytes = cfg.gradient_bytes();
  const std::vector<level_entry>& table = level_table();

  // Runs fn(i) on a thread per entry i of ranks; a rank that throws aborts the group, the first error is
  // rethrown.
  auto on_every_rank = [&](const std::function<void(std::size_t)>& fn) {
    std::mutex mu;
    std::exception_ptr failed;
    std::vector<std::thread> threads;
    for (std::size_t i = 0; i < local; ++i) {
      threads.emplace_back([&, i] {
        try {
          fn(i);
        } catch (...) {
          {
            const std::lock_guard lock(mu);
            if (!failed) failed = std::current_exception();
          }
          ranks[i]->abort(fmt::format("rank {} of the ddp bench failed", ranks[i]->rank()));
        }
      });
    }
    for (auto& t : threads) t.join();
    if (failed) std::rethrow_exception(failed);
  };

  // The link the rows are compared with: the bus bandwidth of one all-reduce of the step's gradients.
  ddp_options run_cfg = cfg;
  if (run_cfg.probed_gbps <= 0 && n > 1) {
    if (progress)
      progress(
          fmt::format("ddp: all-reduce of the {} of gradients over {} ranks", format_bytes(step_bytes), n));
    std::vector<double> seconds(local);
    on_every_rank([&](std::size_t i) {
      comm::communicator& c = *ranks[i];
      stream s = c.dev().make_stream();
      buffer b = c.dev().alloc_device(step_bytes);
      comm::fill_f32_async(b.view(), step_bytes / sizeof(float), fill_of(0, c.rank()), s);
      const std::vector<std::uint64_t> size{step_bytes / 4 * 4};
      seconds[i] = comm::time_all_reduce(c, b.view(), size, 3, s).front();
    });
    run_cfg.probed_gbps = static_cast<double>(step_bytes) * comm::all_reduce_bus_factor(n) / seconds[0] / 1e9;
  }
  if (run_cfg.probed_gbps <= 0) run_cfg.probed_gbps = 1;  // one rank: no link; rows show 0 % of nothing

  auto run = [&](std::size_t index, level_window& window, ladder_row& row) {
    level_run lr{run_cfg,
                 table[index].setting,
                 ranks,
                 window,
                 progress,
                 elements,
                 shapes,
                 unit_of,
                 std::vector<rank_outcome>(local),
                 table[index].info.name};
    on_every_rank([&](std::size_t i) {
      rank_model m(lr, i);
      m.run();
      if (m.rank() == 0) {
        const ladder_row& timed = m.row();
        row.steps = timed.steps;
        row.seconds = timed.seconds;
        row.steps_per_s = timed.steps_per_s;
        row.gpu_idle = timed.gpu_idle;
        row.extras = timed.extras;
      }
    });
    // The figures of this process's first rank (rank 0's, in the process that reports), the checks of the
    // whole group (every rank received them all).
    const rank_outcome& o = lr.outcome[0];
    const std::vector<rank_check>& group = o.group;
    std::uint64_t approximated = 0;
    for (const rank_check& x : group) {
      row.checked += x.checked;
      row.wrong += x.wrong;
      approximated += x.approximated;
      // Every bucket must hold rank 0's bytes on every rank.
      const std::vector<std::uint64_t>& zero = group.front().checksums;
      row.wrong += x.checksums.size() != zero.size() ? 1 : 0;
      for (std::size_t b = 0; b < x.checksums.size(); ++b)
        row.wrong += b >= zero.size() || x.checksums[b] != zero[b] ? 1 : 0;
    }
    row.set_extra("comm_ms", o.comm_ms);
    row.set_extra("hidden", o.hidden);
    row.set_extra("exposed_ms", o.exposed_ms);
    row.set_extra("forward_ms", o.forward_ms);
    row.set_extra("backward_ms", o.backward_ms);
    row.set_extra("optimizer_ms", o.optimizer_ms);
    row.set_extra("between_ms", o.between_ms);
    row.set_extra("buckets", static_cast<double>(o.buckets), true);
    row.set_extra("lossy_buckets", static_cast<double>(o.lossy), true);
    row.set_extra("wire_mb", o.wire_mb);
    row.set_extra("approximated", static_cast<double>(approximated), true);
    row.set_extra("first_mib", o.first_mib);
    row.set_extra("cap_mib", o.cap_mib);
    row.set_extra("link_gbps", run_cfg.probed_gbps);
    if (o.predicted_exposed_ms >= 0) row.set_extra("predicted_exposed_ms", o.predicted_exposed_ms);
    if (o.per_bucket_us >= 0) row.set_extra("per_bucket_us", o.per_bucket_us);
  };
  ddp_result result =
      run_ladder_as<ddp_result>(ranks[0]->dev(), ddp_spec(), run_cfg, step_bytes, run, progress);
  result.ranks = n;
  result.first_rank = first;
  result.comm_backend = std::string(ranks[0]->backend_name());
  return result;
}

}  // namespace ferry::bench
