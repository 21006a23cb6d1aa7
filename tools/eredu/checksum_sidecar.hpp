#pragma once
/// \file
/// The checksum sidecar of a checkpoint as `eredu checksum` and `eredu gen --checksums` write
/// it: every tensor hashed in one read (hash_checkpoint), the shard selections of every rank
/// of a tensor-parallel group (tensor_parallel_selections), and the sidecar written
/// atomically (write_sidecar). The format is io::Checksums' (eredu/io/integrity/checksums.hpp).

#include <cstdint>
#include <filesystem>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "eredu/core/selection.hpp"
#include "eredu/engine/parallel/sharding.hpp"
#include "eredu/io/formats/catalog.hpp"
#include "eredu/io/integrity/checksums.hpp"
#include "eredu/io/integrity/digest.hpp"
#include "progress.hpp"

namespace eredu::cli {

/// The digests `--digest` names: "sha256", "xxh3-128" or "both".
std::vector<io::DigestKind> digest_kinds(const std::string& digest);

/// Tensor name → the selections (parts of it) to record shard digests of.
using ShardSelections = std::map<std::string, std::vector<Selection>>;

/// The pieces every rank of a `size`-rank tensor-parallel group reads of each split or fused
/// tensor under `rules` (engine::plan_tensor_parallel for each rank), each selection once, in
/// rank order. Replicated tensors have none: their ranks read them whole. Throws what
/// plan_tensor_parallel throws (Error(invalid_argument) for a size the rules cannot divide).
ShardSelections tensor_parallel_selections(const io::Catalog& catalog, const engine::ShardingRules& rules, int size);

/// What hash_checkpoint read and checked.
struct HashStats {
  std::uint64_t tensors = 0;          ///< tensors hashed
  std::uint64_t bytes = 0;            ///< bytes read (each tensor once)
  std::uint64_t verified = 0;         ///< whole-tensor digests of `known` that matched the file
  std::uint64_t verified_shards = 0;  ///< shard digests of `known` that matched the file
};

/// Reads every tensor of `catalog` once, in file order, with pread in a bounded buffer (never
/// a whole tensor in memory), and returns the digests of the sidecar to write:
///  * the digests of `kinds` of every tensor, and of every selection `shards` lists (each the
///    digest of the selection's bytes in the order a load delivers them: the concatenation of
///    selection_runs(), row-major within the selection, as stored);
///  * every digest `known` records (whole or shard, of any kind), each hashed in the same pass
///    and compared with the file: so every digest returned was checked against the file now.
///
/// Before anything is read, every tensor's name must be one a sidecar can record
/// (io::Checksums::check_recordable), and every digest of `known` and every selection must
/// name a tensor of the catalog and fit it: Error(tensor_not_found), Error(invalid_argument). A recorded digest
/// that differs from the file is Error(checksum_mismatch) naming file, tensor, offset (and
/// the shard), thrown as soon as that tensor is hashed. A file that cannot be opened or read
/// is Error(io_error), one that ends early Error(unexpected_eof), both naming file, tensor and
/// offset. `progress` shows the phase "hash" over the checkpoint's bytes. `stats`, when
/// given, receives what was read and checked.
io::Checksums hash_checkpoint(const io::Catalog& catalog, std::span<const io::DigestKind> kinds,
                              const ShardSelections& shards, const io::Checksums& known, Progress& progress,
                              HashStats* stats = nullptr);

/// Writes `checksums` (io::Checksums::to_json) to `sidecar` atomically: to "<sidecar>.tmp" in
/// the same directory, fsync'ed, then renamed over `sidecar` (and the directory fsync'ed), so
/// a reader sees the old sidecar or the new one, never part of one. Throws Error(io_error)
/// naming the file, after removing the temporary file.
void write_sidecar(const std::filesystem::path& sidecar, const io::Checksums& checksums);

}  // namespace eredu::cli
