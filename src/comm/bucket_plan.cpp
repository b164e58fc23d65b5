// The bucket plan: a greedy cut of the ready order under two caps, with aligned offsets.
#include "ferry/comm/bucket_plan.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <limits>

#include "ferry/core/error.hpp"

namespace ferry::comm {
namespace {

constexpr std::size_t f32_bytes = sizeof(float);

std::size_t align_up(std::size_t value, std::size_t alignment) noexcept {
  return (value + alignment - 1) / alignment * alignment;
}

bool is_power_of_two(std::size_t v) noexcept { return v != 0 && (v & (v - 1)) == 0; }

// Element counts of every parameter > 0, and the flat buffer's size fits a size_t in bytes even with the
// worst-case padding.
void check_sizes(std::span<const std::size_t> param_elements, std::size_t alignment_elements) {
  FERRY_EXPECTS(!param_elements.empty(), "bucket plan of no parameters: register at least one parameter");
  constexpr std::size_t max_total = std::numeric_limits<std::size_t>::max() / (2 * f32_bytes);
  std::size_t total = 0;
  for (std::size_t p = 0; p < param_elements.size(); ++p) {
    const std::size_t n = param_elements[p];
    FERRY_EXPECTS(n > 0, fmt::format("parameter {} has 0 elements: every parameter needs at least one "
                                     "gradient element",
                                     p));
    FERRY_EXPECTS(n <= max_total - total - alignment_elements,
                  fmt::format("parameter {} of {} elements makes the flat buffer larger than a size_t can "
                              "address",
                              p, n));
    total += align_up(n, alignment_elements);
  }
}

void check_order(std::span<const std::size_t> ready_order, std::size_t n) {
  FERRY_EXPECTS(ready_order.size() == n,
                fmt::format("ready order of {} indices for {} parameters: it must name each parameter once",
                            ready_order.size(), n));
  std::vector<bool> seen(n, false);
  for (std::size_t k = 0; k < ready_order.size(); ++k) {
    const std::size_t p = ready_order[k];
    FERRY_EXPECTS(
        p < n,
        fmt::format("ready order[{}] = {} is not a parameter index (there are {} parameters)", k, p, n));
    FERRY_EXPECTS(!seen[p], fmt::format("ready order[{}] = {} repeats a parameter: the order must name each "
                                        "parameter once",
                                        k, p));
    seen[p] = true;
  }
}

}  // namespace

std::vector<std::size_t> bucket_plan::order() const {
  std::vector<std::size_t> out;
  out.reserve(places.size());
  for (const bucket& b : buckets) out.insert(out.end(), b.params.begin(), b.params.end());
  return out;
}

std::string bucket_plan::describe() const {
  std::string out;
  for (std::size_t b = 0; b < buckets.size(); ++b) {
    const bucket& k = buckets[b];
    const auto [lo, hi] = std::minmax_element(k.params.begin(), k.params.end());
    out += fmt::format("bucket {}: {}, {} params (indices {}..{})\n", b, format_bytes(k.bytes()),
                       k.params.size(), k.params.empty() ? 0 : *lo, k.params.empty() ? 0 : *hi);
  }
  return out;
}

void check(const bucket_plan_options& options) {
  FERRY_EXPECTS(options.first_bucket_bytes > 0,
                "bucket_plan_options::first_bucket_bytes = 0: the first bucket's cap must be > 0 (1 MiB is "
                "the default)");
  FERRY_EXPECTS(
      options.bucket_cap_bytes > 0,
      "bucket_plan_options::bucket_cap_bytes = 0: the bucket cap must be > 0 (25 MiB is the default)");
  FERRY_EXPECTS(
      is_power_of_two(options.alignment_bytes) && options.alignment_bytes % f32_bytes == 0,
      fmt::format("bucket_plan_options::alignment_bytes = {}: must be a power of two and a multiple "
                  "of 4 (one fp32 element); 256 is the default",
                  options.alignment_bytes));
}

bucket_plan make_bucket_plan(std::span<const std::size_t> param_elements,
                             std::span<const std::size_t> ready_order, const bucket_plan_options& options) {
  check(options);
  const std::size_t align = options.alignment_bytes / f32_bytes;
  check_sizes(param_elements, align);
  check_order(ready_order, param_elements.size());

  bucket_plan plan;
  plan.places.resize(param_elements.size());
  std::size_t cursor = 0;  // next free element of the flat buffer (aligned)
  bucket current;
  auto close = [&] {
    if (current.params.empty()) return;
    plan.buckets.push_back(std::move(current));
    current = bucket{};
  };
  // The cap of the bucket being filled: the first bucket's until it is closed.
  auto cap = [&] {
    return (plan.buckets.empty() ? options.first_bucket_bytes : options.bucket_cap_bytes) / f32_bytes;
  };
  for (const std::size_t p : ready_order) {
    const std::size_t n = param_elements[p];
    // p joins the open bucket when the bucket, padding before p included, stays within its cap.
    if (!current.params.empty() && cursor + n - current.offset > cap()) close();
    if (current.params.empty()) current.offset = cursor;
    plan.places[p] = param_place{plan.buckets.size(), cursor, n};
    current.params.push_back(p);
    current.elements = cursor + n - current.offset;
    cursor = align_up(cursor + n, align);
    // A bucket filled to its cap (or a parameter alone above it) takes nothing more.
    if (current.elements >= cap()) close();
  }
  close();
  // The buffer ends where the last bucket ends, rounded up so every bucket's end is aligned too.
  plan.total_elements = align_up(plan.buckets.back().offset + plan.buckets.back().elements, align);
  return plan;
}

bucket_plan make_reverse_plan(std::span<const std::size_t> param_elements,
                              const bucket_plan_options& options) {
  std::vector<std::size_t> order(param_elements.size());
  for (std::size_t k = 0; k < order.size(); ++k) order[k] = order.size() - 1 - k;
  return make_bucket_plan(param_elements, order, options);
}

void validate(const bucket_plan& plan, std::span<const std::size_t> param_elements,
              std::size_t alignment_bytes) {
  FERRY_EXPECTS(
      is_power_of_two(alignment_bytes) && alignment_bytes % f32_bytes == 0,
      fmt::format("alignment of {} bytes: must be a power of two and a multiple of 4", alignment_bytes));
  const std::size_t align = alignment_bytes / f32_bytes;
  const std::size_t n = param_elements.size();
  FERRY_EXPECTS(
      plan.places.size() == n,
      fmt::format("bucket plan places {} parameters, but the reducer has {}", plan.places.size(), n));
  FERRY_EXPECTS(!plan.buckets.empty(), "bucket plan has no buckets");
  std::vector<bool> seen(n, false);
  std::size_t end = 0;  // end of the previous parameter in the flat buffer
  for (std::size_t b = 0; b < plan.buckets.size(); ++b) {
    const bucket& k = plan.buckets[b];
    FERRY_EXPECTS(!k.params.empty(), fmt::format("bucket {} of the plan holds no parameter", b));
    FERRY_EXPECTS(k.offset >= end,
                  fmt::format("bucket {} starts at element {}, inside the data before it (which "
                              "ends at {})",
                              b, k.offset, end));
    for (std::size_t j = 0; j < k.params.size(); ++j) {
      const std::size_t p = k.params[j];
      FERRY_EXPECTS(p < n, fmt::format("bucket {} names parameter {}, but there are {} parameters", b, p, n));
      FERRY_EXPECTS(!seen[p], fmt::format("bucket {} names parameter {} a second time", b, p));
      seen[p] = true;
      const param_place& at = plan.places[p];
      FERRY_EXPECTS(at.bucket == b, fmt::format("parameter {} is in bucket {} but its place says bucket {}",
                                                p, b, at.bucket));
      FERRY_EXPECTS(at.elements == param_elements[p],
                    fmt::format("parameter {} has {} elements but the plan gives it {}", p, param_elements[p],
                                at.elements));
      FERRY_EXPECTS(at.offset % align == 0,
                    fmt::format("parameter {} at element {} is not aligned to {} bytes", p, at.offset,
                                alignment_bytes));
      FERRY_EXPECTS(
          at.offset >= end && (j > 0 || at.offset == k.offset),
          fmt::format("parameter {} at element {} overlaps the data before it or is not where bucket {} "
                      "starts",
                      p, at.offset, b));
      end = at.offset + at.elements;
    }
    FERRY_EXPECTS(k.offset + k.elements == end,
                  fmt::format("bucket {} covers elements [{}, {}) but its last parameter ends at {}", b,
                              k.offset, k.offset + k.elements, end));
  }
  for (std::size_t p = 0; p < n; ++p)
    FERRY_EXPECTS(seen[p], fmt::format("parameter {} is in no bucket of the plan", p));
  FERRY_EXPECTS(plan.total_elements >= end,
                fmt::format("bucket plan's flat buffer of {} elements is smaller than its data ({})",
                            plan.total_elements, end));
}

}  // namespace ferry::comm
