// Sorted, disjoint time intervals with prefix sums of their lengths: the covered length of any window
// costs O(log n). The analyzer's GPU activity is held in these.
#pragma once

#include <algorithm>
#include <cstdint>
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
  /// The union of `spans`; empty and reversed spans add nothing.
  explicit interval_union(std::vector<span> spans) {
    std::sort(spans.begin(), spans.end(), [](const span& a, const span& b) {
      return a.start != b.start ? a.start < b.start : a.end < b.end;
    });
    for (const span& s : spans) {
      if (s.end <= s.start) continue;
      if (!spans_.empty() && s.start <= spans_.back().end) {
        spans_.back().end = std::max(spans_.back().end, s.end);
      } else {
        spans_.push_back(s);
      }
    }
    prefix_.reserve(spans_.size() + 1);
    for (const span& s : spans_) prefix_.push_back(prefix_.back() + (s.end - s.start));
  }

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

  std::vector<span> spans_;
  std::vector<ns_t> prefix_{0};
};

}  // namespace ferry::trace::detail
