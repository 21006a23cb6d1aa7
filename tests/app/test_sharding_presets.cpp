// The model-family sharding presets (app/sharding_presets.hpp): the PATTERN=SPEC parser's typed
// errors, the llama and moe families' rules, a mixture-of-experts checkpoint written to disk
// planned for two ranks, and the attention dims with each front end's spelling in its messages.
#include <catch2/catch.hpp>
#include <cstddef>
#include <string>
#include <vector>

#include "eredu/app/sharding_presets.hpp"
#include "eredu/core/error.hpp"
#include "eredu/io/formats/open_catalog.hpp"
#include "eredu/synth/safetensors_writer.hpp"
#include "support/temp_dir.hpp"

using namespace eredu;
using engine::Shard;

namespace {

/// The detail of the Error(invalid_argument) `f` throws ("" when it throws none, or another).
template <class F>
std::string invalid_argument(F f) {
  try {
    f();
  } catch (const Error& e) {
    return e.kind() == errc::invalid_argument ? e.detail() : std::string("another kind: ") + e.what();
  }
  return {};
}

// A Llama-shaped catalog in memory: q/k/o projections of `heads` / `kv_heads` heads of 64, BF16.
io::Catalog attention_catalog(std::uint64_t heads, std::uint64_t kv_heads) {
  io::Catalog catalog;
  catalog.add_file({.path = "m.safetensors", .format = "safetensors"});
  const std::uint64_t hidden = heads * 64;
  std::uint64_t offset = 0;
  auto add = [&](std::string name, Shape shape) {
    const std::uint64_t n = shape[0] * shape[1] * 2;
    catalog.add_tensor({std::move(name), DType::BF16, shape, 0, offset, n});
    offset += n;
  };
  add("model.layers.0.self_attn.q_proj.weight", {hidden, hidden});
  add("model.layers.0.self_attn.k_proj.weight", {kv_heads * 64, hidden});
  add("model.layers.0.self_attn.o_proj.weight", {hidden, hidden});
  return catalog;
}

}  // namespace

TEST_CASE("sharding presets – PATTERN=SPEC: every spec, and a typed error quoting the rule", "[app][sharding]") {
  CHECK(app::parse_shard_rule("*.norm.weight=replicated") ==
        std::pair{std::string("*.norm.weight"), Shard::replicated()});
  CHECK(app::parse_shard_rule("a=column:64").second == Shard::column_parallel(64));
  CHECK(app::parse_shard_rule("a=row").second == Shard::row_parallel());
  CHECK(app::parse_shard_rule("a=split:1:8").second == Shard::split(1, 8));
  CHECK(app::parse_shard_rule("a=fused:0:3:64").second == Shard::fused_even(0, 3, 64));
  CHECK(app::parse_shard_rule("x=y=row").first == "x=y");
  CHECK(invalid_argument([] { app::parse_shard_rule("a"); }) ==
        "'a' is not PATTERN=SPEC (e.g. '*.mlp.*_proj.weight=column')");
  CHECK(invalid_argument([] { app::parse_shard_rule("a=split:+1"); }) ==
        "'a=split:+1': DIM '+1' is not an integer from 0 to 4294967296");
  CHECK(invalid_argument([] { app::parse_shard_rule("a=row:4294967297"); }) ==
        "'a=row:4294967297': GRANULE '4294967297' is not an integer from 1 to 4294967296");
  CHECK_THAT(invalid_argument([] { app::parse_shard_rule("a=diagonal"); }),
             Catch::StartsWith("'a=diagonal': SPEC is replicated, ") && Catch::EndsWith("fused:DIM:PARTS[:GRANULE]"));
}

TEST_CASE("sharding presets – families by name, llama is engine's Llama rules", "[app][sharding]") {
  CHECK(app::parse_sharding_family("llama") == app::ShardingFamily::llama);
  CHECK(app::parse_sharding_family("moe") == app::ShardingFamily::moe);
  CHECK(invalid_argument([] { app::parse_sharding_family("mixtral"); }) ==
        "family must be llama or moe, not 'mixtral'");
  const engine::LlamaSharding dims{.head_dim = 64, .heads = 4, .kv_heads = 2};
  const engine::ShardingRules llama = app::family_rules(app::ShardingFamily::llama, dims);
  CHECK(llama.rules() == engine::ShardingRules::llama(dims).rules());
  // Llama's rules leave experts replicated: what the moe family is for.
  CHECK(llama.find("model.layers.0.block_sparse_moe.experts.3.w1.weight") == Shard::replicated());
}

