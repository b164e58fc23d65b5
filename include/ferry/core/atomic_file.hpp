// Files that appear under their final name only when complete: written to a hidden temporary in the same
// directory, flushed to disk, then renamed over the final name. A reader (or a user after Ctrl-C or a full
// disk) sees either no file or the whole file, never a truncated one or one full of zeros.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>

namespace ferry {

/// A file being written under a temporary name `.<name>.XXXXXX` next to `path`, renamed to `path` by
/// commit(). Until then `path` is untouched (an older file there stays as it was). Destroying it without
/// commit removes the temporary. While it exists its temporary name is registered so that
/// remove_unfinished_files() (from a signal handler) can remove it. Move-only; not thread-safe except
/// pwrite/truncate, which may be called from several threads at once.
class atomic_file {
 public:
  /// Creates the temporary (mode 0666 less the umask, like a plain create). Throws std::system_error
  /// naming `path` and the system's reason when the directory is missing or not writable.
  explicit atomic_file(std::filesystem::path path);
  atomic_file(atomic_file&& other) noexcept;
  atomic_file& operator=(atomic_file&& other) noexcept;
  atomic_file(const atomic_file&) = delete;
  atomic_file& operator=(const atomic_file&) = delete;
  /// Removes the temporary unless commit() succeeded. Never throws.
  ~atomic_file();

  /// Appends `bytes` at the current end. Throws std::system_error naming the final path on a write error
  /// (the disk full, RLIMIT_FSIZE, an I/O error); the temporary then stays until destruction.
  void write(std::span<const std::byte> bytes);
  void write(std::string_view text);
  /// Writes `bytes` at `offset` without moving the end used by write(). Thread-safe with other pwrites.
  void pwrite(std::span<const std::byte> bytes, std::uint64_t offset);
  /// Sets the temporary's size (a sparse extension where the file system allows it).
  void truncate(std::uint64_t bytes);
  /// Flushes the data to disk (fsync), renames the temporary to the final path and flushes the
  /// directory. Throws std::system_error naming the path on failure, and the temporary is then removed
  /// at destruction. Call once.
  void commit();

  /// The final path.
  [[nodiscard]] const std::filesystem::path& path() const noexcept { return path_; }
  /// The temporary's path (empty after commit or after being moved from).
  [[nodiscard]] const std::filesystem::path& temp_path() const noexcept { return temp_; }

 private:
  void discard() noexcept;
  std::filesystem::path path_;
  std::filesystem::path temp_;
  int fd_ = -1;
  int registry_slot_ = -1;
  std::uint64_t end_ = 0;
};

/// Writes `text` to `path` through an atomic_file: `path` holds either its old content or all of `text`.
/// Throws std::system_error naming `path` on failure, leaving no temporary behind.
void write_file_atomically(const std::filesystem::path& path, std::string_view text);

/// Checks, before any work, that a file could be created at `path`: its directory (the current one when
/// `path` has none) exists, is a directory and is writable (a temporary is created there and removed),
/// and `path` is not itself a directory. Throws ferry::logic_error naming `what` (the flag, such as
/// "--trace"), the path and the reason.
void check_output_path(const std::filesystem::path& path, std::string_view what);

/// Removes the temporaries of every atomic_file not yet committed or destroyed. Async-signal-safe: meant
/// for a SIGINT/SIGTERM handler that then ends the process, so Ctrl-C leaves no stray temporary.
void remove_unfinished_files() noexcept;

}  // namespace ferry
