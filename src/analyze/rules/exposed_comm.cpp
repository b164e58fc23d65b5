// exposed_comm: communication left exposed after backward. In data-parallel training each step's
// gradients are all-reduced (NCCL kernels, peer copies) while the backward pass still computes; what the
// backward cannot hide runs after its last compute kernel, and the optimizer (or the next step's forward)
// waits for it. So the cost is the communication time during which no compute kernel runs, per step:
// exactly the breakdown's exclusive comm time, which gpu_idle does not count as idle. The evidence adds how
// much of the communication compute did hide and the longest stretch of communication alone (the tail after
// backward); the fix names the bucket size, a 16-bit codec and the link, first what the evidence points to.
#include <fmt/format.h>

#include <algorithm>
#include <string>
#include <vector>

#include "rules.hpp"
#include "wording.hpp"

namespace ferry::trace::detail {

namespace {

// Exposed communication below this fraction of the mean step is noise (a barrier, a small broadcast).
constexpr double exposed_step_fraction = 0.01;
// Below this share of the communication hidden behind compute, the all-reduce starts too late: the bucket
// plan comes first in the fix; above it, the communication overlaps but outlasts the backward, so fewer
// bytes (a codec) or a faster link come first.
constexpr double late_start_hidden = 0.5;

constexpr const char* bucket_fix =
    "start the all-reduce while backward still runs: smaller gradient buckets with a small first bucket, "
    "each "
    "launched as soon as its gradients are ready (ferry::comm's reducer; its automatic plan picks the "
    "buckets "
    "from the measured link and the backward's gradient-ready timeline)";
constexpr const char* codec_fix =
    "halve the bytes on the wire with a 16-bit codec (bf16 or fp16, lossy: where training tolerates it, the "
    "reducer's automatic plan with lossy codecs allowed picks it per bucket)";
// The same two in PyTorch's words: DistributedDataParallel's buckets and its communication hooks.
constexpr const char* torch_bucket_fix =
    "start the all-reduce while backward still runs: smaller gradient buckets, each reduced as soon as its "
    "gradients are ready (DistributedDataParallel(model, bucket_cap_mb=...), below its 25 MB default)";
constexpr const char* torch_codec_fix =
    "halve the bytes on the wire with a 16-bit compression hook (bf16 or fp16, lossy: where training "
    "tolerates it): ddp.register_comm_hook(None, bf16_compress_hook) from "
    "torch.distributed.algorithms.ddp_comm_hooks.default_hooks";
constexpr const char* link_fix =
    "check the link: `ferry probe` and `ferry bench allreduce` show whether the GPUs reach each other over "
    "NVLink or through host memory (NCCL_P2P_DISABLE=1, or a PCIe topology without peer access, sends every "
    "byte through host memory)";

}  // namespace

void find_exposed_comm(const model& m, std::vector<finding>& out) {
  const std::vector<span>& comm = m.comm().spans();
  ns_t comm_ns = 0, exposed_ns = 0, longest_ns = 0;
  for (const step_span& s : m.step_spans()) {
    ns_t longest = 0;
    // Each span of communication in the step, less the compute kernels inside it: communication alone.
    auto c = std::partition_point(comm.begin(), comm.end(), [&](const span& x) { return x.end <= s.start; });
    for (; c != comm.end() && c->start < s.end; ++c) {
      const ns_t a = std::max(c->start, s.start), b = std::min(c->end, s.end);
      comm_ns += b - a;
      m.compute().for_each_gap(a, b, [&](const span& g) {
        exposed_ns += g.end - g.start;
        longest = std::max(longest, g.end - g.start);
      });
    }
    longest_ns += longest;
  }
  if (comm_ns <= 0) return;
  const double exposed_per_step = m.per_step(static_cast<double>(exposed_ns));
  if (exposed_per_step < exposed_step_fraction * m.mean_wall_ns()) return;
  std::size_t kernels = 0;
  for (std::size_t i : m.comm_events())
    if (m.step_of(m.trace().events[i].start_ns) >= 0) ++kernels;

  const double comm_ms = ms(m.per_step(static_cast<double>(comm_ns)));
  const double exposed_ms = ms(exposed_per_step);
  const double longest_ms = ms(m.per_step(static_cast<double>(longest_ns)));
  const double hidden = 1.0 - static_cast<double>(exposed_ns) / static_cast<double>(comm_ns);
  const double step_ms = m.summary().mean.wall_ms;
  finding f;
  f.rule = "exposed_comm";
  f.cost_ms_per_step = exposed_ms;
  f.numbers = {{"comm_ms_per_step", comm_ms},
               {"exposed_ms_per_step", exposed_ms},
               {"cost_exposed_comm_ms_per_step", exposed_ms},
               {"hidden_fraction", hidden},
               {"exposed_fraction_of_step", exposed_ms / step_ms},
               {"longest_exposed_ms_per_step", longest_ms},
               {"comm_per_step", m.per_step(static_cast<double>(kernels))}};
  f.title = fmt::format(
      "communication left exposed after backward: {} per step runs while no compute kernel does ({} of "
      "the step)",
      ms_text(exposed_ms), pct(exposed_ms / step_ms));
  f.evidence = fmt::format(
      "communication kernels and peer copies ({} per step) ran {} per step; compute kernels hid {} of it; "
      "{} per step ran while no compute kernel did, the longest stretch {} per step: the steps' compute "
      "waited for the gradients' reduction",
      count_text(m.per_step(static_cast<double>(kernels))), ms_text(comm_ms), pct(hidden),
      ms_text(exposed_ms), ms_text(longest_ms));
  const char* buckets = m.pytorch() ? torch_bucket_fix : bucket_fix;
  const char* codec = m.pytorch() ? torch_codec_fix : codec_fix;
  f.fix = hidden < late_start_hidden ? fmt::format("{}; {}; {}", buckets, codec, link_fix)
                                     : fmt::format("{}; {}; {}", codec, link_fix, buckets);
  out.push_back(std::move(f));
}

}  // namespace ferry::trace::detail
