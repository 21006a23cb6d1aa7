#pragma once
/// \file
/// eredu::io::FileStamp: what a file's status says of its bytes besides its size, so that a
/// file rewritten in place can be told from one that was not.
///
/// The modification time alone cannot tell: `cp -p` or `rsync --inplace -t` rewrite a file
/// at the same size and put its old modification time back, and loads that ran meanwhile
/// got a mix of both versions. The status-change time (ctime) moves on every write and on
/// every utimensat, and no user can set it back, so it is compared too. A ctime that moved
/// together with the link count is no rewrite: renaming another file over this one (the
/// documented way to replace a checkpoint), unlinking or linking it moves both and leaves
/// the bytes. A change of mode or owner also moves ctime alone, and counts as a change:
/// nothing in the status tells it from a rewrite.

#include <cstdint>
#include <string_view>

struct stat;

namespace eredu::io {

/// The modification and status-change times and link count of a file (see file comment).
struct FileStamp {
  std::int64_t modified_ns = 0;  ///< st_mtim in nanoseconds
  std::int64_t changed_ns = 0;   ///< st_ctim in nanoseconds
  std::uint64_t links = 0;       ///< st_nlink

  /// The stamp of a file whose fstat (or stat) is `st`.
  static FileStamp of(const struct ::stat& st) noexcept;
  /// False for a default stamp, which records nothing (a catalog built by hand).
  bool known() const noexcept { return modified_ns != 0 || changed_ns != 0; }
  /// Why the file, stamped `now`, may hold other bytes than when this stamp was taken, as a
  /// phrase for a message ("its modification time changed"), or empty when nothing says so.
  std::string_view rewritten(const FileStamp& now) const noexcept;
  /// Same times, same link count.
  bool operator==(const FileStamp&) const = default;
};

}  // namespace eredu::io
