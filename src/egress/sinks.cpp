// The sinks that ship with the egress pipeline: null, callback, checksum, raw file and .npy.
#include <fcntl.h>
#include <unistd.h>

#include <fmt/format.h>

#include <bit>
#include <cerrno>
#include <cstring>
#include <limits>
#include <mutex>
#include <system_error>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "ferry/core/atomic_file.hpp"
#include "ferry/core/error.hpp"
#include "ferry/core/pattern.hpp"
#include "ferry/core/units.hpp"
#include "ferry/egress/egress.hpp"

namespace ferry::egress {
namespace {

// A file error as the sink names it: "raw_file_sink: cannot write ... of <path>: <reason>".
[[noreturn]] void rethrow_as(std::string_view sink_name, const std::system_error& e) {
  std::string what = e.what();
  const std::string reason = ": " + e.code().message();
  if (what.size() >= reason.size() && what.compare(what.size() - reason.size(), reason.size(), reason) == 0)
    what.resize(what.size() - reason.size());
  throw std::system_error(e.code(), fmt::format("{}: {}", sink_name, what));
}

}  // namespace

// The outputs a file sink is writing: each under a temporary name until its last chunk is written, then
// flushed and renamed, so a file appears under its final name only complete. A chunk that fails removes
// the temporary (no correctly sized file of zeros is left) and its error reaches the caller; the other
// chunks of that output are dropped.
//
// The staged output of a tag is shared by the chunks of one output only: admit() refuses a tag given
// before, and write() refuses a chunk of another output (another sequence number or chunk count) than
// the one its tag is being written for. Two outputs sharing one staged file would race to commit it
// (the second committed a file the first had already renamed and released).
class staged_outputs {
 public:
  void admit(std::uint64_t tag, const std::filesystem::path& path, std::string_view sink_name) {
    const std::lock_guard lock(mutex_);
    FERRY_EXPECTS(admitted_.insert(tag).second,
                  fmt::format("{}: tag {} was already submitted to this sink, whose outputs are files named "
                              "by their tag ({}); give every output its own tag (the step number, say)",
                              sink_name, tag, path.string()));
  }

  void write(const std::filesystem::path& path, std::uint64_t file_bytes, std::span<const std::byte> header,
             std::uint64_t offset, const output_chunk& d, std::string_view sink_name) {
    FERRY_EXPECTS(file_bytes <= static_cast<std::uint64_t>(std::numeric_limits<::off_t>::max()),
                  fmt::format("{}: {} of {} is larger than a file can be", sink_name, path.string(),
                              format_bytes(file_bytes)));
    FERRY_EXPECTS(
        d.chunks > 0 && d.chunk < d.chunks,
        fmt::format("{}: chunk {} of {} of tag {}: no such chunk", sink_name, d.chunk, d.chunks, d.tag));
    const std::shared_ptr<output> o = output_of(d);
    FERRY_EXPECTS(
        o->sequence == d.sequence && o->chunks == d.chunks,
        fmt::format("{}: tag {} is being written for output {} ({} chunks) and now comes with output "
                    "{} ({} chunks): every output needs its own tag, as {} names its file",
                    sink_name, d.tag, o->sequence, o->chunks, d.sequence, d.chunks, path.string()));
    std::shared_ptr<atomic_file> file;
    try {
      {
        const std::lock_guard lock(o->mutex);
        if (o->failed) return;  // an earlier chunk's error already went to the caller
        // Each chunk once: the last of `chunks` writes commits, and a file is committed only once.
        FERRY_EXPECTS(o->started < o->chunks,
                      fmt::format("{}: output {} (tag {}) got more than its {} chunks: chunk {} came again",
                                  sink_name, d.sequence, d.tag, d.chunks, d.chunk));
        ++o->started;
        if (!o->file) {
          o->file = std::make_shared<atomic_file>(path);
          o->file->truncate(file_bytes);
        }
        file = o->file;
      }
      if (!header.empty()) file->pwrite(header, 0);
      file->pwrite(d.bytes, offset);
      const std::lock_guard lock(o->mutex);
      if (o->failed || ++o->written < d.chunks) return;
      o->file->commit();
      o->file.reset();
    } catch (const std::system_error& e) {
      fail(*o);
      rethrow_as(sink_name, e);
    } catch (...) {
      fail(*o);
      throw;
    }
    forget(d.tag);
  }

 private:
  struct output {
    output(std::uint64_t seq, std::uint32_t n) : sequence(seq), chunks(n) {}
    const std::uint64_t sequence;  // the output being written under the tag
    const std::uint32_t chunks;    // its chunks
    std::mutex mutex;
    std::shared_ptr<atomic_file> file;  // guarded by mutex; the temporary goes with its last owner
    std::uint32_t started = 0;          // chunks taken to be written; guarded by mutex
    std::uint32_t written = 0;          // chunks written; guarded by mutex
    bool failed = false;                // guarded by mutex
  };

