// How findings and the text report phrase their numbers.
#pragma once

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/trace/names.hpp"
#include "ferry/trace/timeline.hpp"

namespace ferry::trace::detail {

/// "42%".
inline std::string pct(double fraction) { return fmt::format("{:.0f}%", fraction * 100.0); }
/// "1.25 ms".
inline std::string ms_text(double v) { return fmt::format("{:.2f} ms", v); }
/// "H2D", "D2H", or "copy" for any other kind.
inline std::string upper_dir(copy_kind k) {
  return k == copy_kind::h2d ? "H2D" : k == copy_kind::d2h ? "D2H" : "copy";
}
/// A per-step count: whole when it is whole ("2"), else one decimal ("1.5").
inline std::string count_text(double per_step) {
  return std::abs(per_step - std::round(per_step)) < 1e-9 ? fmt::format("{:.0f}", per_step)
                                                          : fmt::format("{:.1f}", per_step);
}

/// PyTorch's way to copies that neither block nor go through pageable memory: for inputs (`inputs`, H2D)
/// pinned batches and non-blocking copies, for outputs (`outputs`, D2H) ferry.torch.Egress; both when
/// neither is asked.
inline std::string torch_copy_fix(bool inputs, bool outputs) {
  std::vector<std::string> parts;
  const bool both = inputs == outputs;
  if (inputs || both)
    parts.emplace_back(
        "for inputs, DataLoader(..., pin_memory=True) and .to(device, non_blocking=True), or "
        "ferry.torch.Prefetcher(loader), which copies the next batch from its own pinned slots on its own "
        "stream while this step runs");
  if (outputs || both)
    parts.emplace_back(
        "for outputs, ferry.torch.Egress(sink).submit(output) instead of .cpu() in the loop: it copies into "
        "pinned slots on its own stream and hands each output to sink workers");
  return fmt::format("{}", fmt::join(parts, "; "));
}

}  // namespace ferry::trace::detail
