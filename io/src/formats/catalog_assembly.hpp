#pragma once
// Building a Catalog from parsed files, wherever the files are (a local directory, a URL): the
// format pick and parse of one file, and the cross-checks of a sharded checkpoint (index
// against shards) and of a split GGUF set, each given a way to parse a file by its name.

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "eredu/core/errc.hpp"
#include "eredu/io/formats/catalog.hpp"
#include "eredu/io/formats/header_reader.hpp"
#include "eredu/io/formats/sharded_index.hpp"
#include "eredu/io/formats/split_gguf.hpp"

namespace eredu::io::detail {

/// One parsed file: what goes into the catalog.
struct ParsedFile {
  CheckpointFile file;
  std::vector<TensorInfo> tensors;
};

/// Who named a file, for messages: a shard names the index and how many tensors it holds.
struct Naming {
  errc missing = errc::io_error;  ///< kind for a file that does not exist
  std::string role;               ///< "checkpoint file", "shard named by X for N tensors"
};

/// Parses the file a shard or split name (a plain file name) designates.
using ParseNamed = std::function<ParsedFile(const std::string& name, const Naming& naming)>;

/// Picks the format from the file's first bytes `head` (up to 64) and `path`, then parses its
/// header through `reader`. The result's device, inode and stamp are left for the caller.
ParsedFile parse_layout(HeaderReader& reader, std::span<const std::byte> head, std::uint64_t size,
                        const std::string& path);

/// The catalog of one file.
Catalog assemble_single(ParsedFile parsed);

/// The catalog of a sharded checkpoint: every shard `index` names, parsed by `parse` in sorted
/// name order, and checked against the index as the reference does (shard_missing comes from
/// `parse`; tensor_missing_from_shard, tensor_in_two_shards, tensor_not_in_index).
Catalog assemble_sharded(const ShardedIndex& index, const std::string& index_name, const ParseNamed& parse);

/// The catalog of a split GGUF set (split_gguf.hpp), `any_name` being the name the user gave;
/// split_mismatch and tensor_in_two_shards as the cross-checks find.
Catalog assemble_split_gguf(const gguf::SplitName& split, const std::string& any_name, const ParseNamed& parse);

}  // namespace eredu::io::detail
