#pragma once
/// \file
/// eredu::io::OpenFile: one checkpoint file opened for reading, buffered and direct.

#include <cstdint>
#include <string>

#include "eredu/io/file_system.hpp"
#include "eredu/io/unique_fd.hpp"

namespace eredu::io {

/// A checkpoint file's descriptors. `direct` is an O_DIRECT descriptor of the same file,
/// or empty where the file system refuses O_DIRECT or direct reads are off.
struct OpenFile {
  std::string path{};            ///< path as opened, for messages
  UniqueFd buffered{};           ///< O_RDONLY descriptor
  UniqueFd direct{};             ///< O_RDONLY | O_DIRECT descriptor, or empty
  std::uint64_t size = 0;        ///< size when opened
  std::int64_t modified_ns = 0;  ///< st_mtim when opened, in ns (a later change fails reads: file_changed)
  FileSystemInfo file_system{};  ///< the file system holding it
  bool read_with_pread = false;  ///< the source's reader policy sent it to the pread reader
};

}  // namespace eredu::io