  std::shared_ptr<output> output_of(const output_chunk& d) {
    const std::lock_guard lock(mutex_);
    auto& o = outputs_[d.tag];
    if (!o) o = std::make_shared<output>(d.sequence, d.chunks);
    return o;
  }
  void forget(std::uint64_t tag) {
    const std::lock_guard lock(mutex_);
    outputs_.erase(tag);
  }
  static void fail(output& o) noexcept {
    const std::lock_guard lock(o.mutex);
    o.failed = true;
    o.file.reset();
  }

  std::mutex mutex_;
  std::unordered_map<std::uint64_t, std::shared_ptr<output>> outputs_;  // guarded by mutex_
  std::unordered_set<std::uint64_t> admitted_;                          // guarded by mutex_
};

namespace {

std::span<const std::byte> as_bytes(const std::string& s) noexcept {
  return std::as_bytes(std::span<const char>(s.data(), s.size()));
}

// Bytes per item of a .npy dtype descriptor such as "<f4"; 0 when ferry does not know it.
std::size_t item_bytes_of(std::string_view dtype) noexcept {
  if (dtype.size() < 3) return 0;
  const char order = dtype[0];
  if (order != '<' && order != '>' && order != '|') return 0;
  const char kind = dtype[1];
  const std::string_view size = dtype.substr(2);
  std::size_t n = 0;
  for (const char c : size) {
    if (c < '0' || c > '9' || n > 16) return 0;
    n = n * 10 + static_cast<std::size_t>(c - '0');
  }
  switch (kind) {
    case 'b': return n == 1 ? n : 0;
    case 'i':
    case 'u': return n == 1 || n == 2 || n == 4 || n == 8 ? n : 0;
    case 'f': return n == 2 || n == 4 || n == 8 ? n : 0;
    case 'c': return n == 8 || n == 16 ? n : 0;
    default: return 0;
  }
}

// The Python tuple numpy writes for a shape: "()", "(5,)", "(64, 21, 512, 512)".
std::string shape_tuple(const std::vector<std::size_t>& shape) {
  if (shape.empty()) return "()";
  if (shape.size() == 1) return fmt::format("({},)", shape[0]);
  std::string out = "(";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) out += ", ";
    out += std::to_string(shape[i]);
  }
  return out + ")";
}

}  // namespace

// ---- callback_sink -----------------------------------------------------------------------------

callback_sink::callback_sink(std::function<void(const output_chunk&)> fn) : fn_(std::move(fn)) {
  FERRY_EXPECTS(static_cast<bool>(fn_),
                "callback_sink of an empty function: pass what consumes each delivery");
}

void callback_sink::consume(const output_chunk& d) { fn_(d); }

// ---- checksum ----------------------------------------------------------------------------------

std::uint64_t checksum_of(std::span<const std::byte> bytes) noexcept { return checksum64(bytes, 0); }

struct checksum_sink::state {
  struct output {
    std::uint64_t total_bytes = 0;
    std::uint32_t chunks = 0;
    std::uint32_t seen = 0;
    std::uint64_t sum = 0;
  };
  mutable std::mutex mutex;
  std::unordered_map<std::uint64_t, output> outputs;  // by tag; guarded by mutex
  std::unordered_set<std::uint64_t> admitted;         // tags submitted; guarded by mutex
  std::uint64_t completed = 0;                        // guarded by mutex
};

std::shared_ptr<checksum_sink::state> checksum_sink::make_state() { return std::make_shared<state>(); }

void checksum_sink::consume(const output_chunk& d) {
  FERRY_EXPECTS(d.offset % 8 == 0,
                fmt::format("checksum_sink: chunk {} of tag {} starts at offset {}, which is not "
                            "a multiple of 8 (the checksum's word)",
                            d.chunk, d.tag, d.offset));
  FERRY_EXPECTS(
      d.chunks > 0 && d.chunk < d.chunks && d.offset + d.bytes.size() <= d.total_bytes,
      fmt::format("checksum_sink: chunk {} of {} of tag {} ({} bytes at offset {}) does not fit its "
                  "output of {} bytes",
                  d.chunk, d.chunks, d.tag, d.bytes.size(), d.offset, d.total_bytes));
  const std::uint64_t terms = checksum64(d.bytes, d.offset / 8);
  const std::lock_guard lock(state_->mutex);
  auto [it, inserted] = state_->outputs.try_emplace(d.tag);
  state::output& o = it->second;
  if (inserted) {
    o.total_bytes = d.total_bytes;
    o.chunks = d.chunks;
  }
  FERRY_EXPECTS(
      o.total_bytes == d.total_bytes && o.chunks == d.chunks && o.seen < o.chunks,
      fmt::format("checksum_sink: tag {} seen as an output of {} bytes in {} chunks ({} delivered) and "
                  "now as {} bytes in {} chunks: tags must be unique and each chunk delivered once",
                  d.tag, o.total_bytes, o.chunks, o.seen, d.total_bytes, d.chunks));
  o.sum += terms;
  if (++o.seen == o.chunks) ++state_->completed;
}

void checksum_sink::admit(std::uint64_t tag, std::uint64_t) {
  const std::lock_guard lock(state_->mutex);
  FERRY_EXPECTS(state_->admitted.insert(tag).second,
                fmt::format("checksum_sink: tag {} was already submitted to this sink, which keeps one "
                            "checksum per tag; give every output its own tag (the step number, say)",
                            tag));
}

