#include "ferry/core/stats.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "ferry/core/error.hpp"
#include "ferry/core/units.hpp"

namespace {

using namespace std::chrono_literals;
using ferry::histogram;

// Nearest-rank percentile of sorted values: the reference the histogram approximates.
std::uint64_t exact_percentile(const std::vector<std::uint64_t>& sorted, double p) {
  const auto rank = std::max<std::size_t>(1, static_cast<std::size_t>(std::ceil(p / 100.0 * sorted.size())));
  return sorted[rank - 1];
}

void expect_percentiles_within_bound(const std::vector<std::uint64_t>& values) {
  histogram h;
  for (const auto v : values) h.record_ns(v);
  std::vector<std::uint64_t> sorted = values;
  std::sort(sorted.begin(), sorted.end());
  for (const double p : {1.0, 10.0, 25.0, 50.0, 75.0, 90.0, 99.0, 99.9}) {
    const double exact = static_cast<double>(exact_percentile(sorted, p));
    const double got = static_cast<double>(h.percentile_ns(p));
    EXPECT_LE(std::abs(got - exact), exact / 32.0 + 0.5) << "p" << p << " exact " << exact << " got " << got;
  }
  EXPECT_EQ(h.percentile_ns(0), sorted.front());
  EXPECT_EQ(h.percentile_ns(100), sorted.back());
}

TEST(counter, adds_loads_and_resets) {
  ferry::counter c;
  EXPECT_EQ(c.load(), 0U);
  c.add();
  c.add(41);
  EXPECT_EQ(c.load(), 42U);
  c.reset();
  EXPECT_EQ(c.load(), 0U);
}

TEST(counter, concurrent_adds_are_exact) {
  ferry::counter c;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 10'000; ++i) c.add(3);
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(c.load(), 4U * 10'000U * 3U);
}

TEST(histogram, buckets_cover_every_value_with_bounded_width) {
  EXPECT_EQ(histogram::bucket_of(0), 0U);
  EXPECT_EQ(histogram::bucket_of(15), 15U);
  EXPECT_EQ(histogram::bucket_of(UINT64_MAX), histogram::bucket_count - 1);
  std::size_t previous = 0;
  std::mt19937_64 rng(7);
  std::vector<std::uint64_t> values;
  for (std::uint64_t v = 0; v < 5000; ++v) values.push_back(v);
  for (int i = 0; i < 5000; ++i) values.push_back(rng() >> (rng() % 64));
  values.push_back(UINT64_MAX);
  std::sort(values.begin(), values.end());
  for (const auto v : values) {
    const std::size_t b = histogram::bucket_of(v);
    ASSERT_LT(b, histogram::bucket_count);
    ASSERT_GE(b, previous) << "buckets not monotone at " << v;
    previous = b;
    const std::uint64_t lo = histogram::bucket_lower(b);
    const std::uint64_t width = histogram::bucket_width(b);
    ASSERT_LE(lo, v);
    ASSERT_LE(v - lo, width - 1) << v;
    // Width at most 1/16 of the bucket's lower edge: the source of the error bound.
    if (b >= 16) {
      ASSERT_LE(width * 16, lo) << v;
    }
  }
  // Consecutive buckets tile the range with no gap.
  for (std::size_t b = 0; b + 1 < histogram::bucket_count; ++b) {
    ASSERT_EQ(histogram::bucket_lower(b) + histogram::bucket_width(b), histogram::bucket_lower(b + 1)) << b;
  }
}

TEST(histogram, empty_reads_zero) {
  const histogram h;
  EXPECT_EQ(h.count(), 0U);
  EXPECT_EQ(h.sum_ns(), 0U);
  EXPECT_EQ(h.min(), 0U);
  EXPECT_EQ(h.max(), 0U);
  EXPECT_EQ(h.mean_ns(), 0.0);
  EXPECT_EQ(h.percentile_ns(50), 0U);
}

TEST(histogram, exact_aggregates) {
  histogram h;
  h.record(300ns);
  h.record_ns(100);
  h.record(std::chrono::microseconds(2));
  h.record(-5ns);  // negative counts as 0
  EXPECT_EQ(h.count(), 4U);
  EXPECT_EQ(h.sum_ns(), 2400U);
  EXPECT_EQ(h.min(), 0U);
  EXPECT_EQ(h.max(), 2000U);
  EXPECT_DOUBLE_EQ(h.mean_ns(), 600.0);
}

TEST(histogram, small_values_are_exact) {
  histogram h;
  for (std::uint64_t v = 1; v <= 20; ++v) h.record_ns(v);
  EXPECT_EQ(h.percentile_ns(50), 10U);
  EXPECT_EQ(h.percentile_ns(5), 1U);
  EXPECT_EQ(h.percentile_ns(100), 20U);
}

TEST(histogram, percentiles_on_uniform_distribution) {
  std::vector<std::uint64_t> values;
  for (std::uint64_t v = 1; v <= 100'000; ++v) values.push_back(v * 7);
  expect_percentiles_within_bound(values);
}

TEST(histogram, percentiles_on_lognormal_distribution) {
  std::mt19937_64 rng(12345);
  std::lognormal_distribution<double> dist(std::log(50'000.0), 1.5);  // ~50 us median, long tail
  std::vector<std::uint64_t> values;
  for (int i = 0; i < 50'000; ++i) values.push_back(static_cast<std::uint64_t>(dist(rng)));
  expect_percentiles_within_bound(values);
}

TEST(histogram, percentiles_on_bimodal_distribution) {
  // A fast path at ~2 us and a slow path at ~5 ms: p50 and p99 must land in the right mode.
  std::mt19937_64 rng(99);
  std::normal_distribution<double> fast(2'000.0, 100.0);
  std::normal_distribution<double> slow(5'000'000.0, 50'000.0);
  std::vector<std::uint64_t> values;
  for (int i = 0; i < 20'000; ++i) {
    values.push_back(static_cast<std::uint64_t>(i % 50 == 0 ? slow(rng) : fast(rng)));
  }
  expect_percentiles_within_bound(values);
}

TEST(histogram, percentile_outside_range_is_misuse) {
  histogram h;
  h.record_ns(5);
  EXPECT_THROW((void)h.percentile_ns(-1), ferry::logic_error);
  EXPECT_THROW((void)h.percentile_ns(100.5), ferry::logic_error);
  EXPECT_THROW((void)h.percentile_ns(std::nan("")), ferry::logic_error);
}

TEST(histogram, reset_forgets_everything) {
  histogram h;
  for (std::uint64_t v = 1; v < 1000; ++v) h.record_ns(v);
  h.reset();
  EXPECT_EQ(h.count(), 0U);
  EXPECT_EQ(h.sum_ns(), 0U);
  EXPECT_EQ(h.min(), 0U);
  EXPECT_EQ(h.max(), 0U);
  EXPECT_EQ(h.percentile_ns(99), 0U);
  h.record_ns(77);
  EXPECT_EQ(h.min(), 77U);
  EXPECT_EQ(h.percentile_ns(50), 77U);
}

TEST(histogram, concurrent_records_are_counted_exactly) {
  histogram h;
  constexpr int threads = 4;
  constexpr int per_thread = 20'000;
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&h, t] {
      for (int i = 1; i <= per_thread; ++i) h.record_ns(static_cast<std::uint64_t>(i + t * per_thread));
    });
  }
  for (auto& w : workers) w.join();
  constexpr std::uint64_t n = threads * per_thread;
  EXPECT_EQ(h.count(), n);
  EXPECT_EQ(h.sum_ns(), n * (n + 1) / 2);
  EXPECT_EQ(h.min(), 1U);
  EXPECT_EQ(h.max(), n);
  const double p50 = static_cast<double>(h.percentile_ns(50));
  EXPECT_NEAR(p50, n / 2.0, n / 2.0 / 32.0 + 1);
}

TEST(stage_timer, records_on_destruction) {
  histogram h;
  {
    const ferry::stage_timer t(h);
    std::this_thread::sleep_for(2ms);
  }
  ASSERT_EQ(h.count(), 1U);
  EXPECT_GE(h.max(), 2'000'000U);
}

TEST(stage_timer, stop_records_once) {
  histogram h;
  {
    ferry::stage_timer t(h);
    EXPECT_TRUE(t.running());
    const auto elapsed = t.stop();
    EXPECT_GE(elapsed.count(), 0);
    EXPECT_FALSE(t.running());
    EXPECT_EQ(t.stop(), 0ns);
  }
  EXPECT_EQ(h.count(), 1U);
}

TEST(stage_timer, moved_from_records_nothing) {
  histogram h;
  {
    ferry::stage_timer a(h);
    ferry::stage_timer b(std::move(a));
    EXPECT_FALSE(a.running());  // NOLINT(bugprone-use-after-move): moved-from must be empty
    EXPECT_TRUE(b.running());
  }
  EXPECT_EQ(h.count(), 1U);

  histogram other;
  {
    ferry::stage_timer a(h);
    ferry::stage_timer b(other);
    b = std::move(a);  // records b's measurement into `other`, then carries a's
  }
  EXPECT_EQ(other.count(), 1U);
  EXPECT_EQ(h.count(), 2U);
}

TEST(stats_registry, stages_keep_their_address) {
  ferry::stats_registry reg;
  ferry::stage_stats& first = reg.add_stage("read");
  for (int i = 0; i < 100; ++i) (void)reg.add_stage("stage" + std::to_string(i));
  EXPECT_EQ(&first, reg.find("read"));
  EXPECT_EQ(reg.find("absent"), nullptr);
  EXPECT_EQ(reg.size(), 101U);

  ferry::stats_registry moved(std::move(reg));
  EXPECT_EQ(reg.size(), 0U);  // NOLINT(bugprone-use-after-move): moved-from must be empty
  EXPECT_EQ(&first, moved.find("read"));
  first.record(1us);
  EXPECT_EQ(moved.snapshot().front().count, 1U);
}

TEST(stats_registry, duplicate_stage_is_misuse) {
  ferry::stats_registry reg;
  (void)reg.add_stage("copy");
  try {
    (void)reg.add_stage("copy");
    FAIL() << "no throw";
  } catch (const ferry::logic_error& e) {
    EXPECT_NE(std::string(e.what()).find("\"copy\""), std::string::npos) << e.what();
  }
}

TEST(stats_registry, snapshot_reports_every_stage_in_order) {
  ferry::stats_registry reg;
  auto& load = reg.add_stage("load");
  auto& copy = reg.add_stage("h2d copy");
  for (int i = 1; i <= 100; ++i) load.record(std::chrono::microseconds(i), 2, 1000);
  copy.record(5ms, 1, 64 * ferry::MiB);
  copy.bytes.add(1);

  const auto snap = reg.snapshot();
  ASSERT_EQ(snap.size(), 2U);
  EXPECT_EQ(snap[0].name, "load");
  EXPECT_EQ(snap[0].count, 100U);
  EXPECT_EQ(snap[0].items, 200U);
  EXPECT_EQ(snap[0].bytes, 100'000U);
  EXPECT_NEAR(static_cast<double>(snap[0].p50_ns), 50'000.0, 50'000.0 / 32);
  EXPECT_NEAR(static_cast<double>(snap[0].p99_ns), 99'000.0, 99'000.0 / 32);
  EXPECT_EQ(snap[0].max_ns, 100'000U);
  EXPECT_EQ(snap[0].total_ns, 5'050'000U);
  EXPECT_EQ(snap[1].name, "h2d copy");
  EXPECT_EQ(snap[1].bytes, 64 * ferry::MiB + 1);
  EXPECT_EQ(snap[1].p50_ns, 5'000'000U);

  reg.reset();
  EXPECT_EQ(reg.snapshot()[0].count, 0U);
  EXPECT_EQ(reg.snapshot()[1].bytes, 0U);
}

TEST(stats_registry, format_table_is_aligned) {
  ferry::stats_registry reg;
  reg.add_stage("load").record(12'345ns, 1, 512);
  reg.add_stage("h2d copy (pinned)").record(1'200'000ns, 3, 64 * ferry::MiB);
  const std::string table = ferry::format_table(reg.snapshot());

  std::istringstream in(table);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  ASSERT_EQ(lines.size(), 3U) << table;
  for (const auto& line : lines) EXPECT_EQ(line.size(), lines[0].size()) << table;
  EXPECT_EQ(lines[0].rfind("stage", 0), 0U) << table;
  for (const char* column : {"count", "items", "bytes", "p50", "p99", "max", "total"}) {
    EXPECT_NE(lines[0].find(column), std::string::npos) << column;
  }
  EXPECT_EQ(lines[1].rfind("load ", 0), 0U) << table;
  EXPECT_NE(lines[1].find("12.3 us"), std::string::npos) << table;
  EXPECT_NE(lines[1].find("512 B"), std::string::npos) << table;
  EXPECT_NE(lines[2].find("h2d copy (pinned)"), std::string::npos) << table;
  EXPECT_NE(lines[2].find("64.0 MiB"), std::string::npos) << table;
  EXPECT_NE(lines[2].find("1.20 ms"), std::string::npos) << table;
  // Right-aligned numbers end in the same column: the "total" column ends each line.
  EXPECT_EQ(lines[1].substr(lines[1].size() - 7), "12.3 us") << table;
  // No stages: only the header.
  const std::string empty = ferry::format_table({});
  EXPECT_EQ(empty.rfind("stage", 0), 0U) << empty;
  EXPECT_EQ(std::count(empty.begin(), empty.end(), '\n'), 1) << empty;
}

}  // namespace
