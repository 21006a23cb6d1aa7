#pragma once
/// \file
/// eredu::io::OpenFile: one checkpoint file opened for reading, buffered and direct.

#include <cstdint>
#include <string>

#include "eredu/io/unique_fd.hpp"

namespace eredu::io {

/// A checkpoint file's descriptors. `direct` is an O_DIRECT descriptor of the same file,
/// or empty where the file system refuses O_DIRECT or direct reads are off.
struct OpenFile {
  std::string path{};      ///< path as opened, for messages
  UniqueFd buffered{};     ///< O_RDONLY descriptor
  UniqueFd direct{};       ///< O_RDONLY | O_DIRECT descriptor, or empty
  std::uint64_t size = 0;  ///< size when opened
};

}  // namespace eredu::io
