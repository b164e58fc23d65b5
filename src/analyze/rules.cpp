// The rules table and the ranking of what the rules find.
#include "rules.hpp"

#include <algorithm>
#include <array>
#include <cstddef>

namespace ferry::trace::detail {

namespace {

// Every rule, in ranking order.
constexpr std::array table{
    rule{"compute_bound", find_compute_bound, true},
    rule{"gpu_idle", find_gpu_idle},
    rule{"host_bound", find_host_bound},
    rule{"sync_copy", find_sync_copy},
    rule{"pageable_async_copy", find_pageable_async_copy},
    rule{"device_sync", find_device_sync},
    rule{"serialized_copy", find_serialized_copy},
    rule{"low_copy_bandwidth", find_low_copy_bandwidth},
    rule{"drain_tail", find_drain_tail},
};

std::size_t rank_of(std::string_view id) {
  const auto it = std::find_if(table.begin(), table.end(), [id](const rule& r) { return r.id == id; });
  return static_cast<std::size_t>(it - table.begin());
}

}  // namespace

std::vector<finding> find_all(const model& m) {
  std::vector<finding> fs;
  for (const rule& r : table)
    if (!r.fallback) r.find(m, fs);
  std::stable_sort(fs.begin(), fs.end(), [](const finding& a, const finding& b) {
    if (a.cost_ms_per_step != b.cost_ms_per_step) return a.cost_ms_per_step > b.cost_ms_per_step;
    const std::size_t ra = rank_of(a.rule), rb = rank_of(b.rule);
    if (ra != rb) return ra < rb;
    return a.title < b.title;
  });
  const double material_ms = material_fraction * m.summary().mean.wall_ms;
  const bool bound =
      std::any_of(fs.begin(), fs.end(), [&](const finding& f) { return f.cost_ms_per_step >= material_ms; });
  if (bound) return fs;
  std::vector<finding> leading;
  for (const rule& r : table)
    if (r.fallback) r.find(m, leading);
  fs.insert(fs.begin(), std::make_move_iterator(leading.begin()), std::make_move_iterator(leading.end()));
  return fs;
}

}  // namespace ferry::trace::detail
