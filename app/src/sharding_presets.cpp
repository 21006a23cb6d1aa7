#include "eredu/app/sharding_presets.hpp"

#include <charconv>
#include <optional>

#include <fmt/format.h>

#include "eredu/core/error.hpp"

namespace eredu::app {
namespace {

[[noreturn]] void bad(std::string detail) { throw Error(errc::invalid_argument, {}, detail); }

std::vector<std::string_view> split_colons(std::string_view s) {
  std::vector<std::string_view> parts;
  for (std::size_t start = 0;;) {
    const std::size_t colon = s.find(':', start);
    parts.push_back(s.substr(start, colon == std::string_view::npos ? std::string_view::npos : colon - start));
    if (colon == std::string_view::npos) return parts;
    start = colon + 1;
  }
}

/// A whole decimal number: no sign, spaces or trailing text.
std::optional<std::uint64_t> parse_number(std::string_view text) noexcept {
  std::uint64_t value = 0;
  if (text.empty() || text.front() == '+' || text.front() == '-') return std::nullopt;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value, 10);
  if (ec != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return value;
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
    bad(fmt::format("'{}' is not PATTERN=SPEC (e.g. '*.mlp.*_proj.weight=column')", text));
  const std::string pattern(text.substr(0, eq));
  const std::vector<std::string_view> parts = split_colons(text.substr(eq + 1));
  const std::string_view kind = parts[0];
  auto number = [&](std::size_t i, const char* what, std::uint64_t min) {
    const std::optional<std::uint64_t> v = parse_number(parts[i]);
    if (!v || *v < min || *v > (std::uint64_t{1} << 32))
      bad(fmt::format("'{}': {} '{}' is not an integer from {} to 4294967296", text, what, parts[i], min));
    return *v;
  };
  auto arity = [&](std::size_t min, std::size_t max) {
    if (parts.size() < min || parts.size() > max)
      bad(fmt::format(
          "'{}': SPEC is replicated, split:DIM[:GRANULE], column[:GRANULE], row[:GRANULE] or fused:DIM:PARTS[:GRANULE]",
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

ShardingFamily parse_sharding_family(std::string_view name) {
  if (std::optional<ShardingFamily> family = parse_choice(sharding_family_choices, name)) return *family;
  bad(fmt::format("family must be {}, not '{}'", choice_list(sharding_family_choices), name));
}

engine::ShardingRules family_rules(ShardingFamily family, const engine::LlamaSharding& dims) {
  engine::ShardingRules rules;
  if (family == ShardingFamily::moe) {
    // An expert is an MLP of its own: gate and up divide their outputs, down its input, so each
    // rank holds a slice of every expert (tensor parallelism within experts, as vLLM's fused MoE
    // layer divides them), and the router sees the whole hidden state on every rank.
    for (const char* expert : {"*.mlp.experts.*.", "*.mlp.shared_expert*."}) {
      rules.add(fmt::format("{}gate_proj.weight", expert), engine::Shard::column_parallel())
          .add(fmt::format("{}up_proj.weight", expert), engine::Shard::column_parallel())
          .add(fmt::format("{}down_proj.weight", expert), engine::Shard::row_parallel());
    }
    rules.add("*.block_sparse_moe.experts.*.w1.weight", engine::Shard::column_parallel())
        .add("*.block_sparse_moe.experts.*.w3.weight", engine::Shard::column_parallel())
        .add("*.block_sparse_moe.experts.*.w2.weight", engine::Shard::row_parallel())
        .add("*.block_sparse_moe.gate.weight", engine::Shard::replicated())
        .add("*.mlp.gate.weight", engine::Shard::replicated())
        .add("*.mlp.shared_expert_gate.weight", engine::Shard::replicated());
  }
  const engine::ShardingRules llama = engine::ShardingRules::llama(dims);  // named: rules() is a view into it
  for (const auto& [pattern, shard] : llama.rules()) rules.add(pattern, shard);
  return rules.otherwise(engine::Shard::replicated());
}

engine::ShardingRules sharding_rules(const std::vector<std::string>& shard_rules, ShardingFamily family,
                                     const engine::LlamaSharding& dims) {
  engine::ShardingRules rules;
  for (const std::string& text : shard_rules) {
    auto [pattern, shard] = parse_shard_rule(text);
    rules.add(std::move(pattern), std::move(shard));
  }
  const engine::ShardingRules preset = family_rules(family, dims);
  for (const auto& [pattern, shard] : preset.rules()) rules.add(pattern, shard);
  return rules.otherwise(engine::Shard::replicated());
}

LlamaDims llama_dims(const io::Catalog& catalog, const HeadOptions& given, const std::string& path,
                     const HeadOptionNames& names) {
  LlamaDims out;
  const io::TensorInfo* q = first_matching(catalog, "*.self_attn.q_proj.weight");
  const io::TensorInfo* k = first_matching(catalog, "*.self_attn.k_proj.weight");
  const io::TensorInfo* qkv = first_matching(catalog, "*.self_attn.qkv_proj.weight");
  const io::TensorInfo* o = first_matching(catalog, "*.self_attn.o_proj.weight");
  const bool attention = q || k || qkv || o;
  std::uint64_t head_dim = given.head_dim;
  out.source = "options";
  if (qkv && (given.heads == 0 || given.kv_heads == 0))
    bad(fmt::format(
        "{}: tensor '{}' is a fused QKV projection: give {} and {}, so that each rank gets whole heads of q, k and v",
        path, qkv->name, names.heads, names.kv_heads));
  if (head_dim == 0 && given.heads != 0) {
    // The query rows are heads × head_dim (a fused QKV: heads + 2 × kv_heads of them).
    const io::TensorInfo* t = qkv ? qkv : q;
    const std::uint64_t units = qkv ? given.heads + 2 * given.kv_heads : given.heads;
    if (!t) bad(fmt::format("{}: {} has no *.self_attn.q_proj.weight or qkv_proj tensor to divide", names.heads, path));
    if (t->shape[0] % units != 0)
      bad(fmt::format("{}: tensor '{}' of {} has {} rows, not a multiple of {} heads", names.heads, t->name, path,
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
    bad(fmt::format(
        "{}: cannot tell the attention heads' size of this checkpoint (it was not written by eredu gen): give {} "
        "(query heads) or {}",
        path, names.heads, names.head_dim));
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

}  // namespace eredu::app
