// Chunked reading and gzip inflation for the trace reader.
#include "byte_stream.hpp"

#include <fmt/format.h>
#include <zlib.h>

#include <algorithm>
#include <cstring>
#include <limits>

#include "ferry/core/error.hpp"
#include "ferry/core/units.hpp"

namespace ferry::trace::detail {

namespace {

constexpr std::size_t chunk_bytes = std::size_t{1} << 20;
constexpr unsigned char gzip_magic[2] = {0x1f, 0x8b};

}  // namespace

// zlib's inflate over the raw input; handles concatenated gzip members (what `cat a.gz b.gz` makes).
struct byte_stream::inflater {
  z_stream z{};
  bool open = false;
  bool member_ended = false;  // the last member's end was read (more may follow)
  inflater() {
    if (inflateInit2(&z, 16 + MAX_WBITS) != Z_OK) throw std::bad_alloc();
    open = true;
  }
  inflater(const inflater&) = delete;
  inflater& operator=(const inflater&) = delete;
  ~inflater() {
    if (open) inflateEnd(&z);
  }
};

byte_stream::byte_stream(const trace_input& in, const read_limits& limits, const progress_fn& progress)
    : in_(in), limits_(limits), progress_(progress), buf_(chunk_bytes) {
  if (!in.open) throw input_error(fmt::format("{}: no reader to read the trace from", in.origin));
  reader_ = in.open();
  start_ = last_report_ = std::chrono::steady_clock::now();
  // Sniff the first bytes: gzip starts with 1f 8b.
  raw_.resize(chunk_bytes);
  std::size_t n = 0;
  while (n < 2) {
    const std::size_t got = read_raw(raw_.data() + n, raw_.size() - n);
    if (got == 0) break;
    n += got;
  }
  if (n >= 2 && std::memcmp(raw_.data(), gzip_magic, 2) == 0) {
    gzip_ = std::make_unique<inflater>();
    gzip_->z.next_in = reinterpret_cast<Bytef*>(raw_.data());
    gzip_->z.avail_in = static_cast<uInt>(n);
  } else {
    // Plain JSON: what was read is the first chunk.
    std::copy_n(raw_.data(), n, buf_.data());
    raw_.clear();
    raw_.shrink_to_fit();
    delivered_ = n;
    if (delivered_ > limits_.max_bytes)
      throw input_error(
          fmt::format("{}: more than read_limits::max_bytes ({} bytes)", in_.origin, limits_.max_bytes));
    n = cut_blanks(n);
    passed_ = n;
    p_ = buf_.data();
    end_ = p_ + n;
    if (n == 0) ended_ = true;
  }
}

byte_stream::~byte_stream() = default;

std::size_t byte_stream::read_raw(char* buf, std::size_t capacity) {
  const std::size_t n = reader_(buf, capacity);
  if (n > capacity)
    throw input_error(
        fmt::format("{}: the reader returned {} bytes for a buffer of {}", in_.origin, n, capacity));
  raw_read_ += n;
  return n;
}

bool byte_stream::refill() {
  if (ended_) return false;
  report();
  std::size_t n = 0;
  if (!gzip_) {
    n = read_raw(buf_.data(), buf_.size());
  } else {
    z_stream& z = gzip_->z;
    z.next_out = reinterpret_cast<Bytef*>(buf_.data());
    z.avail_out = static_cast<uInt>(buf_.size());
    while (z.avail_out > 0) {
      if (z.avail_in == 0) {
        raw_.resize(chunk_bytes);
        const std::size_t got = read_raw(raw_.data(), raw_.size());
        if (got == 0) {
          if (gzip_->member_ended) break;  // a clean end after the last member
          throw input_error(
              fmt::format("{}: truncated gzip stream: it ends after {} compressed bytes ({} bytes inflated); "
                          "expected the "
                          "rest of the stream",
                          in_.origin, raw_read_, delivered_ + (buf_.size() - z.avail_out)));
        }
        z.next_in = reinterpret_cast<Bytef*>(raw_.data());
        z.avail_in = static_cast<uInt>(got);
      }
      if (gzip_->member_ended) {
        // More bytes after a member: another member, or something that is not gzip.
        if (z.avail_in >= 1 && static_cast<unsigned char>(*z.next_in) != gzip_magic[0])
          throw input_error(
              fmt::format("{}: {} bytes after the end of the gzip stream at compressed byte {}: "
                          "expected another gzip member or the end of the file",
                          in_.origin, z.avail_in, raw_read_ - z.avail_in));
        inflateReset(&z);
        gzip_->member_ended = false;
      }
      const std::uint64_t before_in = z.avail_in;
      const int rc = inflate(&z, Z_NO_FLUSH);
      if (rc == Z_STREAM_END) {
        gzip_->member_ended = true;
      } else if (rc == Z_DATA_ERROR || rc == Z_NEED_DICT) {
        throw input_error(fmt::format("{}: corrupt gzip stream near compressed byte {}: {}", in_.origin,
                                      raw_read_ - z.avail_in, z.msg != nullptr ? z.msg : "invalid data"));
      } else if (rc == Z_MEM_ERROR) {
        throw std::bad_alloc();
      } else if (rc != Z_OK && !(rc == Z_BUF_ERROR && before_in == 0)) {
        throw input_error(fmt::format("{}: gzip stream unreadable near compressed byte {} (zlib error {})",
                                      in_.origin, raw_read_ - z.avail_in, rc));
      }
    }
    n = buf_.size() - z.avail_out;
  }
  if (n == 0) {
    ended_ = true;
    cut_before_chunk_ += cuts_.empty() ? 0 : cuts_.back().second;
    cuts_.clear();
    chunk_start_ = passed_;
    p_ = end_ = buf_.data();
    return false;
  }
  delivered_ += n;
  if (delivered_ > limits_.max_bytes) {
    if (gzip_)
      throw input_error(fmt::format(
          "{}: inflates to more than read_limits::max_bytes ({} bytes): too big to read (or a gzip bomb)",
          in_.origin, limits_.max_bytes));
    throw input_error(
        fmt::format("{}: more than read_limits::max_bytes ({} bytes): the file grew while it was read",
                    in_.origin, limits_.max_bytes));
  }
  n = cut_blanks(n);
  passed_ += n;
  p_ = buf_.data();
  end_ = p_ + n;
  // A chunk of blanks only, all cut but their first max_blank_run, still gives the parser bytes.
  return n != 0 || refill();
}

std::size_t byte_stream::cut_blanks(std::size_t n) {
  cut_before_chunk_ += cuts_.empty() ? 0 : cuts_.back().second;
  cuts_.clear();
  chunk_start_ = passed_;
  char* b = buf_.data();
  std::size_t w = 0;
  std::uint64_t cut = 0;
  for (std::size_t r = 0; r < n; ++r) {
    const char c = b[r];
    if (in_string_) {
      if (escaped_)
        escaped_ = false;
      else if (c == '\\')
        escaped_ = true;
      else if (c == '"')
        in_string_ = false;
    } else if (c == ' ' || c == '\n' || c == '\t' || c == '\r') {
      if (++blank_run_ > max_blank_run) {
        ++cut;
        if (!cuts_.empty() && cuts_.back().first == chunk_start_ + w)
          cuts_.back().second = cut;
        else
          cuts_.emplace_back(chunk_start_ + w, cut);
        continue;
      }
    } else {
      blank_run_ = 0;
      in_string_ = c == '"';
    }
    b[w++] = c;
  }
  return w;
}

std::uint64_t byte_stream::input_offset(std::uint64_t at) const {
  std::uint64_t cut = cut_before_chunk_;
  if (at >= chunk_start_) {
    // The last cut at or before `at` (the bytes cut at `at` lie before the byte there).
    const auto it = std::upper_bound(cuts_.begin(), cuts_.end(), at,
                                     [](std::uint64_t a, const auto& c) { return a < c.first; });
    if (it != cuts_.begin()) cut += std::prev(it)->second;
  }
  return at + cut;
}

void byte_stream::report() {
  if (!progress_) return;
  const auto now = std::chrono::steady_clock::now();
  if (now - start_ < std::chrono::seconds(2) || (reported_ && now - last_report_ < std::chrono::seconds(1)))
    return;
  reported_ = true;
  last_report_ = now;
  std::string read = format_bytes(raw_read_);
  if (in_.size != 0)
    read += fmt::format(" of {} ({:.0f}%)", format_bytes(in_.size),
                        100.0 * static_cast<double>(raw_read_) / static_cast<double>(in_.size));
  if (gzip_) read += fmt::format(", {} inflated", format_bytes(delivered_));
  progress_(fmt::format("reading {}: {}, {} events", in_.origin, read, events_));
}

}  // namespace ferry::trace::detail
