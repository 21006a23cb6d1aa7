#include "eredu/io/reading/regular_file.hpp"

#include "eredu/io/integrity/file_stamp.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>

#include "posix_values.hpp"

namespace eredu::io {
namespace {

std::string_view file_type_name(mode_t mode) noexcept {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISLNK(mode)) return "a symbolic link";
  return "not a regular file";
}

}  // namespace

RegularFile open_regular_file(const std::string& path, int flags) noexcept {
  RegularFile out;
  int fd;
  do {
    fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | flags);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) {
    out.error = {errno, std::system_category()};
    return out;
  }
  UniqueFd owned(fd);
  if (::fstat(fd, &out.status) != 0) {
    out.error = {errno, std::system_category()};
    return out;
  }
  if (!S_ISREG(out.status.st_mode)) {
    out.not_regular = file_type_name(out.status.st_mode);
    return out;
  }
  // O_NONBLOCK only mattered for open(2); regular-file reads ignore it, but clear it so the
  // descriptor behaves as an ordinary one for whoever gets it.
  if (const int fl = ::fcntl(fd, F_GETFL); fl >= 0) ::fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
  out.fd = std::move(owned);
  return out;
}

std::filesystem::path real_path_of(int fd, const std::string& path) noexcept {
  std::error_code ec;
  std::filesystem::path real = std::filesystem::read_symlink("/proc/self/fd/" + std::to_string(fd), ec);
  if (!ec && real.is_absolute()) return real;
  real = std::filesystem::canonical(path, ec);
  return ec ? std::filesystem::path{} : real;
}

bool is_inside(const std::filesystem::path& real, const std::filesystem::path& root) noexcept {
  std::error_code ec;
  const std::filesystem::path base = std::filesystem::canonical(root, ec);
  if (ec || real.empty()) return false;
  auto r = real.begin();
  for (auto b = base.begin(); b != base.end(); ++b, ++r) {
    if (r == real.end() || *r != *b) return false;
  }
  return true;
}

FileStamp FileStamp::of(const struct ::stat& st) noexcept {
  return {detail::nanoseconds(st.st_mtim), detail::nanoseconds(st.st_ctim), static_cast<std::uint64_t>(st.st_nlink)};
}

std::string_view FileStamp::rewritten(const FileStamp& now) const noexcept {
  if (now.modified_ns != modified_ns) return "its modification time changed";
  if (now.changed_ns != changed_ns && now.links == links)
    return "its status-change time (ctime) moved though its modification time did not: it was written and its "
           "modification time set back (as cp -p or rsync --inplace -t do), or its mode or owner changed";
  return {};
}

}  // namespace eredu::io
