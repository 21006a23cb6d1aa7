#pragma once
/// \file
/// open_catalog: from a path the user gave to a validated Catalog of every tensor.

#include <filesystem>

#include "eredu/io/formats/catalog.hpp"

namespace eredu::io {

/// How open_catalog treats the paths it opens.
struct CatalogOptions {
  /// When not empty: every file of the checkpoint (file, index, shards), with symbolic links
  /// resolved, must lie inside this directory, else errc::outside_root. Empty (the
  /// default): links are followed wherever they lead (the Hugging Face cache links
  /// `snapshots/<rev>/x` to `../../blobs/<sha>`); shard names still cannot leave the index's
  /// directory by name (`/`, `..` are invalid_index).
  std::filesystem::path confine_to{};
};

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
/// opened, unknown_format for a directory without a checkpoint or a path that is not a
/// regular file (a FIFO, a device, a socket: refused without blocking), outside_root (see
/// CatalogOptions), or any format error.
Catalog open_catalog(const std::filesystem::path& path, const CatalogOptions& options = {});

}  // namespace eredu::io
