#pragma once
/// \file
/// TensorInfo and CheckpointFile: what the catalog knows of one tensor and one file.

#include <cstdint>
#include <map>
#include <string>

#include "eredu/core/dtype.hpp"
#include "eredu/core/shape.hpp"
#include "eredu/io/integrity/file_stamp.hpp"

namespace eredu::io {

/// Metadata of a checkpoint (safetensors `__metadata__`, or the index's `metadata`).
using Metadata = std::map<std::string, std::string>;

/// One file of a checkpoint (a single file, or one shard).
struct CheckpointFile {
  std::string path{};             ///< path as opened (used in every message)
  std::string format{};           ///< "safetensors", ...
  std::uint64_t size = 0;         ///< file size in bytes when the header was parsed
  std::uint64_t data_offset = 0;  ///< absolute offset of the data region
  Metadata metadata{};            ///< the file's own metadata
  std::uint64_t device = 0;       ///< st_dev when the header was parsed (to spot a replaced file)
  std::uint64_t inode = 0;        ///< st_ino when the header was parsed
  FileStamp stamp{};              ///< times and links when the header was parsed (to spot a rewrite)
};

/// Where one tensor's bytes are and how to interpret them.
struct TensorInfo {
  std::string name{};        ///< checkpoint key
  DType dtype{};             ///< element type
  Shape shape{};             ///< row-major dimensions
  std::uint32_t file = 0;    ///< index into Catalog::files()
  std::uint64_t offset = 0;  ///< absolute byte offset of the first byte in the file
  std::uint64_t nbytes = 0;  ///< stored byte length
};

}  // namespace eredu::io
