// unique_handle: the one RAII owner of a C handle in ferry (streams, events, buffers, file descriptors,
// dlopen'ed libraries, CUPTI subscriptions, NCCL communicators), in the spirit of DALI's UniqueHandle.
//
// A traits type names the handle and how to close it:
//
//   struct fd_traits {
//     using handle_type = int;
//     static constexpr int null() noexcept { return -1; }
//     static bool is_null(int fd) noexcept { return fd < 0; }
//     static void close(int fd) noexcept { ::close(fd); }
//   };
//   using unique_fd = unique_handle<fd_traits>;
//
// handle_type may be a small struct carrying what closing needs (the device a buffer came from, its
// size): everything in it moves with the handle, and a moved-from owner holds null(). close() must not
// throw and must tolerate the library behind the handle already shutting down.
#pragma once

#include <utility>

namespace ferry {

template <typename Traits>
class unique_handle {
 public:
  using handle_type = typename Traits::handle_type;

  constexpr unique_handle() noexcept = default;
  /// Takes ownership of `h` (which may be null()).
  constexpr explicit unique_handle(handle_type h) noexcept : h_(std::move(h)) {}
  unique_handle(unique_handle&& other) noexcept : h_(std::exchange(other.h_, Traits::null())) {}
  unique_handle& operator=(unique_handle&& other) noexcept {
    if (this != &other) reset(std::exchange(other.h_, Traits::null()));
    return *this;
  }
  unique_handle(const unique_handle&) = delete;
  unique_handle& operator=(const unique_handle&) = delete;
  ~unique_handle() { reset(); }

  /// Closes the handle held (if any) and takes ownership of `h`.
  void reset(handle_type h = Traits::null()) noexcept {
    handle_type old = std::exchange(h_, std::move(h));
    if (!Traits::is_null(old)) Traits::close(old);
  }
  /// Gives up ownership without closing; the owner becomes empty.
  [[nodiscard]] handle_type release() noexcept { return std::exchange(h_, Traits::null()); }

  [[nodiscard]] const handle_type& get() const noexcept { return h_; }
  /// Mutable access, for bookkeeping fields of a struct handle (never to replace the handle itself:
  /// use reset for that).
  [[nodiscard]] handle_type& get() noexcept { return h_; }
  [[nodiscard]] bool empty() const noexcept { return Traits::is_null(h_); }
  explicit operator bool() const noexcept { return !empty(); }

 private:
  handle_type h_ = Traits::null();
};

}  // namespace ferry
