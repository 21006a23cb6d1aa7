#include "shard_options.hpp"

#include "commands.hpp"
#include "eredu/core/error.hpp"
#include "load_options.hpp"
#include "options.hpp"

namespace eredu::cli {

std::pair<std::string, engine::Shard> parse_shard_rule(std::string_view text) {
  try {
    return app::parse_shard_rule(text);
  } catch (const Error& e) {
    throw UsageError("--shard: " + e.detail());
  }
}

LlamaDims llama_dims(const io::Catalog& catalog, const HeadOptions& given, const std::string& path) {
  try {
    return app::llama_dims(catalog, given, path, app::cli_head_option_names);
  } catch (const Error& e) {
    if (e.kind() != errc::invalid_argument) throw;
    throw UsageError(e.detail());
  }
}

std::vector<CLI::Option*> add_tensor_parallel_rule_options(CLI::App& command, TensorParallelOptions& options) {
  return {
      add_integer(command, "--heads", options.heads, app::option_range::heads,
                  "--tensor-parallel: query heads (head size = q_proj rows / heads)", "inferred"),
      add_integer(command, "--kv-heads", options.kv_heads, app::option_range::heads,
                  "--tensor-parallel: key/value heads (needed with --heads for fused qkv_proj tensors)", "inferred"),
      add_integer(command, "--head-dim", options.head_dim, app::option_range::heads,
                  "--tensor-parallel: indices per attention head, the unit q/k/v/o are split in",
                  "from --heads, or eredu gen's"),
      add_choice(command, "--family", options.family,
                 app::choice_names<std::vector<std::string>>(app::sharding_family_choices),
                 "--tensor-parallel: the model family whose sharding rules follow the --shard rules: llama, or moe "
                 "(llama's, and every expert's MLP divided as the dense one, routers replicated)"),
      command
          .add_option("--shard", options.shard,
                      "--tensor-parallel: a rule PATTERN=SPEC before the --family rules (repeatable; first match "
                      "wins); SPEC replicated, split:DIM[:GRANULE], column[:GRANULE], row[:GRANULE] or "
                      "fused:DIM:PARTS[:GRANULE]")
          ->type_name("PATTERN=SPEC")
          ->allow_extra_args(false)
          ->check(CLI::Validator(
              [](std::string& text) -> std::string {
                try {
                  app::parse_shard_rule(text);
                  return {};
                } catch (const Error& e) {
                  return e.detail();  // CLI11 puts the option's name before the message already
                }
              },
              "", "shard_rule"))};
}

engine::ShardingRules tensor_parallel_rules(const std::vector<std::string>& shard_rules, const std::string& family,
                                            const engine::LlamaSharding& dims) {
  app::ShardingFamily preset{};
  try {
    preset = app::parse_sharding_family(family);
  } catch (const Error& e) {
    throw UsageError("--family: " + e.detail());
  }
  for (const std::string& text : shard_rules) parse_shard_rule(text);  // a UsageError naming --shard
  return app::sharding_rules(shard_rules, preset, dims);
}

}  // namespace eredu::cli
