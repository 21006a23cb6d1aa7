#pragma once
/// \file
/// eredu::io::UniqueFd: an owned POSIX file descriptor.

#include <unistd.h>

#include <utility>

namespace eredu::io {

/// Move-only owner of a file descriptor; closes it on destruction (errors from close are
/// ignored there, as nothing useful can be done with them after a read-only use).
class UniqueFd {
 public:
  UniqueFd() noexcept = default;
  /// Takes ownership of `fd` (-1 for none).
  explicit UniqueFd(int fd) noexcept : fd_(fd) {}
  UniqueFd(std::nullptr_t) = delete;
  UniqueFd(UniqueFd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  UniqueFd& operator=(UniqueFd&& o) noexcept {
    if (this != &o) reset(std::exchange(o.fd_, -1));
    return *this;
  }
  ~UniqueFd() { reset(); }

  /// The descriptor, or -1.
  int get() const noexcept { return fd_; }
  /// True when a descriptor is held.
  explicit operator bool() const noexcept { return fd_ >= 0; }
  /// Gives up ownership without closing.
  int release() noexcept { return std::exchange(fd_, -1); }
  /// Closes the held descriptor and takes `fd`.
  void reset(int fd = -1) noexcept {
    if (fd_ >= 0) ::close(fd_);
    fd_ = fd;
  }

 private:
  int fd_ = -1;
};

}  // namespace eredu::io