std::uint64_t checksum_sink::checksum(std::uint64_t tag) const {
  const std::lock_guard lock(state_->mutex);
  const auto it = state_->outputs.find(tag);
  FERRY_EXPECTS(it != state_->outputs.end(),
                fmt::format("checksum_sink: no output with tag {} was delivered", tag));
  const state::output& o = it->second;
  FERRY_EXPECTS(o.seen == o.chunks,
                fmt::format("checksum_sink: output with tag {} is incomplete: {} of {} chunks "
                            "delivered",
                            tag, o.seen, o.chunks));
  return o.sum;
}

std::uint64_t checksum_sink::completed() const {
  const std::lock_guard lock(state_->mutex);
  return state_->completed;
}

// ---- raw_file_sink -----------------------------------------------------------------------------

raw_file_sink::raw_file_sink(std::filesystem::path dir, std::string prefix)
    : dir_(std::move(dir)), prefix_(std::move(prefix)), staged_(std::make_shared<staged_outputs>()) {}

std::filesystem::path raw_file_sink::path_of(std::uint64_t tag) const {
  return dir_ / fmt::format("{}{}.bin", prefix_, tag);
}

void raw_file_sink::admit(std::uint64_t tag, std::uint64_t) {
  staged_->admit(tag, path_of(tag), "raw_file_sink");
}

void raw_file_sink::consume(const output_chunk& d) {
  staged_->write(path_of(d.tag), d.total_bytes, {}, d.offset, d, "raw_file_sink");
}

// ---- npy_sink ----------------------------------------------------------------------------------

npy_sink::npy_sink(std::filesystem::path dir, std::vector<std::size_t> shape, std::string dtype,
                   std::string prefix)
    : dir_(std::move(dir)),
      shape_(std::move(shape)),
      dtype_(std::move(dtype)),
      prefix_(std::move(prefix)),
      staged_(std::make_shared<staged_outputs>()) {
  item_bytes_ = item_bytes_of(dtype_);
  FERRY_EXPECTS(item_bytes_ > 0,
                fmt::format("npy_sink: unknown dtype \"{}\": expected a byte order '<', '>' or "
                            "'|' then b1, i1/i2/i4/i8, u1/u2/u4/u8, f2/f4/f8 or c8/c16 "
                            "(e.g. \"<f4\")",
                            dtype_));
  data_bytes_ = item_bytes_;
  for (const std::size_t n : shape_) {
    FERRY_EXPECTS(
        n == 0 || data_bytes_ <= std::numeric_limits<std::uint64_t>::max() / n,
        fmt::format("npy_sink: shape {} of {} overflows 64 bits of bytes", shape_tuple(shape_), dtype_));
    data_bytes_ *= n;
  }
  // Format 1.0: magic, version, a little-endian uint16 length, then the dictionary padded with spaces
  // and ended by a newline so that the data starts on a multiple of 64 bytes.
  const std::string dict =
      fmt::format("{{'descr': '{}', 'fortran_order': False, 'shape': {}, }}", dtype_, shape_tuple(shape_));
  constexpr std::size_t preamble = 10;  // magic (6) + version (2) + length (2)
  const std::size_t unpadded = preamble + dict.size() + 1;
  const std::size_t total = (unpadded + 63) / 64 * 64;
  const std::size_t length = total - preamble;
  FERRY_EXPECTS(length <= 0xFFFF,
                fmt::format("npy_sink: the header of shape {} is {} bytes, more than format 1.0 "
                            "holds (65535)",
                            shape_tuple(shape_), length));
  header_.reserve(total);
  header_.append("\x93NUMPY\x01\x00", 8);
  header_.push_back(static_cast<char>(length & 0xFF));
  header_.push_back(static_cast<char>(length >> 8));
  header_ += dict;
  header_.append(total - unpadded, ' ');
  header_.push_back('\n');
}

std::filesystem::path npy_sink::path_of(std::uint64_t tag) const {
  return dir_ / fmt::format("{}{}.npy", prefix_, tag);
}

void npy_sink::expect_size(std::uint64_t tag, std::uint64_t total_bytes) const {
  FERRY_EXPECTS(total_bytes == data_bytes_,
                fmt::format("npy_sink: output with tag {} is {} bytes, but shape {} of {} needs {} bytes",
                            tag, total_bytes, shape_tuple(shape_), dtype_, data_bytes_));
}

void npy_sink::admit(std::uint64_t tag, std::uint64_t total_bytes) {
  // The size first: an output refused for its size does not take its tag.
  expect_size(tag, total_bytes);
  staged_->admit(tag, path_of(tag), "npy_sink");
}

void npy_sink::consume(const output_chunk& d) {
  expect_size(d.tag, d.total_bytes);
  const std::span<const std::byte> header = d.offset == 0 ? as_bytes(header_) : std::span<const std::byte>{};
  staged_->write(path_of(d.tag), header_.size() + d.total_bytes, header, header_.size() + d.offset, d,
                 "npy_sink");
}

}  // namespace ferry::egress
