#include "shard_options.hpp"

#include <optional>

#include <fmt/format.h>

#include "commands.hpp"
#include "load_options.hpp"
#include "options.hpp"

namespace eredu::cli {
namespace {

std::vector<std::string_view> split_colons(std::string_view s) {
  std::vector<std::string_view> parts;
  for (std::size_t start = 0;;) {
    const std::size_t colon = s.find(':', start);
    parts.push_back(s.substr(start, colon == std::string_view::npos ? std::string_view::npos : colon - start));
    if (colon == std::string_view::npos) return parts;
    start = colon + 1;
  }
}

/// The first tensor whose name matches `pattern`, or nullptr.
const io::TensorInfo* first_matching(const io::Catalog& catalog, std::string_view pattern) {
  for (const io::TensorInfo& t : catalog.tensors())
    if (engine::glob_match(pattern, t.name) && !t.shape.empty()) return &t;
  return nullptr;
}

}  // namespace

std::pair<std::string, engine::Shard> parse_shard_rule(std::string_view text) {
  const std::size_t eq = text.rfind('=');
  if (eq == std::string_view::npos || eq == 0 || eq + 1 == text.size())
    throw UsageError(fmt::format("--shard: '{}' is not PATTERN=SPEC (e.g. '*.mlp.*_proj.weight=column')", text));
  const std::string pattern(text.substr(0, eq));
  const std::vector<std::string_view> parts = split_colons(text.substr(eq + 1));
  const std::string_view kind = parts[0];
  auto number = [&](std::size_t i, const char* what, std::uint64_t min) {
    const std::optional<std::uint64_t> v = parse_integer<std::uint64_t>(parts[i]);
    if (!v || *v < min || *v > (std::uint64_t{1} << 32))
      throw UsageError(
          fmt::format("--shard: '{}': {} '{}' is not an integer from {} to 4294967296", text, what, parts[i], min));
    return *v;
  };
  auto arity = [&](std::size_t min, std::size_t max) {
    if (parts.size() < min || parts.size() > max)
      throw UsageError(
          fmt::format("--shard: '{}': SPEC is replicated, split:DIM[:GRANULE], column[:GRANULE], row[:GRANULE] or "
                      "fused:DIM:PARTS[:GRANULE]",
                      text));
  };
  if (kind == "replicated") {
    arity(1, 1);
    return {pattern, engine::Shard::replicated()};
  }
  if (kind == "column" || kind == "row") {
    arity(1, 2);
    const std::uint64_t granule = parts.size() > 1 ? number(1, "GRANULE", 1) : 1;
    return {pattern, kind == "column" ? engine::Shard::column_parallel(granule) : engine::Shard::row_parallel(granule)};
  }
  if (kind == "split") {
    arity(2, 3);
    const std::uint64_t dim = number(1, "DIM", 0);
    return {pattern,
            engine::Shard::split(static_cast<std::size_t>(dim), parts.size() > 2 ? number(2, "GRANULE", 1) : 1)};
  }
  if (kind == "fused") {
    arity(3, 4);
    const std::uint64_t dim = number(1, "DIM", 0);
    const std::uint64_t count = number(2, "PARTS", 1);
    return {pattern, engine::Shard::fused_even(static_cast<std::size_t>(dim), static_cast<std::size_t>(count),
                                               parts.size() > 3 ? number(3, "GRANULE", 1) : 1)};
  }
  arity(0, 0);  // an unknown SPEC: the message lists the known ones
  return {};
}

LlamaDims llama_dims(const io::Catalog& catalog, const HeadOptions& given, const std::string& path) {
  LlamaDims out;
  const io::TensorInfo* q = first_matching(catalog, "*.self_attn.q_proj.weight");
  const io::TensorInfo* k = first_matching(catalog, "*.self_attn.k_proj.weight");
  const io::TensorInfo* qkv = first_matching(catalog, "*.self_attn.qkv_proj.weight");
  const io::TensorInfo* o = first_matching(catalog, "*.self_attn.o_proj.weight");
  const bool attention = q || k || qkv || o;
  std::uint64_t head_dim = given.head_dim;
  out.source = "options";
  if (qkv && (given.heads == 0 || given.kv_heads == 0))
    throw UsageError(fmt::format(
        "{}: tensor '{}' is a fused QKV projection: give --heads and --kv-heads, so that each rank gets whole heads of "
        "q, k and v",
        path, qkv->name));
  if (head_dim == 0 && given.heads != 0) {
    // The query rows are heads × head_dim (a fused QKV: heads + 2 × kv_heads of them).
    const io::TensorInfo* t = qkv ? qkv : q;
    const std::uint64_t units = qkv ? given.heads + 2 * given.kv_heads : given.heads;
    if (!t)
      throw UsageError(fmt::format("--heads: {} has no *.self_attn.q_proj.weight or qkv_proj tensor to divide", path));
    if (t->shape[0] % units != 0)
      throw UsageError(fmt::format("--heads: tensor '{}' of {} has {} rows, not a multiple of {} heads", t->name, path,
                                   t->shape[0], units));
    head_dim = t->shape[0] / units;
  }
  const auto generator = catalog.metadata().find("generator");
  if (head_dim == 0 && attention && generator != catalog.metadata().end() && generator->second == "eredu-synth") {
    // eredu gen's rule (tools/synth, dims_for_hidden): 64-wide heads up to a hidden size of
    // 2048, 128-wide above, as Llama-family models choose them. The hidden size is q_proj's
    // input dim (or o_proj's output).
    const std::uint64_t hidden = q && q->shape.size() == 2 ? q->shape[1] : o ? o->shape[0] : 0;
    head_dim = hidden <= 2048 ? 64 : 128;
    out.source = "eredu gen's dims";
  }
  if (head_dim == 0 && attention)
    throw UsageError(fmt::format(
        "{}: cannot tell the attention heads' size of this checkpoint (it was not written by eredu gen): give --heads "
        "(query heads) or --head-dim",
        path));
  if (!attention) {
    out.source = "no attention tensors";
    if (head_dim == 0) head_dim = 128;  // unused: no rule divides by it
  }
  out.sharding.head_dim = head_dim;
  out.sharding.heads = given.heads;
  out.sharding.kv_heads = given.kv_heads;
  if (out.sharding.heads == 0 && q && q->shape[0] % head_dim == 0) out.sharding.heads = q->shape[0] / head_dim;
  if (out.sharding.kv_heads == 0 && k && k->shape[0] % head_dim == 0) out.sharding.kv_heads = k->shape[0] / head_dim;
  return out;
}

std::vector<CLI::Option*> add_tensor_parallel_rule_options(CLI::App& command, TensorParallelOptions& options) {
  return {
      add_integer(command, "--heads", options.heads, std::uint64_t{1}, std::uint64_t{1} << 20,
                  "--tensor-parallel: query heads (head size = q_proj rows / heads)", "inferred"),
      add_integer(command, "--kv-heads", options.kv_heads, std::uint64_t{1}, std::uint64_t{1} << 20,
                  "--tensor-parallel: key/value heads (needed with --heads for fused qkv_proj tensors)", "inferred"),
      add_integer(command, "--head-dim", options.head_dim, std::uint64_t{1}, std::uint64_t{1} << 20,
                  "--tensor-parallel: indices per attention head, the unit q/k/v/o are split in",
                  "from --heads, or eredu gen's"),
      command
          .add_option("--shard", options.shard,
                      "--tensor-parallel: a rule PATTERN=SPEC before the Llama rules (repeatable; first match wins); "
                      "SPEC replicated, split:DIM[:GRANULE], column[:GRANULE], row[:GRANULE] or "
                      "fused:DIM:PARTS[:GRANULE]")
          ->type_name("PATTERN=SPEC")
          ->allow_extra_args(false)
          ->check(CLI::Validator(
              [](std::string& text) -> std::string {
                try {
                  parse_shard_rule(text);
                  return {};
                } catch (const std::exception& e) {
                  // CLI11 puts the option's name before the message already.
                  std::string_view message = e.what();
                  if (message.starts_with("--shard: ")) message.remove_prefix(9);
                  return std::string(message);
                }
              },
              "", "shard_rule"))};
}

engine::ShardingRules tensor_parallel_rules(const std::vector<std::string>& shard_rules,
                                            const engine::LlamaSharding& dims) {
  engine::ShardingRules rules;
  for (const std::string& text : shard_rules) {
    auto [pattern, shard] = parse_shard_rule(text);
    rules.add(std::move(pattern), std::move(shard));
  }
  const engine::ShardingRules llama = engine::ShardingRules::llama(dims);
  for (const auto& [pattern, shard] : llama.rules()) rules.add(pattern, shard);
  return rules.otherwise(engine::Shard::replicated());
}

}  // namespace eredu::cli
