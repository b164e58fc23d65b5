// `ferry bench ddp`: the device-to-device ladder of README.md ("The ladders: L0..L4", part 3). Data-parallel
// training of a synthetic model with ViT-L/32's parameters over a group of ranks (one thread per rank), next
// to the same model on each GPU alone with no communication ("single", the ceiling).
//
// The model: torchvision's vit_l_32 parameter shapes in registration order (vit_l32_params: 306.5 M
// parameters, 1.23 GB of fp32 gradients), times `scale`. Its compute units are the patch embedding, the 24
// encoder layers and the head; each unit's forward and backward are spin kernels (device::spin_async)
// whose time is proportional to its parameters, the forward taking a third and the backward two thirds of
// the step, then a short optimizer spin. Backward runs the units in reverse; after each unit's spin, each
// of its gradients is written (comm::fill_f32_async: rank r writes its own values) and marked ready with
// the reducer, which all-reduces bucket after bucket on its communication stream while backward goes on;
// the optimizer's spin waits for the reducer (finish). Every rank's compute runs on one stream.
//
// Levels: single (no reducer); one bucket after backward; DDP's 25 MB and 100 MB buckets; fp16, bf16 and
// PowerSGD rank 1 (error feedback, warm start: comm::powersgd in the reducer) over 25 MB buckets; ferry auto,
// lossless and with lossy codecs allowed: the reducer's automatic plan (comm::reducer_options::automatic,
// with `learn_steps`, `min_lossy_gain` and its sizes scaled with the model), which measures the all-reduce
// over sizes and the codecs' cost when the reducer is made, learns the backward's gradient-ready timeline
// over `learn_steps` steps with one bucket and then, over the last `learn_steps` of 2 x `learn_steps` steps
// with DDP's 25 MB buckets, how much longer backward runs beside many all-reduces; rank 0 chooses the plan
// (comm::choose_plan) and every rank's reducer takes it. Those 1 + 3 x `learn_steps` learning steps run
// before the warm-up (none at one rank, where the plan is one bucket at once).
//
// Each row: steps/s, the ratio to single, and from the last timed step's timing events (the reducer's on
// its communication stream, the bench's on the compute stream) the communication time, the share of it
// that ran before backward ended ("hidden") and how long it outlasted backward ("exposed"). Each run is
// checked after its timed steps: every gradient must equal the exact mean of the ranks' values within its
// bucket's codec bound (comm::error_bound; PowerSGD's compressed matrices have no element-wise bound and
// are checked across ranks only), and every bucket must hold the same bytes on every rank (checksums); a
// row counts what failed in `wrong`. The ranks' checks travel over the group itself (an all-gather), so a
// group whose ranks live in several processes (mpirun, one GPU each) is checked as a whole: every process
// calls run_ddp with its own ranks and gets every rank's checks; the timing figures are rank 0's.
//
// On the host backend a scaled model runs over a modelled link scaled with it (ddp_host_link), so the
// reference's proportions of communication to compute hold at a small size.
#pragma once

#include <chrono>
#include <cstddef>
#include <span>
#include <string>
#include <vector>

#include "ferry/bench/ladder.hpp"
#include "ferry/comm/communicator.hpp"
#include "ferry/comm/powersgd.hpp"

namespace ferry::bench {

/// One parameter of the model.
struct model_param {
  std::string name;
  std::size_t elements = 0;
  int unit = 0;  // its compute unit: 0 the patch embedding, 1..24 the encoder layers, 25 the head
  /// Its gradient as PowerSGD views it: {first dimension, the product of the others}; {n, 1} for 1-D.
  comm::matrix_shape shape{};
};

/// torchvision's vit_l_32 parameters in registration order (named_parameters), 306,535,400 in all.
[[nodiscard]] const std::vector<model_param>& vit_l32_params();

/// The ddp ladder's settings; ladder_options::compute is the whole step (forward, backward, optimizer).
struct ddp_options : ladder_options {
  double scale = 1.0;                 // parameters' elements times this (at least 1 each)
  double forward_fraction = 1.0 / 3;  // of the step less the optimizer; the backward takes the rest
  double optimizer_fraction = 0.01;   // of the step
  int learn_steps = 2;                // auto levels: steps whose gradient-ready times the plan learns from
  double min_lossy_gain = 0.01;       // auto-lossy: comm::plan_inputs::min_lossy_gain

  /// The reference step (83 ms), 3 warm-up and 20 timed steps, every level.
  ddp_options();
  /// The model's parameter shapes at this scale: a 1-D gradient's elements times scale, a matrix's rows
  /// and columns each times sqrt(scale) (at least 1 each).
  [[nodiscard]] std::vector<comm::matrix_shape> shapes() const;
  /// The model's parameter element counts at this scale (of shapes()).
  [[nodiscard]] std::vector<std::size_t> elements() const;
  /// fp32 gradient bytes per step.
  [[nodiscard]] std::uint64_t gradient_bytes() const;
};

/// The reference model on cuda; on the host backend a thousandth of it, with 40 ms steps, 2 warm-up and
/// 5 timed steps.
[[nodiscard]] ddp_options default_ddp_options(backend b);

/// The host backend's link for a scaled run: `preset`'s bus bandwidth times scale and times the
/// reference step over the run's step, its latency times the run's step over the reference step, so a
/// bucket's all-reduce takes the same share of a step as at full scale on the preset's link.
[[nodiscard]] comm::comm_link ddp_host_link(const comm::comm_link& preset, double scale,
                                            std::chrono::nanoseconds step);

/// The ddp ladder: its levels, table columns and JSON names.
[[nodiscard]] const ladder_spec& ddp_spec();

/// A ladder run. Extras per row: comm_ms, hidden, exposed_ms, buckets, lossy_buckets, wire_mb (per step),
/// first_mib and cap_mib of the plan; auto levels predicted_exposed_ms and per_bucket_us; every level
/// link_gbps (the
/// all-reduce busbw of the step's gradients measured before the levels).
struct ddp_result : ladder_result {
  ddp_options config;
  int ranks = 0;             // the group's
  int first_rank = 0;        // the first of the ranks this call ran: 0 in the process whose rows are timed
  std::string comm_backend;  // "host" or "nccl"
};

/// Runs the configured levels over `ranks`: this process's ranks of one group, consecutive, in rank order
/// (all of the group's in a single process; with a group over several processes every process calls it at
/// once, with the same settings, for its own ranks). Their devices run the model. The rows' checks are the
/// whole group's on every process; their timing figures are rank 0's, so only the process holding rank 0
/// (first_rank 0) has the ladder's timings. Throws logic_error for bad settings or ranks that are not
/// consecutive ranks of one group, comm_error when the group fails (it is aborted, so no rank waits
/// forever).
[[nodiscard]] ddp_result run_ddp(std::span<comm::communicator* const> ranks, const ddp_options& cfg,
                                 progress_fn progress = {});

}  // namespace ferry::bench
