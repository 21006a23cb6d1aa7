#pragma once
/// \file
/// eredu::io::FileSystemInfo: which file system holds a file, and whether io_uring's read
/// results can be trusted on it.
///
/// Measured here (docs/reliability.md): on a FUSE mount in direct_io mode, an io_uring read
/// whose failing range is not in the first FUSE request of the SQE completes with its full
/// length and wrong bytes (the kernel retries and copies the file from the request's
/// start), where pread reports a short read and then EIO. Network and userspace file
/// systems (FUSE and virtiofs, which shares FUSE's magic; NFS; SMB; 9p; ceph; ...) and file
/// systems eredu does not know are therefore read with pread; local ones (ext4, xfs,
/// btrfs, tmpfs, overlayfs, ...) with io_uring.

#include <cstdint>
#include <string>
#include <string_view>

namespace eredu::io {

/// A file system, as statfs(2) names it.
struct FileSystemInfo {
  std::uint64_t magic = 0;     ///< statfs f_type
  std::string_view name{};     ///< "ext4", "fuse", "nfs", ..., or "unknown"
  bool local = false;          ///< a local (block-device or memory) file system eredu knows
  bool uring_trusted = false;  ///< io_uring's read results can be trusted there (local ones)

  /// "fuse (magic 0x65735546)".
  std::string describe() const;
};

/// The file system of a statfs magic number (f_type). Unknown magics are neither local nor
/// trusted.
FileSystemInfo file_system_from_magic(std::uint64_t magic) noexcept;

/// The file system holding the open descriptor `fd` (fstatfs). Throws eredu::Error(io_error)
/// naming `path` when fstatfs fails.
FileSystemInfo file_system_of(int fd, const std::string& path);

}  // namespace eredu::io
