#pragma once
/// \file
/// The sharded-checkpoint index (`model.safetensors.index.json`, a transformers /
/// huggingface_hub convention):
///
/// ```
/// {"metadata": {"total_size": 4305, ...}, "weight_map": {"<tensor>": "<shard file>", ...}}
/// ```
///
/// Shards are plain file names in the index's directory, each a complete checkpoint file.

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "eredu/io/formats/tensor_info.hpp"

namespace eredu::io {

/// A parsed sharded-checkpoint index.
struct ShardedIndex {
  /// The index's `metadata`, non-string values as their compact JSON text ("4305").
  Metadata metadata{};
  /// (tensor, shard file name) pairs of `weight_map`, in the index's order.
  std::vector<std::pair<std::string, std::string>> weight_map{};

  /// The distinct shard file names, sorted (the order the shards are opened in).
  std::vector<std::string> shards() const;
};

/// Parses the text of an index file named `path` (used in messages). Throws
/// eredu::Error(invalid_index) for bad JSON, a missing or malformed weight_map, a tensor
/// listed twice, or a shard name that is not a plain file name (absolute, `..`, `/`).
ShardedIndex parse_sharded_index(std::string_view text, const std::string& path);

/// Reads and parses the index file at `path`: io_error when it cannot be read,
/// unknown_format when it is not a regular file (never blocks on a FIFO), outside_root when
/// `confine_to` is not empty and the index's real location is outside it.
ShardedIndex read_sharded_index(const std::string& path, const std::filesystem::path& confine_to = {});

}  // namespace eredu::io
