#pragma once
/// \file
/// Model-family sharding presets: the tensor-parallel rules the front ends build from a few
/// words. A rule `PATTERN=SPEC` (`eredu load --shard`), the attention dimensions of a
/// Llama-shaped checkpoint (given, or read off its shapes), and the rules of a family — `llama`
/// (engine::ShardingRules::llama) or `moe`, the Llama rules with a mixture-of-experts layer's
/// experts divided as its dense MLP is — are parsed and built here, once, for the CLI and Python.

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "eredu/app/option_presets.hpp"
#include "eredu/engine/parallel/sharding.hpp"
#include "eredu/io/formats/catalog.hpp"

namespace eredu::app {

/// One rule `PATTERN=SPEC` (the last '=' separates them): SPEC is `replicated`,
/// `split:DIM[:GRANULE]`, `column[:GRANULE]` (split:0), `row[:GRANULE]` (split:1) or
/// `fused:DIM:PARTS[:GRANULE]` (PARTS equal parts). Throws Error(invalid_argument) whose
/// detail quotes `text` and says what is wrong (the front end puts its option's name before it).
std::pair<std::string, engine::Shard> parse_shard_rule(std::string_view text);

/// The model families whose sharding rules are known.
enum class ShardingFamily {
  llama,  ///< engine::ShardingRules::llama: attention in whole heads, MLP column/row, vocabulary split
  moe,    ///< llama, plus every expert's and shared expert's MLP as the dense one; routers replicated
};

/// --family / family=: the sharding families by name.
inline constexpr std::array sharding_family_choices{Choice<ShardingFamily>{"llama", ShardingFamily::llama},
                                                    Choice<ShardingFamily>{"moe", ShardingFamily::moe}};

/// The family `name` names; throws Error(invalid_argument) listing the families otherwise.
ShardingFamily parse_sharding_family(std::string_view name);

/// The rules of `family` over a checkpoint of dimensions `dims`. moe adds, before the Llama
/// rules: Mixtral's `*.block_sparse_moe.experts.*.w1` / `w3` column- and `w2` row-parallel, and
/// Qwen-MoE's / DeepSeek's `*.mlp.experts.*` and `*.mlp.shared_expert*` gate/up column- and
/// down row-parallel; their routers (`*.block_sparse_moe.gate`, `*.mlp.gate`,
/// `*.mlp.shared_expert_gate`) replicated, as is every tensor no rule names.
engine::ShardingRules family_rules(ShardingFamily family, const engine::LlamaSharding& dims);

/// The rules `shard_rules` (each parsed by parse_shard_rule), in order, then family_rules: the
/// first match wins, unmatched tensors are replicated.
engine::ShardingRules sharding_rules(const std::vector<std::string>& shard_rules, ShardingFamily family,
                                     const engine::LlamaSharding& dims);

/// What a front end was told about the attention heads (0: not given).
struct HeadOptions {
  std::uint64_t heads = 0;     ///< query heads
  std::uint64_t kv_heads = 0;  ///< key/value heads
  std::uint64_t head_dim = 0;  ///< indices per head
};

/// How a front end spells the head options, for the messages that ask for them.
struct HeadOptionNames {
  std::string_view heads;     ///< "--heads" / "heads"
  std::string_view kv_heads;  ///< "--kv-heads" / "kv_heads"
  std::string_view head_dim;  ///< "--head-dim" / "head_dim"
};

/// The command line's spelling.
inline constexpr HeadOptionNames cli_head_option_names{"--heads", "--kv-heads", "--head-dim"};
/// Python's keywords.
inline constexpr HeadOptionNames python_head_option_names{"heads", "kv_heads", "head_dim"};

/// The dimensions the Llama rules get, and where they came from (for reports).
struct LlamaDims {
  engine::LlamaSharding sharding{};  ///< head_dim, heads, kv_heads (0 when unknown and unneeded)
  std::string source{};              ///< "options", "eredu gen's dims" or "no attention tensors"
};

/// The Llama rules' dimensions for `catalog` (docs/cli.md): head_dim as given, else the query
/// rows over the heads given, else, for a checkpoint `eredu gen` wrote (metadata generator
/// eredu-synth), the head size it chose (64 up to a hidden size of 2048, else 128); heads and
/// kv_heads as given, or the q/k projections' rows over head_dim. A checkpoint with attention
/// tensors and none of these, fused qkv_proj tensors without heads and kv_heads, or heads that
/// do not divide the query rows, is Error(invalid_argument) whose detail names `path`, the
/// tensor and the option to give, spelled as `names` says.
LlamaDims llama_dims(const io::Catalog& catalog, const HeadOptions& given, const std::string& path,
                     const HeadOptionNames& names);

}  // namespace eredu::app
