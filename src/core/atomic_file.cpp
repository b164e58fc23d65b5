#include "ferry/core/atomic_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <system_error>
#include <utility>
#include <vector>

#include "ferry/core/error.hpp"

namespace ferry {
namespace {

// The temporaries of live atomic_files, for remove_unfinished_files() in a signal handler: fixed slots
// (no allocation, no lock), each free (0), being filled (1) or holding a path (2).
struct registry_slot {
  std::atomic<int> state{0};
  std::array<char, PATH_MAX> path{};
};
constexpr int registry_slots = 64;
std::array<registry_slot, registry_slots> registry;

int register_temp(const std::filesystem::path& temp) noexcept {
  const std::string& s = temp.native();
  if (s.size() + 1 > PATH_MAX) return -1;
  for (int i = 0; i < registry_slots; ++i) {
    int expected = 0;
    if (!registry[i].state.compare_exchange_strong(expected, 1)) continue;
    std::memcpy(registry[i].path.data(), s.c_str(), s.size() + 1);
    registry[i].state.store(2);
    return i;
  }
  return -1;  // more live files than slots: that one is not removed on a signal, and nothing else breaks
}

void unregister_temp(int slot) noexcept {
  if (slot >= 0) registry[slot].state.store(0);
}

// The process's umask, read without changing it (umask(2) would, for a moment, for every thread).
mode_t current_umask() noexcept {
  mode_t mask = 022;
  if (std::FILE* f = std::fopen("/proc/self/status", "re")) {
    char line[128];
    while (std::fgets(line, sizeof line, f) != nullptr) {
      unsigned int m = 0;
      if (std::sscanf(line, "Umask: %o", &m) == 1) {
        mask = static_cast<mode_t>(m);
        break;
      }
    }
    std::fclose(f);
  }
  return mask;
}

[[noreturn]] void throw_errno(int err, std::string_view what, const std::filesystem::path& path) {
  throw std::system_error(err, std::generic_category(), fmt::format("cannot {} {}", what, path.string()));
}

std::filesystem::path directory_of(const std::filesystem::path& path) {
  return path.has_parent_path() ? path.parent_path() : std::filesystem::path(".");
}

// `.name.XXXXXX` next to `path`, with the name cut so that the whole stays within NAME_MAX.
std::string temp_template(const std::filesystem::path& path) {
  std::string name = path.filename().string();
  if (name.size() > 200) name.resize(200);
  return (directory_of(path) / ("." + name + ".XXXXXX")).string();
}

void fsync_directory(const std::filesystem::path& dir) noexcept {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  static_cast<void>(::fsync(fd));  // the rename is done; a directory that cannot be synced keeps it anyway
  ::close(fd);
}

}  // namespace

atomic_file::atomic_file(std::filesystem::path path) : path_(std::move(path)) {
  FERRY_EXPECTS(!path_.empty() && path_.has_filename(),
                fmt::format("cannot write \"{}\": it names no file", path_.string()));
  std::string tmpl = temp_template(path_);
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  fd_ = ::mkostemp(buf.data(), O_CLOEXEC);
  if (fd_ < 0) throw_errno(errno, "create a file in the directory of", path_);
  temp_ = std::filesystem::path(buf.data());
  registry_slot_ = register_temp(temp_);
  if (::fchmod(fd_, 0666 & ~current_umask()) != 0) {
    const int err = errno;
    discard();
    throw_errno(err, "set the permissions of", path_);
  }
}

atomic_file::atomic_file(atomic_file&& other) noexcept
    : path_(std::move(other.path_)),
      temp_(std::exchange(other.temp_, {})),
      fd_(std::exchange(other.fd_, -1)),
      registry_slot_(std::exchange(other.registry_slot_, -1)),
      end_(other.end_) {}

atomic_file& atomic_file::operator=(atomic_file&& other) noexcept {
  if (this != &other) {
    discard();
    path_ = std::move(other.path_);
    temp_ = std::exchange(other.temp_, {});
    fd_ = std::exchange(other.fd_, -1);
    registry_slot_ = std::exchange(other.registry_slot_, -1);
    end_ = other.end_;
  }
  return *this;
}

atomic_file::~atomic_file() { discard(); }

void atomic_file::discard() noexcept {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  if (!temp_.empty()) static_cast<void>(::unlink(temp_.c_str()));
  temp_.clear();
  unregister_temp(registry_slot_);
  registry_slot_ = -1;
}

void atomic_file::pwrite(std::span<const std::byte> bytes, std::uint64_t offset) {
  FERRY_EXPECTS(fd_ >= 0, fmt::format("write to {} after commit or move", path_.string()));
  while (!bytes.empty()) {
    const ::ssize_t n = ::pwrite(fd_, bytes.data(), bytes.size(), static_cast<::off_t>(offset));
    if (n < 0) {
      if (errno == EINTR) continue;
      throw_errno(errno, fmt::format("write {} bytes at offset {} of", bytes.size(), offset), path_);
    }
    if (n == 0) throw_errno(EIO, "write", path_);
    bytes = bytes.subspan(static_cast<std::size_t>(n));
    offset += static_cast<std::uint64_t>(n);
  }
}

void atomic_file::write(std::span<const std::byte> bytes) {
  pwrite(bytes, end_);
  end_ += bytes.size();
}

void atomic_file::write(std::string_view text) {
  write(std::as_bytes(std::span<const char>(text.data(), text.size())));
}

void atomic_file::truncate(std::uint64_t bytes) {
  FERRY_EXPECTS(fd_ >= 0, fmt::format("resize {} after commit or move", path_.string()));
  while (::ftruncate(fd_, static_cast<::off_t>(bytes)) != 0) {
    if (errno != EINTR) throw_errno(errno, fmt::format("size to {} bytes", bytes), path_);
  }
}

void atomic_file::commit() {
  FERRY_EXPECTS(fd_ >= 0, fmt::format("commit of {} twice, or after a move", path_.string()));
  if (::fsync(fd_) != 0) throw_errno(errno, "flush", path_);
  const int fd = std::exchange(fd_, -1);
  // A failed close is where some file systems (NFS) report a failed write.
  if (::close(fd) != 0) throw_errno(errno, "close", path_);
  if (::rename(temp_.c_str(), path_.c_str()) != 0) throw_errno(errno, "rename the finished file to", path_);
  temp_.clear();
  unregister_temp(registry_slot_);
  registry_slot_ = -1;
  fsync_directory(directory_of(path_));
}

void write_file_atomically(const std::filesystem::path& path, std::string_view text) {
  atomic_file f(path);
  f.write(text);
  f.commit();
}

void check_output_path(const std::filesystem::path& path, std::string_view what) {
  auto fail = [&](std::string_view why) {
    throw logic_error(fmt::format("{} {}: {}", what, path.string(), why));
  };
  if (path.empty()) fail("the path is empty");
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) fail("is a directory; give a file name");
  const std::filesystem::path dir = directory_of(path);
  const auto status = std::filesystem::status(dir, ec);
  if (!std::filesystem::exists(status)) fail(fmt::format("directory {} does not exist", dir.string()));
  if (!std::filesystem::is_directory(status)) fail(fmt::format("{} is not a directory", dir.string()));
  std::string tmpl = temp_template(path);
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  const int fd = ::mkostemp(buf.data(), O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    fail(fmt::format("cannot create a file in {}: {}", dir.string(), std::generic_category().message(err)));
  }
  ::close(fd);
  static_cast<void>(::unlink(buf.data()));
}

void remove_unfinished_files() noexcept {
  for (auto& slot : registry) {
    if (slot.state.load() == 2) static_cast<void>(::unlink(slot.path.data()));
  }
}

}  // namespace ferry
