// compute_bound: no transfer bottleneck, the GPU computes nearly all the time. Informational: it runs
// only when no other finding is material, and then leads.
#include <fmt/format.h>

#include "rules.hpp"
#include "wording.hpp"

namespace ferry::trace::detail {

void find_compute_bound(const model& m, std::vector<finding>& out) {
  const step_breakdown& mean = m.summary().mean;
  const double copy_ms = mean.h2d_ms + mean.d2h_ms + mean.d2d_ms;
  finding f;
  f.rule = "compute_bound";
  const double compute_fraction = mean.wall_ms > 0 ? (mean.compute_ms + mean.comm_ms) / mean.wall_ms : 0;
  const bool hidden = mean.copy_overlap >= 0.9 || copy_ms < material_fraction * mean.wall_ms;
  f.title = fmt::format("the GPU computes {} of each step; transfers are {}", pct(compute_fraction),
                        hidden ? "hidden" : fmt::format("{} hidden", pct(mean.copy_overlap)));
  f.evidence = fmt::format(
      "busy {} of a {} step: kernels {}, exclusive copies and memsets {}, idle {}; copies "
      "overlapped with kernels {}; no finding costs {} of the step",
      pct(mean.utilization), ms_text(mean.wall_ms), ms_text(mean.compute_ms + mean.comm_ms), ms_text(copy_ms),
      ms_text(mean.idle_ms), pct(mean.copy_overlap), pct(material_fraction));
  f.fix = "none needed for data movement; speed up the model itself";
  f.numbers = {{"utilization", mean.utilization},
               {"compute_fraction", compute_fraction},
               {"copy_overlap", mean.copy_overlap},
               {"idle_fraction", mean.wall_ms > 0 ? mean.idle_ms / mean.wall_ms : 0}};
  out.push_back(std::move(f));
}

}  // namespace ferry::trace::detail
