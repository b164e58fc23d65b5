// The byte stream the trace reader parses (private to ferry::trace): a trace_input read in chunks, inflated
// on the fly when it starts with gzip's magic bytes, with read_limits::max_bytes applied to what comes
// out (so a gzip bomb stops at the limit), and progress reported as it goes.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "ferry/core/progress.hpp"
#include "ferry/trace/trace_io.hpp"

namespace ferry::trace::detail {

class byte_stream {
 public:
  /// Opens `in` from its first byte (calls in.open()). Throws input_error naming in.origin.
  byte_stream(const trace_input& in, const read_limits& limits, const progress_fn& progress);
  byte_stream(const byte_stream&) = delete;
  byte_stream& operator=(const byte_stream&) = delete;
  ~byte_stream();

  /// The next byte is available at cursor(); false once the input ended (throws input_error for an
  /// input over the limit or a corrupt gzip stream).
  [[nodiscard]] bool available() {
    if (p_ != end_) return true;
    return refill();
  }
  [[nodiscard]] char peek() const { return *p_; }
  void advance() { ++p_; }

  /// Bytes of JSON delivered so far (inflated bytes for gzip), and whether the input has ended.
  [[nodiscard]] std::uint64_t delivered() const { return delivered_ - static_cast<std::uint64_t>(end_ - p_); }
  [[nodiscard]] bool ended() const { return ended_; }
  [[nodiscard]] bool gzip() const { return gzip_ != nullptr; }
  /// The JSON's total size when known before the end (plain input of a known size); else 0.
  [[nodiscard]] std::uint64_t known_size() const { return gzip_ ? (ended_ ? delivered_ : 0) : in_.size; }
  /// Counts events for progress lines.
  void set_events(std::uint64_t n) { events_ = n; }

 private:
  struct inflater;
  bool refill();
  std::size_t read_raw(char* buf, std::size_t capacity);
  void report();

  const trace_input& in_;
  const read_limits& limits_;
  const progress_fn& progress_;
  trace_reader reader_;
  std::vector<char> raw_;  // compressed bytes (gzip)
  std::vector<char> buf_;  // JSON bytes
  const char* p_ = nullptr;
  const char* end_ = nullptr;
  std::uint64_t delivered_ = 0;  // JSON bytes put into buf_ so far
  std::uint64_t raw_read_ = 0;   // bytes read from the input
  std::unique_ptr<inflater> gzip_;
  bool ended_ = false;
  std::uint64_t events_ = 0;
  std::chrono::steady_clock::time_point start_;
  std::chrono::steady_clock::time_point last_report_;
  bool reported_ = false;
};

/// An input iterator over a byte_stream, for nlohmann's parser; equal to the end iterator (nullptr)
/// once the stream has ended.
class byte_iterator {
 public:
  using iterator_category = std::input_iterator_tag;
  using value_type = char;
  using difference_type = std::ptrdiff_t;
  using pointer = const char*;
  using reference = char;

  byte_iterator() = default;
  explicit byte_iterator(byte_stream* s) : s_(s) {}
  reference operator*() const { return s_->peek(); }
  byte_iterator& operator++() {
    s_->advance();
    return *this;
  }
  byte_iterator operator++(int) {
    byte_iterator old = *this;
    s_->advance();
    return old;
  }
  friend bool operator==(const byte_iterator& a, const byte_iterator& b) {
    byte_stream* s = a.s_ != nullptr ? a.s_ : b.s_;
    return s == nullptr || (a.s_ != nullptr && b.s_ != nullptr) || !s->available();
  }

 private:
  byte_stream* s_ = nullptr;
};

}  // namespace ferry::trace::detail
