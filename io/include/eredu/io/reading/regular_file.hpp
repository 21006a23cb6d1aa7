#pragma once
/// \file
/// eredu::io::open_regular_file: opens a path for reading without ever blocking in open(2),
/// and only if it is a regular file.
///
/// open(2) of a FIFO blocks until a writer appears, and a device or socket is no
/// checkpoint either, so every path eredu reads (checkpoint, index, shard, sidecar) is
/// opened O_NONBLOCK, checked with fstat, and refused unless it is a regular file.
/// Symbolic links are followed (the Hugging Face cache links each snapshot file to a blob);
/// `confine_to` refuses files whose real location is outside a directory.

#include <sys/stat.h>

#include <filesystem>
#include <string>
#include <string_view>
#include <system_error>

#include "eredu/io/reading/unique_fd.hpp"

namespace eredu::io {

/// What open_regular_file() opened, or why it did not.
struct RegularFile {
  UniqueFd fd{};                   ///< read-only descriptor (blocking mode restored), or empty
  struct ::stat status {};         ///< fstat of `fd`
  std::error_code error{};         ///< the errno of a failed open or fstat
  std::string_view not_regular{};  ///< set when the path is no regular file: "a FIFO", "a directory", ...
  /// True when `fd` holds the regular file.
  explicit operator bool() const noexcept { return static_cast<bool>(fd); }
};

/// Opens `path` with O_RDONLY | O_CLOEXEC | O_NONBLOCK | `flags`, fstats it, and keeps it only
/// when it is a regular file (then clears O_NONBLOCK). Never blocks on a FIFO or device;
/// never throws.
RegularFile open_regular_file(const std::string& path, int flags = 0) noexcept;

/// Where the open descriptor `fd` really is (symbolic links resolved), through
/// /proc/self/fd, or canonical(`path`) where /proc is not mounted. Empty on failure.
std::filesystem::path real_path_of(int fd, const std::string& path) noexcept;

/// Whether `real` (a path with no symbolic links) lies inside `root` (also resolved).
bool is_inside(const std::filesystem::path& real, const std::filesystem::path& root) noexcept;

}  // namespace eredu::io
