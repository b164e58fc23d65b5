// Sorted, disjoint time intervals with prefix sums of their lengths: the covered length of any window
// costs O(log n). The analyzer's GPU activity is held in these.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace ferry::trace::detail {

/// Nanoseconds on the timeline's clock.
using ns_t = std::int64_t;

/// A half-open interval [start, end).
struct span {
  ns_t start = 0;
  ns_t end = 0;
};

/// Sorted, disjoint intervals with prefix sums of their lengths.
class interval_union {
 public:
  interval_union() = default;
  /// The union of `spans`; empty and reversed spans add nothing. The spans are merged in place.
  explicit interval_union(std::vector<span> spans) {
    const auto by_start = [](const span& a, const span& b) {
      return a.start != b.start ? a.start < b.start : a.end < b.end;
    };
    if (!std::is_sorted(spans.begin(), spans.end(), by_start))
      std::sort(spans.begin(), spans.end(), by_start);
    std::size_t n = 0;
    for (const span& s : spans) {
      if (s.end <= s.start) continue;
      if (n > 0 && s.start <= spans[n - 1].end) {
        spans[n - 1].end = std::max(spans[n - 1].end, s.end);
      } else {
        spans[n++] = s;
      }
    }
    spans.resize(n);
    spans_ = std::move(spans);
    sum_prefix();
  }

  /// Builds a union from spans added in order of start, without holding them first.
  class sorted_builder;

  /// Covered length of [a, b).
  [[nodiscard]] ns_t covered(ns_t a, ns_t b) const { return b <= a ? 0 : before(b) - before(a); }
  /// Uncovered length of [a, b).
  [[nodiscard]] ns_t gaps(ns_t a, ns_t b) const { return b <= a ? 0 : (b - a) - covered(a, b); }

  /// Calls f(gap) for every uncovered part of [a, b), in order.
  template <class F>
  void for_each_gap(ns_t a, ns_t b, F&& f) const {
    auto it = std::partition_point(spans_.begin(), spans_.end(), [a](const span& s) { return s.end <= a; });
    ns_t cur = a;
    for (; it != spans_.end() && it->start < b; ++it) {
      if (it->start > cur) f(span{cur, it->start});
      cur = std::max(cur, it->end);
    }
    if (cur < b) f(span{cur, b});
  }

  [[nodiscard]] bool empty() const noexcept { return spans_.empty(); }
  /// The intervals, sorted and disjoint.
  [[nodiscard]] const std::vector<span>& spans() const noexcept { return spans_; }
  /// Start of the first interval; the union must not be empty.
  [[nodiscard]] ns_t first() const { return spans_.front().start; }
  /// End of the last interval; the union must not be empty.
  [[nodiscard]] ns_t last() const { return spans_.back().end; }

 private:
  // Covered length of (-inf, t).
  [[nodiscard]] ns_t before(ns_t t) const {
    const auto i = static_cast<std::size_t>(
        std::partition_point(spans_.begin(), spans_.end(), [t](const span& s) { return s.start < t; }) -
        spans_.begin());
    ns_t total = prefix_[i];
    if (i > 0 && spans_[i - 1].end > t) total -= spans_[i - 1].end - t;
    return total;
  }

  void sum_prefix() {
    prefix_.assign(1, 0);
    prefix_.reserve(spans_.size() + 1);
    for (const span& s : spans_) prefix_.push_back(prefix_.back() + (s.end - s.start));
  }

  std::vector<span> spans_;
  std::vector<ns_t> prefix_{0};
};

/// Builds a union from spans added in order of start, without holding them first: for the GPU's
/// activity, whose events the model already keeps sorted.
class interval_union::sorted_builder {
 public:
  /// At most `max_spans` disjoint spans will result (the number added bounds it). Only the room the
  /// union uses is touched, so a generous bound costs address space, not memory.
  explicit sorted_builder(std::size_t max_spans) { u_.spans_.reserve(max_spans); }
  /// Adds [start, end); `start` is not below that of the span added before. Empty spans add nothing.
  void add(ns_t start, ns_t end) {
    if (end <= start) return;
    std::vector<span>& v = u_.spans_;
    if (!v.empty() && start <= v.back().end) {
      v.back().end = std::max(v.back().end, end);
    } else {
      v.push_back({start, end});
    }
  }
  /// The union of every span added.
  [[nodiscard]] interval_union finish() && {
    u_.sum_prefix();
    return std::move(u_);
  }

 private:
  interval_union u_;
};

}  // namespace ferry::trace::detail
