// Counters and stage-time histograms cheap enough for the hot path, so a pipeline can name its bottleneck.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace ferry {

/// A monotonically growing count (items, bytes, events). add() is one relaxed atomic add.
class counter {
 public:
  counter() = default;
  counter(const counter&) = delete;
  counter& operator=(const counter&) = delete;

  /// Adds `n`. Thread-safe, lock-free, never blocks or throws.
  void add(std::uint64_t n = 1) noexcept { value_.fetch_add(n, std::memory_order_relaxed); }

  /// The count now. Thread-safe.
  [[nodiscard]] std::uint64_t load() const noexcept { return value_.load(std::memory_order_relaxed); }

  /// Sets the count to 0. Adds racing with it may or may not survive.
  void reset() noexcept { value_.store(0, std::memory_order_relaxed); }

 private:
  std::atomic<std::uint64_t> value_{0};
};

/// A histogram of durations in nanoseconds with log-linear buckets.
///
/// Values below 16 ns have a bucket each; above, every power of two is split into 16 equal buckets, so a
/// percentile (reported at its bucket's midpoint) is within 1/32 (3.2%) of a recorded value of the same
/// rank. count, sum, min and max are exact. record() is a handful of relaxed atomic operations: no lock,
/// no allocation. Readers racing with writers see a consistent-enough view, not a snapshot.
class histogram {
 public:
  /// Linear sub-buckets per power of two.
  static constexpr std::size_t sub_buckets = 16;
  /// Total number of buckets: 16 exact ones below 16 ns, then 16 per power of two from 2^4 to 2^63.
  static constexpr std::size_t bucket_count = sub_buckets * 61;

  histogram() = default;
  histogram(const histogram&) = delete;
  histogram& operator=(const histogram&) = delete;

  /// Records one duration; negative durations count as 0. Thread-safe, lock-free, never throws.
  void record(std::chrono::nanoseconds duration) noexcept {
    record_ns(duration.count() < 0 ? 0 : static_cast<std::uint64_t>(duration.count()));
  }

  /// Records one duration of `ns` nanoseconds. Thread-safe, lock-free, never throws.
  void record_ns(std::uint64_t ns) noexcept;

  /// Number of recorded values.
  [[nodiscard]] std::uint64_t count() const noexcept { return count_.load(std::memory_order_relaxed); }
  /// Sum of recorded values in nanoseconds.
  [[nodiscard]] std::uint64_t sum_ns() const noexcept { return sum_.load(std::memory_order_relaxed); }
  /// Smallest recorded value; 0 when empty.
  [[nodiscard]] std::uint64_t min() const noexcept;
  /// Largest recorded value; 0 when empty.
  [[nodiscard]] std::uint64_t max() const noexcept { return max_.load(std::memory_order_relaxed); }
  /// Mean in nanoseconds; 0 when empty.
  [[nodiscard]] double mean_ns() const noexcept;

  /// The value below which `p` percent of the recorded values lie (nearest rank, reported at the bucket
  /// midpoint and clamped to [min(), max()], so p = 0 and p = 100 are exact). 0 when empty. Throws
  /// logic_error when `p` is outside [0, 100] or NaN.
  [[nodiscard]] std::uint64_t percentile_ns(double p) const;

  /// Forgets every recorded value. Records racing with it may be partly kept.
  void reset() noexcept;

  /// The bucket that holds `ns` (exposed for tests and exporters).
  [[nodiscard]] static std::size_t bucket_of(std::uint64_t ns) noexcept;
  /// The smallest value bucket `index` holds.
  [[nodiscard]] static std::uint64_t bucket_lower(std::size_t index) noexcept;
  /// The number of values bucket `index` holds (1 for the exact buckets).
  [[nodiscard]] static std::uint64_t bucket_width(std::size_t index) noexcept;

 private:
  std::array<std::atomic<std::uint64_t>, bucket_count> buckets_{};
  std::atomic<std::uint64_t> count_{0};
  std::atomic<std::uint64_t> sum_{0};
  std::atomic<std::uint64_t> min_{UINT64_MAX};
  std::atomic<std::uint64_t> max_{0};
};

/// Records the steady_clock time from its construction to its destruction (or to stop()) into a
/// histogram. Move-only; a moved-from timer records nothing. Never throws.
class stage_timer {
 public:
  /// Starts timing into `into`, which must outlive the timer.
  explicit stage_timer(histogram& into) noexcept : into_(&into), start_(std::chrono::steady_clock::now()) {}

