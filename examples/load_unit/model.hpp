#pragma once
/// \file
/// The example's model: a Llama-shaped decoder whose runtime layout is not the checkpoint's.
///
/// The checkpoint stores q, k, v, gate and up as separate BF16 matrices; this model keeps
/// one fused F32 `attn.qkv.weight` and one fused F32 `mlp.gate_up.weight` per block, so its
/// parameter names and shapes differ from the checkpoint keys. Recipes say how each runtime
/// weight is derived (concat, then cast), and the engine checks them against the catalog
/// before it reads a byte.
///
/// Each module lists its slots once, in a private template over `Self&` that serves both the
/// const visitor (validation) and the mutable one (binding).

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "eredu/core/dtype.hpp"
#include "eredu/cpu/parameter.hpp"
#include "eredu/engine/description/parameterized.hpp"
#include "eredu/engine/description/weight_binding_plan.hpp"
#include "eredu/io/formats/catalog.hpp"

namespace eredu::example {

using Visitor = engine::ParameterVisitor<cpu::Parameter>;        ///< validates (const)
using VisitorMut = engine::ParameterVisitorMut<cpu::Parameter>;  ///< binds (mutable)

/// Sizes of a Llama-shaped checkpoint, read from its tensor shapes.
struct ModelConfig {
  std::uint64_t vocab = 0;         ///< rows of model.embed_tokens.weight
  std::uint64_t hidden = 0;        ///< hidden size
  std::uint64_t kv = 0;            ///< rows of k_proj and v_proj (key/value heads × head size)
  std::uint64_t intermediate = 0;  ///< MLP inner size
  std::uint64_t layers = 0;        ///< decoder layers
  DType embed_dtype{};             ///< the embedding's dtype, kept as stored
  bool tied = false;               ///< no lm_head.weight: the head is the embedding

  /// Reads the sizes from HF Llama tensor names (model.embed_tokens.weight,
  /// model.layers.N.*). Throws eredu::Error (tensor_not_found, invalid_argument).
  static ModelConfig from_catalog(const io::Catalog& catalog);
};

namespace detail {
inline void visit_slot(Visitor& v, const std::string& id, const cpu::Parameter& p) {
  v.visit({engine::ParameterId(id), p.dtype, p.shape}, p);
}
inline void visit_slot(VisitorMut& v, const std::string& id, cpu::Parameter& p) {
  v.visit_mut({engine::ParameterId(id), p.dtype, p.shape}, p);
}
template <class M>
void visit_child(Visitor& v, const std::string& prefix, const M& m) {
  m.visit_parameters(v, prefix);
}
template <class M>
void visit_child(VisitorMut& v, const std::string& prefix, M& m) {
  m.visit_parameters_mut(v, prefix);
}
}  // namespace detail

/// What a block computes for one token vector, for the forward check.
struct BlockOutput {
  std::vector<float> qkv;  ///< W_qkv · (rmsnorm(x) ⊙ attn_norm): q, then k, then v
  std::vector<float> mlp;  ///< down · (silu(gate · xn2) ⊙ (up · xn2)), xn2 = rmsnorm(x) ⊙ mlp_norm
};

/// One decoder block, every weight F32.
class Block {
 public:
  cpu::Parameter attn_norm;  ///< F32 [h]            attn.norm.weight
  cpu::Parameter qkv;        ///< F32 [h + 2 kv, h]  attn.qkv.weight
  cpu::Parameter o;          ///< F32 [h, h]         attn.o.weight
  cpu::Parameter mlp_norm;   ///< F32 [h]            mlp.norm.weight
  cpu::Parameter gate_up;    ///< F32 [2 inter, h]   mlp.gate_up.weight
  cpu::Parameter down;       ///< F32 [h, inter]     mlp.down.weight

  /// Empty slots (no shapes): assign a Block(config) before loading.
  Block() = default;
  /// Slots shaped for `config`, unbound.
  explicit Block(const ModelConfig& config);

