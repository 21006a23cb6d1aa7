#include "model.hpp"

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include <cmath>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include "eredu/core/error.hpp"
#include "eredu/engine/description/bindings_from_recipe_set.hpp"

namespace eredu::example {
namespace {

using R = engine::DerivedWeightRecipe;

/// Adds the recipes of checkpoint layer `layer` as Block's slots under `prefix`: the runtime
/// names on the left, the checkpoint keys they come from on the right.
void add_block_recipes(engine::AtomicRecipeSet& set, const std::string& prefix, std::uint64_t layer) {
  auto src = [layer](std::string_view leaf) { return R::source(fmt::format("model.layers.{}.{}", layer, leaf)); };
  auto f32 = [](const R& r) { return R::cast(r, DType::F32); };
  auto add = [&](std::string_view slot, const R& recipe) { set.add_output(engine::join_name(prefix, slot), recipe); };

  add("attn.norm.weight", f32(src("input_layernorm.weight")));
  add("attn.qkv.weight",
      f32(R::concat({src("self_attn.q_proj.weight"), src("self_attn.k_proj.weight"), src("self_attn.v_proj.weight")},
                    0)));
  add("attn.o.weight", f32(src("self_attn.o_proj.weight")));
  add("mlp.norm.weight", f32(src("post_attention_layernorm.weight")));
  add("mlp.gate_up.weight", f32(R::concat({src("mlp.gate_proj.weight"), src("mlp.up_proj.weight")}, 0)));
  add("mlp.down.weight", f32(src("mlp.down_proj.weight")));
}

/// `rows` × `cols` row-major `w` times `x`, rows in parallel (each row is one dot()).
std::vector<float> matvec(const cpu::Parameter& w, std::span<const float> x) {
  const std::size_t rows = w.shape.at(0), cols = w.shape.at(1);
  const float* data = w.value.as<float>().data();
  std::vector<float> y(rows);
  tbb::parallel_for(tbb::blocked_range<std::size_t>(0, rows), [&](const tbb::blocked_range<std::size_t>& r) {
    for (std::size_t i = r.begin(); i != r.end(); ++i) y[i] = dot(data + i * cols, x.data(), cols);
  });
  return y;
}

}  // namespace

ModelConfig ModelConfig::from_catalog(const io::Catalog& catalog) {
  ModelConfig c;
  const io::TensorInfo& embed = catalog.at("model.embed_tokens.weight");
  if (embed.shape.size() != 2)
    throw Error(errc::invalid_argument, {.tensor = embed.name},
                fmt::format("the embedding has rank {}, expected 2", embed.shape.size()));
  c.vocab = embed.shape[0];
  c.hidden = embed.shape[1];
  c.embed_dtype = embed.dtype;
  while (catalog.find(fmt::format("model.layers.{}.input_layernorm.weight", c.layers))) ++c.layers;
  if (c.layers == 0)
    throw Error(errc::invalid_argument, {}, "no model.layers.0.input_layernorm.weight: not a Llama-shaped checkpoint");
  c.kv = catalog.at("model.layers.0.self_attn.k_proj.weight").shape.at(0);
  c.intermediate = catalog.at("model.layers.0.mlp.gate_proj.weight").shape.at(0);
  c.tied = catalog.find("lm_head.weight") == nullptr;
  return c;
}

Block::Block(const ModelConfig& c)
    : attn_norm(DType::F32, {c.hidden}),
      qkv(DType::F32, {c.hidden + 2 * c.kv, c.hidden}),
      o(DType::F32, {c.hidden, c.hidden}),
      mlp_norm(DType::F32, {c.hidden}),
      gate_up(DType::F32, {2 * c.intermediate, c.hidden}),
      down(DType::F32, {c.hidden, c.intermediate}) {}

Model::Model(const ModelConfig& c)
    : embed(c.embed_dtype, {c.vocab, c.hidden}),
      layers(c.layers, Block(c)),
      norm(DType::F32, {c.hidden}),
      lm_head(c.embed_dtype, {c.vocab, c.hidden}) {}

BlockOutput Block::forward(std::span<const float> x) const {
  BlockOutput out;
  out.qkv = matvec(qkv, rms_norm(x, attn_norm.value.as<float>()));
  const std::vector<float> gu = matvec(gate_up, rms_norm(x, mlp_norm.value.as<float>()));
  const std::size_t inter = gu.size() / 2;  // rows [0, inter) are gate, [inter, 2 inter) up
  std::vector<float> act(inter);
  for (std::size_t i = 0; i < inter; ++i) act[i] = silu(gu[i]) * gu[inter + i];
  out.mlp = matvec(down, act);
  return out;
}

engine::WeightBindingPlan block_plan(const io::Catalog& catalog, std::uint64_t layer) {
  engine::AtomicRecipeSet set;
  add_block_recipes(set, "", layer);
  return engine::WeightBindingPlan(engine::bindings_from_recipe_set(catalog, std::move(set)));
}

engine::WeightBindingPlan model_plan(const io::Catalog& catalog, const ModelConfig& config) {
  engine::AtomicRecipeSet set;
  set.add_output("embed.weight", R::source("model.embed_tokens.weight"));  // dtype kept: no cast
  for (std::uint64_t i = 0; i < config.layers; ++i) add_block_recipes(set, fmt::format("layers.{}", i), i);
  set.add_output("norm.weight", R::cast(R::source("model.norm.weight"), DType::F32));
  if (config.tied)
    set.add_alias("lm_head.weight", "embed.weight");  // shares embed's storage: never read twice
  else
    set.add_output("lm_head.weight", R::source("lm_head.weight"));
  return engine::WeightBindingPlan(engine::bindings_from_recipe_set(catalog, std::move(set)));
}

float dot(const float* a, const float* b, std::size_t n) noexcept {
  float s = 0;
  for (std::size_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

std::vector<float> rms_norm(std::span<const float> x, std::span<const float> weight) {
  const float inv = 1.0f / std::sqrt(dot(x.data(), x.data(), x.size()) / static_cast<float>(x.size()) + rms_eps);
  std::vector<float> y(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) y[i] = x[i] * inv * weight[i];
  return y;
}

float silu(float x) noexcept { return x / (1.0f + std::exp(-x)); }

}  // namespace eredu::example