  stage_timer(const stage_timer&) = delete;
  stage_timer& operator=(const stage_timer&) = delete;
  /// Takes over `other`'s running measurement; `other` then records nothing.
  stage_timer(stage_timer&& other) noexcept : into_(other.into_), start_(other.start_) {
    other.into_ = nullptr;
  }
  /// Records this timer's running measurement (if any), then takes over `other`'s.
  stage_timer& operator=(stage_timer&& other) noexcept {
    if (this != &other) {
      stop();
      into_ = other.into_;
      start_ = other.start_;
      other.into_ = nullptr;
    }
    return *this;
  }
  /// Records the elapsed time unless stop() already did.
  ~stage_timer() { stop(); }

  /// Records the elapsed time now and returns it; later calls (and the destructor) record nothing and
  /// return zero.
  std::chrono::nanoseconds stop() noexcept {
    if (into_ == nullptr) return std::chrono::nanoseconds::zero();
    const auto elapsed = std::chrono::steady_clock::now() - start_;
    into_->record(elapsed);
    into_ = nullptr;
    return elapsed;
  }

  /// True while the timer will still record.
  [[nodiscard]] bool running() const noexcept { return into_ != nullptr; }

 private:
  histogram* into_;
  std::chrono::steady_clock::time_point start_;
};

/// The statistics of one pipeline stage: time per operation, items and bytes it handled.
struct stage_stats {
  /// Creates an empty stage called `stage_name`.
  explicit stage_stats(std::string stage_name) : name(std::move(stage_name)) {}

  /// Records one operation of `duration` that handled `n_items` items and `n_bytes` bytes.
  /// Lock-free, never throws.
  void record(std::chrono::nanoseconds duration, std::uint64_t n_items = 1,
              std::uint64_t n_bytes = 0) noexcept {
    time.record(duration);
    items.add(n_items);
    bytes.add(n_bytes);
  }

  std::string name;  ///< Fixed when the stage is added.
  histogram time;    ///< Time per operation.
  counter items;     ///< Items handled.
  counter bytes;     ///< Bytes handled.
};

/// What a stage had done when snapshot() was taken.
struct stage_snapshot {
  std::string name;
  std::uint64_t count = 0;  ///< Timed operations.
  std::uint64_t items = 0;
  std::uint64_t bytes = 0;
  std::uint64_t p50_ns = 0;
  std::uint64_t p99_ns = 0;
  std::uint64_t max_ns = 0;
  std::uint64_t total_ns = 0;  ///< Sum of the operations' times (across threads, so it can exceed wall time).
};

/// The named stages of a pipeline, created up front so that recording never looks anything up.
///
/// References returned by add_stage() stay valid for the registry's life, also across moves. add_stage
/// and snapshot are thread-safe with respect to each other and to recording.
class stats_registry {
 public:
  stats_registry() = default;
  stats_registry(const stats_registry&) = delete;
  stats_registry& operator=(const stats_registry&) = delete;
  /// Takes over `other`'s stages (their addresses do not change); `other` is left empty.
  stats_registry(stats_registry&& other) noexcept;
  /// Replaces this registry's stages with `other`'s; `other` is left empty.
  stats_registry& operator=(stats_registry&& other) noexcept;
  ~stats_registry() = default;

  /// Adds a stage called `name` and returns it. Throws logic_error when a stage of that name exists.
  stage_stats& add_stage(std::string name);

  /// The stage called `name`, or nullptr.
  [[nodiscard]] stage_stats* find(std::string_view name);

  /// Number of stages.
  [[nodiscard]] std::size_t size() const;

  /// A copy of every stage's numbers, in the order the stages were added.
  [[nodiscard]] std::vector<stage_snapshot> snapshot() const;

  /// Resets every stage's histogram and counters.
  void reset();

 private:
  mutable std::mutex mu_;
  std::vector<std::unique_ptr<stage_stats>> stages_;
};

/// An aligned text table of `stages`, one row each: stage, count, items, bytes, p50, p99, max, total.
/// Durations and sizes are human-readable ("12.3 us", "64.0 MiB").
[[nodiscard]] std::string format_table(const std::vector<stage_snapshot>& stages);

/// The median of `values` (the mean of the middle two for an even count); 0 when empty.
[[nodiscard]] double median(std::vector<double> values);

}  // namespace ferry
