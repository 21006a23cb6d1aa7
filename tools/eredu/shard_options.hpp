#pragma once
/// \file
/// The sharding options of `eredu load --tensor-parallel` and `eredu checksum --tensor-parallel N`
/// (--heads, --kv-heads, --head-dim, --family, --shard): parsed and checked while the command
/// line is parsed, and turned into rules by eredu::app's sharding presets
/// (eredu/app/sharding_presets.hpp), whose typed errors become usage errors here.

#include <CLI/CLI.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "eredu/app/sharding_presets.hpp"
#include "eredu/engine/parallel/sharding.hpp"
#include "eredu/io/formats/catalog.hpp"

namespace eredu::cli {

struct TensorParallelOptions;  // load_options.hpp

/// What the command line says about the attention heads (0: not given).
using app::HeadOptions;
/// The dimensions the family rules get, and where they came from (for the report).
using app::LlamaDims;

/// One `--shard PATTERN=SPEC` (app::parse_shard_rule); throws UsageError naming --shard and
/// what is wrong.
std::pair<std::string, engine::Shard> parse_shard_rule(std::string_view text);

/// Adds the options that shape the sharding rules to `command` — --heads, --kv-heads,
/// --head-dim, --family and the repeatable --shard PATTERN=SPEC (each checked by
/// parse_shard_rule while the command line is parsed) — storing into `options`. Returns them,
/// for the command's check that they come only with --tensor-parallel.
std::vector<CLI::Option*> add_tensor_parallel_rule_options(CLI::App& command, TensorParallelOptions& options);

/// app::llama_dims with the options spelled as the command line spells them; its errors are
/// UsageErrors naming `path`, the tensor and the option to give.
LlamaDims llama_dims(const io::Catalog& catalog, const HeadOptions& given, const std::string& path);

/// The `--shard` rules (each checked by parse_shard_rule), in order, followed by the rules of
/// `--family` (app::sharding_rules): the first match wins, unmatched tensors are replicated.
engine::ShardingRules tensor_parallel_rules(const std::vector<std::string>& shard_rules, const std::string& family,
                                            const engine::LlamaSharding& dims);

}  // namespace eredu::cli
