// The analyzer's rules. Each rule is one file in rules/ defining one function that reads the model and
// appends its findings (none, or one per thing it names); the table in rules.cpp lists them in ranking
// order. A new rule: its file, its declaration below, and its line in the table.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/analyze/analyze.hpp"
#include "model.hpp"

namespace ferry::trace::detail {

/// A finding below this fraction of the mean step does not bound the workload; when every finding is
/// below it, compute_bound leads. 3%: the pipelines are judged at 0.97 of ideal and above, so a loss of
/// 3% (a pinned copy serialized with the kernels at ingest L2 costs 3.9%) is worth its fix.
inline constexpr double material_fraction = 0.03;

/// A CPU activity is named as the cause of GPU idle only when it covers at least this share of the idle.
inline constexpr double cause_share = 0.20;

/// Appends a rule's findings to `out`.
using rule_fn = void (*)(const model& m, std::vector<finding>& out);

/// One rule of the table.
struct rule {
  std::string_view id;  // finding::rule of what it appends
  rule_fn find;
  /// Runs only when no other rule's finding costs material_fraction of the mean step; what it appends
  /// then leads the findings.
  bool fallback = false;
};

void find_compute_bound(const model& m, std::vector<finding>& out);
void find_gpu_idle(const model& m, std::vector<finding>& out);
void find_sync_copy(const model& m, std::vector<finding>& out);
void find_pageable_async_copy(const model& m, std::vector<finding>& out);
void find_device_sync(const model& m, std::vector<finding>& out);
void find_serialized_copy(const model& m, std::vector<finding>& out);
void find_exposed_comm(const model& m, std::vector<finding>& out);
void find_low_copy_bandwidth(const model& m, std::vector<finding>& out);
void find_host_bound(const model& m, std::vector<finding>& out);
void find_drain_tail(const model& m, std::vector<finding>& out);

/// Named host work after the last step's GPU work: [start, end) and the activity that covered most of it
/// (top_ns of it; 0 when none, or when it covered less than cause_share of the span). Another thread's
/// wait is no work; the main thread's is.
struct trailing_work {
  ns_t start = 0;
  ns_t end = 0;
  std::uint64_t thread = 0;
  std::uint64_t label = 0;
  ns_t top_ns = 0;
  [[nodiscard]] ns_t length() const noexcept { return end - start; }
};
[[nodiscard]] trailing_work find_trailing_work(const model& m);

/// The main thread waiting for another thread's GPU work: the main thread's activity that covers most of
/// the GPU idle (at least cause_share of it) is a wait for another thread (a condition variable or a
/// futex), and another thread of the same process launched GPU work during those waits, densely (a launch
/// every 200 us or less of the idle it was awake through, on average), and was itself awake (in no host
/// wait of its own) through at least half of the GPU idle inside them. PyTorch runs a
/// CUDA backward on its autograd engine's thread (pt_autograd_N) while the thread that called backward()
/// waits on a condition variable: the waiting thread is not host-bound; the launching one bounds the GPU.
/// The engine's own work between launches is not recorded, so the launches alone cover little of the idle
/// (12% on a launch-bound MLP on an H200): the thread's being awake is the evidence.
struct delegation {
  const idle_attribution* wait = nullptr;  // the main thread's; null: no delegation
  std::uint64_t thread = 0;                // the thread it waits for
  std::string thread_name;
  std::size_t launches = 0;   // that thread's launch calls during the waits, over all steps
  double awake_ms = 0;        // GPU idle inside the waits while that thread was awake, over all steps
  double awake_fraction = 0;  // of the GPU idle inside the waits
  const idle_attribution* activity = nullptr;  // its launch or framework activity covering most idle
};
[[nodiscard]] delegation delegated_work(const model& m);

/// Runs every rule of the table on `m` and returns the findings, ranked: costliest first and, on equal
/// cost, by their rule's place in the table (the rule that names the more direct cause first), then by
/// title; a fallback's finding leads.
[[nodiscard]] std::vector<finding> find_all(const model& m);

}  // namespace ferry::trace::detail
