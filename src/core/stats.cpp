#include "ferry/core/stats.hpp"

#include <algorithm>
#include <bit>
#include <cmath>

#include <fmt/format.h>

#include "ferry/core/error.hpp"
#include "ferry/core/units.hpp"

namespace ferry {

std::size_t histogram::bucket_of(std::uint64_t ns) noexcept {
  if (ns < sub_buckets) return static_cast<std::size_t>(ns);
  const auto msb = static_cast<std::size_t>(63 - std::countl_zero(ns));
  const auto sub = static_cast<std::size_t>((ns >> (msb - 4)) & (sub_buckets - 1));
  return (msb - 3) * sub_buckets + sub;
}

std::uint64_t histogram::bucket_lower(std::size_t index) noexcept {
  if (index < sub_buckets) return index;
  const std::size_t msb = index / sub_buckets + 3;
  const std::uint64_t sub = index % sub_buckets;
  return (std::uint64_t{1} << msb) + (sub << (msb - 4));
}

std::uint64_t histogram::bucket_width(std::size_t index) noexcept {
  if (index < sub_buckets) return 1;
  return std::uint64_t{1} << (index / sub_buckets - 1);
}

void histogram::record_ns(std::uint64_t ns) noexcept {
  buckets_[bucket_of(ns)].fetch_add(1, std::memory_order_relaxed);
  count_.fetch_add(1, std::memory_order_relaxed);
  sum_.fetch_add(ns, std::memory_order_relaxed);
  // The CAS loops run only while this value is a new extreme, which soon becomes rare.
  std::uint64_t low = min_.load(std::memory_order_relaxed);
  while (ns < low && !min_.compare_exchange_weak(low, ns, std::memory_order_relaxed)) {
  }
  std::uint64_t high = max_.load(std::memory_order_relaxed);
  while (ns > high && !max_.compare_exchange_weak(high, ns, std::memory_order_relaxed)) {
  }
}

std::uint64_t histogram::min() const noexcept {
  const std::uint64_t low = min_.load(std::memory_order_relaxed);
  return low == UINT64_MAX && count() == 0 ? 0 : low;
}

double histogram::mean_ns() const noexcept {
  const std::uint64_t n = count();
  return n == 0 ? 0.0 : static_cast<double>(sum_ns()) / static_cast<double>(n);
}

std::uint64_t histogram::percentile_ns(double p) const {
  FERRY_EXPECTS(p >= 0.0 && p <= 100.0, fmt::format("percentile {} is outside [0, 100]", p));
  // Sum the buckets rather than trusting count_: a record racing with this call may have bumped one and
  // not yet the other.
  std::uint64_t total = 0;
  for (const auto& b : buckets_) total += b.load(std::memory_order_relaxed);
  if (total == 0) return 0;
  if (p == 0.0) return min();
  if (p == 100.0) return max();
  const auto rank = std::max<std::uint64_t>(
      1, static_cast<std::uint64_t>(std::ceil(p / 100.0 * static_cast<double>(total))));
  std::uint64_t seen = 0;
  for (std::size_t i = 0; i < bucket_count; ++i) {
    seen += buckets_[i].load(std::memory_order_relaxed);
    if (seen >= rank) {
      const std::uint64_t mid = bucket_lower(i) + bucket_width(i) / 2;
      return std::clamp(mid, min(), std::max(min(), max()));
    }
  }
  return max();
}

void histogram::reset() noexcept {
  for (auto& b : buckets_) b.store(0, std::memory_order_relaxed);
  count_.store(0, std::memory_order_relaxed);
  sum_.store(0, std::memory_order_relaxed);
  min_.store(UINT64_MAX, std::memory_order_relaxed);
  max_.store(0, std::memory_order_relaxed);
}

stats_registry::stats_registry(stats_registry&& other) noexcept {
  const std::lock_guard lock(other.mu_);
  stages_ = std::move(other.stages_);
  other.stages_.clear();
}

stats_registry& stats_registry::operator=(stats_registry&& other) noexcept {
  if (this != &other) {
    const std::scoped_lock lock(mu_, other.mu_);
    stages_ = std::move(other.stages_);
    other.stages_.clear();
  }
  return *this;
}

stage_stats& stats_registry::add_stage(std::string name) {
  const std::lock_guard lock(mu_);
  for (const auto& s : stages_) {
    FERRY_EXPECTS(s->name != name, fmt::format("stats_registry already has a stage called \"{}\"", name));
  }
  stages_.push_back(std::make_unique<stage_stats>(std::move(name)));
  return *stages_.back();
}

stage_stats* stats_registry::find(std::string_view name) {
  const std::lock_guard lock(mu_);
  for (const auto& s : stages_) {
    if (s->name == name) return s.get();
  }
  return nullptr;
}

std::size_t stats_registry::size() const {
  const std::lock_guard lock(mu_);
  return stages_.size();
}

std::vector<stage_snapshot> stats_registry::snapshot() const {
  const std::lock_guard lock(mu_);
  std::vector<stage_snapshot> out;
  out.reserve(stages_.size());
  for (const auto& s : stages_) {
    stage_snapshot snap;
    snap.name = s->name;
    snap.count = s->time.count();
    snap.items = s->items.load();
    snap.bytes = s->bytes.load();
    snap.p50_ns = s->time.percentile_ns(50.0);
    snap.p99_ns = s->time.percentile_ns(99.0);
    snap.max_ns = s->time.max();
    snap.total_ns = s->time.sum_ns();
    out.push_back(std::move(snap));
  }
  return out;
}

void stats_registry::reset() {
  const std::lock_guard lock(mu_);
  for (const auto& s : stages_) {
    s->time.reset();
    s->items.reset();
    s->bytes.reset();
  }
}

std::string format_table(const std::vector<stage_snapshot>& stages) {
  constexpr std::size_t columns = 8;
  using row = std::array<std::string, columns>;
  std::vector<row> rows;
  rows.reserve(stages.size() + 1);
  rows.push_back({"stage", "count", "items", "bytes", "p50", "p99", "max", "total"});
  for (const auto& s : stages) {
    rows.push_back({s.name, std::to_string(s.count), std::to_string(s.items), format_bytes(s.bytes),
                    format_duration_ns(s.p50_ns), format_duration_ns(s.p99_ns), format_duration_ns(s.max_ns),
                    format_duration_ns(s.total_ns)});
  }
  std::array<std::size_t, columns> width{};
  for (const auto& r : rows) {
    for (std::size_t c = 0; c < columns; ++c) width[c] = std::max(width[c], r[c].size());
  }
  std::string out;
  for (const auto& r : rows) {
    // Names read left to right; numbers line up on their last digit.
    out += fmt::format("{:<{}}", r[0], width[0]);
    for (std::size_t c = 1; c < columns; ++c) out += fmt::format("  {:>{}}", r[c], width[c]);
    out += '\n';
  }
  return out;
}

double median(std::vector<double> values) {
  if (values.empty()) return 0;
  const std::size_t m = values.size() / 2;
  std::nth_element(values.begin(), values.begin() + static_cast<std::ptrdiff_t>(m), values.end());
  const double upper = values[m];
  if (values.size() % 2 == 1) return upper;
  return (*std::max_element(values.begin(), values.begin() + static_cast<std::ptrdiff_t>(m)) + upper) / 2;
}

}  // namespace ferry
