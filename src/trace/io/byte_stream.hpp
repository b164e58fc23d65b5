// The byte stream the trace reader parses (private to ferry::trace): a trace_input read in chunks, inflated
// on the fly when it starts with gzip's magic bytes, with read_limits::max_bytes applied to what comes
// out (so a gzip bomb stops at the limit), and progress reported as it goes.
//
// Runs of whitespace between JSON tokens longer than max_blank_run are cut to that length before the
// parser sees them: nlohmann's lexer keeps every character since the last string, number or literal (for
// its error messages), so a gigabyte of blanks inside traceEvents would otherwise cost a gigabyte or two.
// The bytes cut are remembered by position, so errors still name offsets in the input.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <memory>
#include <string>
#include <utility>
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

  /// The longest run of whitespace between tokens the parser is given.
  static constexpr std::size_t max_blank_run = 64;

  /// Bytes of JSON in the input so far (inflated bytes for gzip), and whether the input has ended.
  [[nodiscard]] std::uint64_t delivered() const { return delivered_; }
  /// Bytes handed to the parser so far (blanks cut excluded).
  [[nodiscard]] std::uint64_t passed() const { return passed_ - static_cast<std::uint64_t>(end_ - p_); }
  /// The input offset of the parser's offset `at` (which counts no blank cut).
  [[nodiscard]] std::uint64_t input_offset(std::uint64_t at) const;
  [[nodiscard]] bool ended() const { return ended_; }
  [[nodiscard]] bool gzip() const { return gzip_ != nullptr; }
  /// The JSON's total size when known before the end (plain input of a known size); else 0.
  [[nodiscard]] std::uint64_t known_size() const { return gzip_ ? (ended_ ? delivered_ : 0) : in_.size; }
  /// Counts events for progress lines.
  void set_events(std::uint64_t n) { events_ = n; }

 private:
  struct inflater;
  bool refill();
  std::size_t cut_blanks(std::size_t n);
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
  std::uint64_t delivered_ = 0;  // JSON bytes read (inflated) so far
  std::uint64_t passed_ = 0;     // bytes put into buf_ for the parser so far
  // Blank cutting: the lexical state at the end of the last chunk, the bytes cut before this chunk, and
  // this chunk's cuts as (parser offset, bytes cut so far) at each cut.
  bool in_string_ = false;
  bool escaped_ = false;
  std::size_t blank_run_ = 0;
  std::uint64_t cut_before_chunk_ = 0;
  std::uint64_t chunk_start_ = 0;  // parser offset of buf_[0]
  std::vector<std::pair<std::uint64_t, std::uint64_t>> cuts_;
  std::uint64_t raw_read_ = 0;  // bytes read from the input
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
