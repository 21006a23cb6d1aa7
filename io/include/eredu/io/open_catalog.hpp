#pragma once
/// \file
/// open_catalog: from a path the user gave to a validated Catalog of every tensor.

#include <filesystem>

#include "eredu/io/catalog.hpp"

namespace eredu::io {

/// Opens a checkpoint and validates every header. `path` may be:
///  - a checkpoint file (format picked by checkpoint_formats(), safetensors by default); a
///    file named like a split GGUF file (`*-00001-of-00003.gguf`) opens the whole split set
///    (split_gguf.hpp), cross-checked (shard_missing, split_mismatch, tensor_in_two_shards);
///  - a directory holding `model.safetensors.index.json` (a sharded checkpoint), or else
///    exactly one `*.safetensors` file, or else one `*.gguf` file or one split GGUF set;
///  - the path of a `*.index.json` file.
/// Shards are opened in sorted file-name order, and the index and the shards must agree
/// exactly (shard_missing, tensor_missing_from_shard, tensor_in_two_shards,
/// tensor_not_in_index). The catalog's metadata is the index's for a sharded checkpoint,
/// else the file's. Throws eredu::Error: io_error (with the errno) when a path cannot be
/// opened, unknown_format for a directory without a checkpoint, or any format error.
Catalog open_catalog(const std::filesystem::path& path);

}  // namespace eredu::io
