// The report's vocabulary of colours (private to ferry::report): the step breakdown's categories and the
// timeline's event kinds, each with the key that the CSS, the legends and the drawings share.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

#include "ferry/analyze/analyze.hpp"

namespace ferry::trace::html {

/// A category of the step breakdown: its key, colour and field.
struct category {
  const char* key;
  const char* colour;
  double step_breakdown::*ms;
};

/// Stacked bottom to top in the analyzer's order; idle last.
inline constexpr std::array<category, 6> categories{{
    {"compute", "#4e79a7", &step_breakdown::compute_ms},
    {"comm", "#b07aa1", &step_breakdown::comm_ms},
    {"d2d", "#76b7b2", &step_breakdown::d2d_ms},
    {"h2d", "#f28e2b", &step_breakdown::h2d_ms},
    {"d2h", "#e15759", &step_breakdown::d2h_ms},
    {"idle", "#cfcfcf", &step_breakdown::idle_ms},
}};

/// What the timeline draws an event as (finer than activity: copies by direction, communication
/// kernels apart).
enum class kind : std::uint8_t { kernel, comm, h2d, d2h, d2d, p2p, memcpy, memset, api, sync, range, stage };
inline constexpr std::size_t kind_count = 12;

/// A kind's key (CSS and data-kind), legend label and colour.
struct kind_info {
  const char* key;
  const char* label;
  const char* colour;
};

/// Indexed by kind.
inline constexpr std::array<kind_info, kind_count> kinds{{
    {"kernel", "kernel", "#4e79a7"},
    {"comm", "communication kernel", "#b07aa1"},
    {"h2d", "memcpy host to device", "#f28e2b"},
    {"d2h", "memcpy device to host", "#e15759"},
    {"d2d", "memcpy device to device", "#76b7b2"},
    {"p2p", "memcpy peer to peer", "#9d7660"},
    {"memcpy", "memcpy (other)", "#edc948"},
    {"memset", "memset", "#499894"},
    {"api", "runtime API call", "#bab0ac"},
    {"sync", "synchronize", "#d37295"},
    {"range", "range (NVTX, annotation)", "#a0cbe8"},
    {"stage", "ferry stage", "#8cd17d"},
}};

inline const kind_info& info(kind k) { return kinds[static_cast<std::size_t>(k)]; }

}  // namespace ferry::trace::html
