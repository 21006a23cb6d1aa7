#pragma once
/// \file
/// The checksum sidecar of a checkpoint as `eredu checksum`, `eredu gen --checksums` and
/// Python's `eredu.write_checksums` write it: every tensor hashed in one read (hash_checkpoint),
/// the shard selections of every rank of a tensor-parallel group (tensor_parallel_selections),
/// the sidecar written atomically (write_sidecar), and all of it for a checkpoint whose recorded
/// digests are checked on the way (write_checksums). The format is io::Checksums'
/// (eredu/io/integrity/checksums.hpp).

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "eredu/core/selection.hpp"
#include "eredu/engine/parallel/sharding.hpp"
#include "eredu/io/formats/catalog.hpp"
#include "eredu/io/integrity/checksums.hpp"
#include "eredu/io/integrity/digest.hpp"

namespace eredu::app {

/// The digests `--digest` (and Python's digest=) names: "sha256", "xxh3-128" or "both"; throws
/// Error(invalid_argument) for another name.
std::vector<io::DigestKind> digest_kinds(const std::string& digest);

/// Where hash_checkpoint reports, each part optional. Either callback may throw to stop the
/// hashing (an interrupt): nothing is written then.
struct HashProgress {
  /// Once, before the first read: the bytes to hash.
  std::function<void(std::uint64_t total)> start{};
  /// After every buffer (4 MiB): the bytes hashed so far.
  std::function<void(std::uint64_t done)> update{};
  /// After every buffer and once before write_checksums writes: `what` names the file being
  /// hashed (or the checkpoint, the last time).
  std::function<void(const std::string& what)> check{};
};

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
/// offset. `progress` hears of the checkpoint's bytes as they are hashed. `stats`, when
/// given, receives what was read and checked.
io::Checksums hash_checkpoint(const io::Catalog& catalog, std::span<const io::DigestKind> kinds,
                              const ShardSelections& shards, const io::Checksums& known,
                              const HashProgress& progress = {}, HashStats* stats = nullptr);

/// Writes `checksums` (io::Checksums::to_json) to `sidecar` atomically: to "<sidecar>.tmp" in
/// the same directory, fsync'ed, then renamed over `sidecar` (and the directory fsync'ed), so
/// a reader sees the old sidecar or the new one, never part of one. Throws Error(io_error)
/// naming the file, after removing the temporary file.
void write_sidecar(const std::filesystem::path& sidecar, const io::Checksums& checksums);

/// What write_checksums wrote.
struct WrittenChecksums {
  std::filesystem::path sidecar;  ///< io::Checksums::sidecar_path(path)
  io::Checksums checksums;        ///< what it holds
  HashStats stats;                ///< what was read and checked
};

/// The checksum sidecar of the checkpoint at `path` (whose catalog is `catalog`), as `eredu
/// checksum` writes it: the digests its metadata and existing sidecar record
/// (io::Checksums::discover) are checked against the file and kept, the digests of `kinds` of
/// every tensor and of every selection of `shards` are added, and the sidecar is replaced
/// atomically. Throws what hash_checkpoint and write_sidecar throw; a mismatch writes nothing.
WrittenChecksums write_checksums(const std::string& path, const io::Catalog& catalog,
                                 std::span<const io::DigestKind> kinds, const ShardSelections& shards = {},
                                 const HashProgress& progress = {});

}  // namespace eredu::app