  /// Visits the slots as join_name(prefix, "attn.qkv.weight") and so on.
  void visit_parameters(Visitor& v, const std::string& prefix) const { visit(*this, v, prefix); }
  /// As visit_parameters, mutably.
  void visit_parameters_mut(VisitorMut& v, const std::string& prefix) { visit(*this, v, prefix); }

  /// The block's attention projections and MLP for `x` (hidden size), with the bound weights.
  BlockOutput forward(std::span<const float> x) const;

 private:
  template <class Self, class V>
  static void visit(Self& self, V& v, const std::string& prefix) {
    detail::visit_slot(v, engine::join_name(prefix, "attn.norm.weight"), self.attn_norm);
    detail::visit_slot(v, engine::join_name(prefix, "attn.qkv.weight"), self.qkv);
    detail::visit_slot(v, engine::join_name(prefix, "attn.o.weight"), self.o);
    detail::visit_slot(v, engine::join_name(prefix, "mlp.norm.weight"), self.mlp_norm);
    detail::visit_slot(v, engine::join_name(prefix, "mlp.gate_up.weight"), self.gate_up);
    detail::visit_slot(v, engine::join_name(prefix, "mlp.down.weight"), self.down);
  }
};

/// The whole decoder: embedding (dtype kept), blocks visited as `layers.N`, final norm, head.
class Model {
 public:
  cpu::Parameter embed;       ///< [vocab, h], the checkpoint's dtype  embed.weight
  std::vector<Block> layers;  ///< the blocks                          layers.N.*
  cpu::Parameter norm;        ///< F32 [h]                             norm.weight
  cpu::Parameter lm_head;     ///< like embed; tied: the same storage  lm_head.weight

  /// No layers, empty slots: assign a Model(config) before loading.
  Model() = default;
  /// Slots shaped for `config`, unbound.
  explicit Model(const ModelConfig& config);

  /// Visits embed.weight, layers.0.*, …, norm.weight, lm_head.weight (under `prefix`).
  void visit_parameters(Visitor& v, const std::string& prefix) const { visit(*this, v, prefix); }
  /// As visit_parameters, mutably.
  void visit_parameters_mut(VisitorMut& v, const std::string& prefix) { visit(*this, v, prefix); }

 private:
  template <class Self, class V>
  static void visit(Self& self, V& v, const std::string& prefix) {
    detail::visit_slot(v, engine::join_name(prefix, "embed.weight"), self.embed);
    for (std::size_t i = 0; i < self.layers.size(); ++i)
      detail::visit_child(v, engine::join_name(prefix, "layers." + std::to_string(i)), self.layers[i]);
    detail::visit_slot(v, engine::join_name(prefix, "norm.weight"), self.norm);
    detail::visit_slot(v, engine::join_name(prefix, "lm_head.weight"), self.lm_head);
  }
};

static_assert(engine::Parameterized<Block, cpu::Parameter>);
static_assert(engine::Parameterized<Model, cpu::Parameter>);

/// The plan that loads checkpoint layer `layer` into a standalone Block (slots named
/// "attn.qkv.weight", …, read from "model.layers.<layer>.*"). Throws RecipeError /
/// DeclarationError if the checkpoint does not fit.
engine::WeightBindingPlan block_plan(const io::Catalog& catalog, std::uint64_t layer);

/// The plan that loads the whole checkpoint into a Model; lm_head.weight is an alias of
/// embed.weight when `config.tied`. Throws as block_plan.
engine::WeightBindingPlan model_plan(const io::Catalog& catalog, const ModelConfig& config);

/// ε of the RMS norms.
inline constexpr float rms_eps = 1e-6f;

/// Σ a[i]·b[i] in index order (both forward paths use it, so they round alike).
float dot(const float* a, const float* b, std::size_t n) noexcept;

/// x / sqrt(mean(x²) + rms_eps) ⊙ weight.
std::vector<float> rms_norm(std::span<const float> x, std::span<const float> weight);

/// x · sigmoid(x).
float silu(float x) noexcept;

}  // namespace eredu::example
