#pragma once
/// \file
/// The sharding rules of `eredu load --tensor-parallel` and `eredu checksum --tensor-parallel N`:
/// their options (--heads, --kv-heads, --head-dim, --shard), `--shard PATTERN=SPEC` rules parsed
/// and checked while the command line is parsed, the attention dimensions of a Llama-shaped
/// checkpoint (from --heads / --kv-heads / --head-dim, or from the shapes of a checkpoint
/// `eredu gen` wrote), and the rules they make with engine::ShardingRules::llama.

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "eredu/engine/parallel/sharding.hpp"
#include "eredu/io/formats/catalog.hpp"

namespace eredu::cli {

struct TensorParallelOptions;  // load_options.hpp

/// One `--shard PATTERN=SPEC`: SPEC is `replicated`, `split:DIM[:GRANULE]`,
/// `column[:GRANULE]` (split:0), `row[:GRANULE]` (split:1) or `fused:DIM:PARTS[:GRANULE]`
/// (PARTS equal parts). Throws UsageError naming --shard and what is wrong.
std::pair<std::string, engine::Shard> parse_shard_rule(std::string_view text);

/// Adds the options that shape the sharding rules to `command` — --heads, --kv-heads,
/// --head-dim and the repeatable --shard PATTERN=SPEC (each checked by parse_shard_rule while
/// the command line is parsed) — storing into `options`. Returns them, for the command's
/// check that they come only with --tensor-parallel.
std::vector<CLI::Option*> add_tensor_parallel_rule_options(CLI::App& command, TensorParallelOptions& options);

/// What the command line says about the attention heads (0: not given).
struct HeadOptions {
  std::uint64_t heads = 0;     ///< --heads
  std::uint64_t kv_heads = 0;  ///< --kv-heads
  std::uint64_t head_dim = 0;  ///< --head-dim
};

/// The dimensions the Llama rules get, and where they came from (for the report).
struct LlamaDims {
  engine::LlamaSharding sharding{};  ///< head_dim, heads, kv_heads (0 when unknown and unneeded)
  std::string source{};              ///< "options", "eredu gen's dims" or "no attention tensors"
};

/// The Llama rules' dimensions for `catalog` (see docs/cli.md): --head-dim, else the query
/// rows over --heads, else, for a checkpoint `eredu gen` wrote (metadata generator
/// eredu-synth), the head size it chose (64 up to a hidden size of 2048, else 128); heads and
/// kv_heads are the options or the q/k projections' rows over head_dim. A checkpoint with
/// attention tensors and none of these, or fused qkv_proj tensors without --heads and
/// --kv-heads, or --heads that do not divide the query rows, is a UsageError naming `path`,
/// the tensor and the option to give.
LlamaDims llama_dims(const io::Catalog& catalog, const HeadOptions& given, const std::string& path);

/// The `--shard` rules (each checked by parse_shard_rule), in order, followed by
/// engine::ShardingRules::llama(dims): the first match wins, unmatched tensors are replicated.
engine::ShardingRules tensor_parallel_rules(const std::vector<std::string>& shard_rules,
                                            const engine::LlamaSharding& dims);

}  // namespace eredu::cli
