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
#include <utility>

#include "ferry/core/error.hpp"
#include "ferry/core/pattern.hpp"
#include "ferry/core/unique_handle.hpp"
#include "ferry/core/units.hpp"
#include "ferry/egress/egress.hpp"

namespace ferry::egress {
namespace {

// A file descriptor, closed when it goes out of scope (the error path); write_chunk closes it itself on
// success, since a failed close is, on some file systems, where a failed write shows up.
struct fd_traits {
  using handle_type = int;
  static constexpr int null() noexcept { return -1; }
  static bool is_null(int fd) noexcept { return fd < 0; }
  static void close(int fd) noexcept { static_cast<void>(::close(fd)); }
};
using unique_fd = unique_handle<fd_traits>;

[[noreturn]] void throw_file_error(int err, std::string_view sink_name, std::string_view what,
                                   const std::filesystem::path& path) {
  throw std::system_error(err, std::generic_category(),
                          fmt::format("{}: cannot {} {}", sink_name, what, path.string()));
}

void write_all(int fd, std::span<const std::byte> bytes, std::uint64_t offset, std::string_view sink_name,
               const std::filesystem::path& path) {
  while (!bytes.empty()) {
    const ::ssize_t n = ::pwrite(fd, bytes.data(), bytes.size(), static_cast<::off_t>(offset));
    if (n < 0) {
      if (errno == EINTR) continue;
      throw_file_error(errno, sink_name,
                       fmt::format("write {} at offset {} of", format_bytes(bytes.size()), offset), path);
    }
    bytes = bytes.subspan(static_cast<std::size_t>(n));
    offset += static_cast<std::uint64_t>(n);
  }
}

// Writes one chunk into `path`: creates the file if needed, sizes it to `file_bytes` (every chunk of the
// output sets the same size, so they may arrive in any order, on any thread) and writes `header` at 0
// (when given) and `bytes` at `offset`.
void write_chunk(const std::filesystem::path& path, std::uint64_t file_bytes,
                 std::span<const std::byte> header, std::uint64_t offset, std::span<const std::byte> bytes,
                 std::string_view sink_name) {
  FERRY_EXPECTS(file_bytes <= static_cast<std::uint64_t>(std::numeric_limits<::off_t>::max()),
                fmt::format("{}: {} of {} is larger than a file can be", sink_name, path.string(),
                            format_bytes(file_bytes)));
  unique_fd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0666));
  if (fd.empty()) throw_file_error(errno, sink_name, "open for writing", path);
  while (::ftruncate(fd.get(), static_cast<::off_t>(file_bytes)) != 0) {
    if (errno != EINTR)
      throw_file_error(errno, sink_name, fmt::format("size to {}", format_bytes(file_bytes)), path);
  }
  if (!header.empty()) write_all(fd.get(), header, 0, sink_name, path);
  write_all(fd.get(), bytes, offset, sink_name, path);
  if (::close(fd.release()) != 0) throw_file_error(errno, sink_name, "close", path);
}

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
    : dir_(std::move(dir)), prefix_(std::move(prefix)) {}

std::filesystem::path raw_file_sink::path_of(std::uint64_t tag) const {
  return dir_ / fmt::format("{}{}.bin", prefix_, tag);
}

void raw_file_sink::consume(const output_chunk& d) {
  write_chunk(path_of(d.tag), d.total_bytes, {}, d.offset, d.bytes, "raw_file_sink");
}

// ---- npy_sink ----------------------------------------------------------------------------------

npy_sink::npy_sink(std::filesystem::path dir, std::vector<std::size_t> shape, std::string dtype,
                   std::string prefix)
    : dir_(std::move(dir)), shape_(std::move(shape)), dtype_(std::move(dtype)), prefix_(std::move(prefix)) {
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

void npy_sink::consume(const output_chunk& d) {
  FERRY_EXPECTS(d.total_bytes == data_bytes_,
                fmt::format("npy_sink: output with tag {} is {} bytes, but shape {} of {} needs {} bytes",
                            d.tag, d.total_bytes, shape_tuple(shape_), dtype_, data_bytes_));
  const std::span<const std::byte> header = d.offset == 0 ? as_bytes(header_) : std::span<const std::byte>{};
  write_chunk(path_of(d.tag), header_.size() + d.total_bytes, header, header_.size() + d.offset, d.bytes,
              "npy_sink");
}

}  // namespace ferry::egress