TEST_CASE("sharding presets – moe: experts divided as the dense MLP, routers replicated, Llama's rules kept",
          "[app][sharding]") {
  const engine::ShardingRules moe =
      app::family_rules(app::ShardingFamily::moe, {.head_dim = 64, .heads = 4, .kv_heads = 2});
  const std::string layer = "model.layers.5.";
  // Mixtral: w1 and w3 are gate and up, w2 down.
  CHECK(moe.find(layer + "block_sparse_moe.experts.7.w1.weight") == Shard::column_parallel());
  CHECK(moe.find(layer + "block_sparse_moe.experts.7.w3.weight") == Shard::column_parallel());
  CHECK(moe.find(layer + "block_sparse_moe.experts.7.w2.weight") == Shard::row_parallel());
  CHECK(moe.find(layer + "block_sparse_moe.gate.weight") == Shard::replicated());
  // Qwen-MoE, DeepSeek: experts and shared experts, their routers.
  CHECK(moe.find(layer + "mlp.experts.0.gate_proj.weight") == Shard::column_parallel());
  CHECK(moe.find(layer + "mlp.experts.12.up_proj.weight") == Shard::column_parallel());
  CHECK(moe.find(layer + "mlp.experts.12.down_proj.weight") == Shard::row_parallel());
  CHECK(moe.find(layer + "mlp.shared_expert.down_proj.weight") == Shard::row_parallel());
  CHECK(moe.find(layer + "mlp.shared_experts.gate_proj.weight") == Shard::column_parallel());
  CHECK(moe.find(layer + "mlp.gate.weight") == Shard::replicated());
  CHECK(moe.find(layer + "mlp.shared_expert_gate.weight") == Shard::replicated());
  // The Llama rules still hold for attention, dense MLPs, embedding and head.
  CHECK(moe.find(layer + "self_attn.q_proj.weight") == Shard::column_parallel(64));
  CHECK(moe.find(layer + "self_attn.o_proj.weight") == Shard::row_parallel(64));
  CHECK(moe.find(layer + "mlp.down_proj.weight") == Shard::row_parallel());
  CHECK(moe.find("model.embed_tokens.weight") == Shard::split(0));
  CHECK(moe.find("model.norm.weight") == Shard::replicated());
}

TEST_CASE("sharding presets – a written Mixtral-named checkpoint planned for two ranks by the moe family",
          "[app][sharding]") {
  test::TempDir dir;
  const std::vector<synth::TensorSpec> specs{
      {"model.layers.0.self_attn.q_proj.weight", DType::F32, {128, 128}},
      {"model.layers.0.block_sparse_moe.gate.weight", DType::F32, {4, 128}},
      {"model.layers.0.block_sparse_moe.experts.0.w1.weight", DType::F32, {256, 128}},
      {"model.layers.0.block_sparse_moe.experts.0.w2.weight", DType::F32, {128, 256}},
      {"model.layers.0.block_sparse_moe.experts.1.w3.weight", DType::F32, {256, 128}},
  };
  std::vector<std::vector<std::byte>> bytes;
  std::vector<std::span<const std::byte>> data;
  for (const synth::TensorSpec& s : specs) bytes.emplace_back(synth::tensor_nbytes(s));
  for (const auto& b : bytes) data.emplace_back(b);
  synth::write_safetensors(dir / "moe.safetensors", specs, data);
  const io::Catalog catalog = io::open_catalog(dir / "moe.safetensors");

  const app::LlamaDims dims = app::llama_dims(catalog, {.heads = 2}, "moe", app::cli_head_option_names);
  CHECK((dims.sharding.head_dim == 64 && dims.source == "options"));
  // A --shard rule before the family's wins.
  const engine::ShardingRules rules =
      app::sharding_rules({"*.experts.1.w3.weight=replicated"}, app::ShardingFamily::moe, dims.sharding);
  const engine::TensorParallelPlan plan = engine::plan_tensor_parallel(catalog, rules, 1, 2);
  REQUIRE(plan.tensors.size() == specs.size());
  CHECK(plan.tensors[0].local_shape == Shape{64, 128});   // one of the two heads
  CHECK(plan.tensors[1].local_shape == Shape{4, 128});    // the router, whole
  CHECK(plan.tensors[2].local_shape == Shape{128, 128});  // w1: half the expert's rows
  CHECK(plan.tensors[3].local_shape == Shape{128, 128});  // w2: half its columns
  CHECK(plan.tensors[4].local_shape == Shape{256, 128});  // the --shard rule: replicated
  CHECK(plan.tensors[2].pieces.size() == 1);
}

TEST_CASE("sharding presets – attention dims: messages spell the options as the front end does", "[app][sharding]") {
  const app::LlamaDims d = app::llama_dims(attention_catalog(4, 2), {.head_dim = 32}, "m", app::cli_head_option_names);
  CHECK((d.sharding.heads == 8 && d.sharding.kv_heads == 4 && d.source == "options"));
  CHECK(invalid_argument([] { app::llama_dims(attention_catalog(4, 2), {}, "m", app::cli_head_option_names); }) ==
        "m: cannot tell the attention heads' size of this checkpoint (it was not written by eredu gen): give --heads "
        "(query heads) or --head-dim");
  CHECK_THAT(invalid_argument([] { app::llama_dims(attention_catalog(4, 2), {}, "m", app::python_head_option_names); }),
             Catch::EndsWith("give heads (query heads) or head_dim"));
  CHECK(invalid_argument([] {
          app::llama_dims(attention_catalog(4, 2), {.heads = 3}, "m", app::python_head_option_names);
        }) == "heads: tensor 'model.layers.0.self_attn.q_proj.weight' of m has 256 rows, not a multiple of 3 heads");
}
