// `eredu checksum PATH`: writes (or updates) the checksum sidecar of a checkpoint, which loads
// and hot-swaps verify: the digest of every tensor and, with --tensor-parallel N, of every
// shard a rank of an N-rank group reads (so `mpirun -np N eredu load PATH --tensor-parallel
// --verify require` can check each rank's bytes). Every tensor is read once; the digests
// already recorded (metadata, the existing sidecar) are checked in the same pass, and one
// that disagrees with the file fails the command before anything is written.
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "cli.hpp"
#include "commands.hpp"
#include "eredu/app/checksum_sidecar.hpp"
#include "eredu/core/printable.hpp"
#include "eredu/io/formats/open_catalog.hpp"
#include "eredu/io/integrity/checksums.hpp"
#include "interrupt.hpp"
#include "load_options.hpp"
#include "progress.hpp"
#include "shard_options.hpp"

namespace eredu::cli {
namespace {

namespace fs = std::filesystem;

/// The options of `eredu checksum`, with their defaults.
struct ChecksumOptions {
  std::string path;
  std::string digest = "sha256";  // --digest sha256|xxh3-128|both
  unsigned tensor_parallel = 0;   // --tensor-parallel N; 0: whole-tensor digests only
  TensorParallelOptions rules;    // --heads, --kv-heads, --head-dim, --family, --shard (`enabled` unused)
};

/// "SHA-256", "XXH3-128" or "SHA-256 and XXH3-128": the kinds `sums` holds.
std::string kinds_text(const io::Checksums& sums) {
  bool sha = false, xxh = false;
  auto note = [&](const io::TensorDigests& d) {
    sha = sha || d.get(io::DigestKind::sha256);
    xxh = xxh || d.get(io::DigestKind::xxh3_128);
  };
  for (const auto& [tensor, d] : sums.digests()) note(d);
  for (const auto& [tensor, shards] : sums.shards())
    for (const auto& [text, shard] : shards) note(shard.digests);
  return sha && xxh ? "SHA-256 and XXH3-128" : xxh ? "XXH3-128" : "SHA-256";
}

int run_checksum(const ChecksumOptions& o, const CommonFlags& flags) {
  Progress progress(!flags.quiet);
  progress.phase("open");
  const io::Catalog catalog = io::open_catalog(o.path);
  // What is recorded already: checked while hashing, and kept (every digest of the new
  // sidecar is then one this run computed or checked).
  app::ShardSelections shards;
  std::optional<LlamaDims> dims;
  std::size_t asked_shards = 0;
  if (o.tensor_parallel > 0) {
    dims = llama_dims(catalog, {o.rules.heads, o.rules.kv_heads, o.rules.head_dim}, o.path);
    const engine::ShardingRules rules = tensor_parallel_rules(o.rules.shard, o.rules.family, dims->sharding);
    shards = app::tensor_parallel_selections(catalog, rules, static_cast<int>(o.tensor_parallel));
    for (const auto& [tensor, selections] : shards) asked_shards += selections.size();
  }

  const double t0 = now_seconds();
  // A signal stops the command up to the moment the sidecar is written (hash_progress's check,
  // last called just before): after it, the sidecar is in place and the run has its result.
  const app::WrittenChecksums written =
      app::write_checksums(o.path, catalog, app::digest_kinds(o.digest), shards, hash_progress(progress));
  const double seconds = now_seconds() - t0;
  const fs::path& sidecar = written.sidecar;
  const io::Checksums& sums = written.checksums;
  const app::HashStats& stats = written.stats;
  progress.finish();

  std::uint64_t digest_count = 0;  // whole-tensor digests written, each kind counted
  for (const auto& [tensor, d] : sums.digests())
    digest_count += (d.get(io::DigestKind::sha256) ? 1 : 0) + (d.get(io::DigestKind::xxh3_128) ? 1 : 0);
  const std::size_t file_count = catalog.files().size();
  if (flags.json) {
    JsonWriter json;
    begin_document(json, "checksum");
    json.field("path", o.path).field("sidecar", sidecar.string()).field("digest", o.digest);
    json.count("tensor", stats.tensors).count("file", file_count).bytes("tensor", catalog.total_bytes());
    json.bytes("", stats.bytes).seconds("", seconds).rate("", gb_per_s(stats.bytes, seconds));
    json.count("digest", digest_count).count("shard", sums.shard_count());
    json.count("verified", stats.verified).count("shard_verified", stats.verified_shards);
    if (dims) {
      json.key("tensor_parallel").begin_object().count("rank", o.tensor_parallel);
      json.field("head_dim", dims->sharding.head_dim).field("heads", dims->sharding.heads);
      json.field("kv_heads", dims->sharding.kv_heads).field("dims_from", dims->source);
      json.count("shard_rule", o.rules.shard.size()).count("split_tensor", shards.size());
      json.count("shard", asked_shards).end_object();
    } else {
      json.null_field("tensor_parallel");
    }
    print_document(json);
    return 0;
  }
  fmt::print("checksum {} ({} tensors, {} file{}) of {} in {:.3f} s: {:.2f} GB/s\n", format_bytes(stats.bytes),
             stats.tensors, file_count, file_count == 1 ? "" : "s", printable(o.path), seconds,
             gb_per_s(stats.bytes, seconds));
  fmt::print("  sidecar  {}: {} whole-tensor digest{}, {} shard digest{} ({})\n", printable(sidecar.string()),
             digest_count, digest_count == 1 ? "" : "s", sums.shard_count(), sums.shard_count() == 1 ? "" : "s",
             kinds_text(sums));
  if (dims)
    fmt::print("  shards   --tensor-parallel {}: {} shard{} of {} split tensor{} (head dim {}, {})\n",
               o.tensor_parallel, asked_shards, asked_shards == 1 ? "" : "s", shards.size(),
               shards.size() == 1 ? "" : "s", dims->sharding.head_dim, dims->source);
  else
    fmt::print("  shards   none asked (--tensor-parallel N records those of each rank of an N-rank group)\n");
  if (stats.verified + stats.verified_shards == 0)
    fmt::print("  verified nothing: no digest was recorded before\n");
  else
    fmt::print("  verified {} recorded whole-tensor digest{} and {} shard digest{} against the file\n", stats.verified,
               stats.verified == 1 ? "" : "s", stats.verified_shards, stats.verified_shards == 1 ? "" : "s");
  return 0;
}

}  // namespace

Command add_checksum_command(CLI::App& app, CommonFlags& flags) {
  auto o = std::make_shared<ChecksumOptions>();
  CLI::App* cmd = add_command(
      app, "checksum", "write a checkpoint's checksum sidecar (whole tensors, tensor-parallel shards)",
      "Reads every tensor once and writes the digest of each to the checkpoint's checksum sidecar "
      "(<file>.sha256.json, or checksums.sha256.json inside a directory), which loads and hot-swaps verify. With "
      "--tensor-parallel N, also the digest of every shard each rank of an N-rank group reads, by the rules of "
      "eredu load --tensor-parallel, so that mpirun -np N eredu load PATH --tensor-parallel --verify require "
      "checks each rank's bytes. The digests already recorded (the checkpoint's metadata, the existing sidecar) "
      "are checked in the same pass and kept: one that differs from the file fails the command (checksum_mismatch) "
      "and nothing is written. The sidecar is replaced atomically.");
  add_path(*cmd, "PATH", o->path,
           "a .safetensors file, a sharded directory or its model.safetensors.index.json, a .gguf file or split set");
  add_choice(*cmd, "--digest", o->digest, {"sha256", "xxh3-128", "both"},
             "what to record: SHA-256 (interoperable), XXH3-128 (a fast non-cryptographic check) or both; digests "
             "of other kinds already recorded are checked and kept");
  CLI::Option* tensor_parallel =
      add_integer(*cmd, "--tensor-parallel", o->tensor_parallel, app::option_range::tensor_parallel,
                  "also record the digest of every shard each rank of an N-rank tensor-parallel group reads",
                  "none: whole-tensor digests only");
  const std::vector<CLI::Option*> rule_options = add_tensor_parallel_rule_options(*cmd, o->rules);
  add_common_flags(*cmd, flags, true);
  return {cmd, [o, tensor_parallel, rule_options](const CommonFlags& f) {
            if (tensor_parallel->count() == 0)
              for (const CLI::Option* option : rule_options)
                if (option->count() > 0)
                  throw UsageError(fmt::format("{}: only with --tensor-parallel", option->get_name()));
            return run_checksum(*o, f);
          }};
}

}  // namespace eredu::cli
