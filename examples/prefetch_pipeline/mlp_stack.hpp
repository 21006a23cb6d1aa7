#pragma once
/// \file
/// The prefetch-pipeline example's model: a stack of transformer MLP blocks, one block per
/// pipeline unit, for a model too large to keep resident.
///
/// Each block computes, for every token vector x of a batch,
///   x += down · (silu(gate · xn) ⊙ (up · xn)),   xn = rmsnorm(x) ⊙ norm,
/// with the weights kept in the checkpoint's dtype (BF16 or F32) and widened to f32 inside
/// the dot products, rows in parallel with oneTBB. The weights are the Llama names
/// `model.layers.N.post_attention_layernorm.weight` and `model.layers.N.mlp.{gate,up,down}_proj.weight`,
/// so the same code runs on an `eredu gen` checkpoint (its attention weights are not read)
/// or on the MLP-only checkpoint write_stack_checkpoint generates.
///
/// Shared by examples/prefetch_pipeline and bench/pipeline. Results are bit-identical from
/// run to run: each output element is one dot product in a fixed order, whichever thread
/// computes it.

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "eredu/core/dtype.hpp"
#include "eredu/cpu/parameter.hpp"
#include "eredu/engine/description/parameterized.hpp"
#include "eredu/engine/serving/prefetch_pipeline.hpp"
#include "eredu/io/formats/catalog.hpp"

namespace eredu::example {

/// Sizes of an MLP stack, and the dtype its weights are stored (and computed) in.
struct StackConfig {
  std::uint64_t hidden = 0;        ///< token vector size
  std::uint64_t intermediate = 0;  ///< MLP inner size
  std::uint64_t layers = 0;        ///< blocks
  DType dtype = DType::BF16;       ///< BF16 or F32

  /// Reads the sizes from `model.layers.N.mlp.*` tensors. Throws eredu::Error
  /// (tensor_not_found, invalid_argument) when the checkpoint has no such stack or its
  /// weights are not BF16 or F32.
  static StackConfig from_catalog(const io::Catalog& catalog);

  /// Bytes of one block's weights (norm, gate, up, down).
  std::uint64_t layer_bytes() const;
};

/// "model.layers.<layer>.<leaf>".
std::string layer_key(std::uint64_t layer, std::string_view leaf);

/// Writes a single-file MLP-only checkpoint for `config` at `path`, values from
/// eredu::synth (weights around 0 with σ ≈ 0.02, norms around 1). Throws eredu::Error.
void write_stack_checkpoint(const std::filesystem::path& path, const StackConfig& config, std::uint64_t seed);

/// One MLP block: its four slots, in the checkpoint's dtype.
class MlpLayer {
 public:
  cpu::Parameter norm;  ///< [h]         norm.weight
  cpu::Parameter gate;  ///< [inter, h]  gate.weight
  cpu::Parameter up;    ///< [inter, h]  up.weight
  cpu::Parameter down;  ///< [h, inter]  down.weight

  /// Empty slots: assign an MlpLayer(config) before loading.
  MlpLayer() = default;
  /// Slots shaped for `config`, unbound.
  explicit MlpLayer(const StackConfig& config);

  /// Visits the slots as join_name(prefix, "gate.weight") and so on.
  void visit_parameters(engine::ParameterVisitor<cpu::Parameter>& v, const std::string& prefix) const {
    visit(*this, v, prefix);
  }
  /// As visit_parameters, mutably.
  void visit_parameters_mut(engine::ParameterVisitorMut<cpu::Parameter>& v, const std::string& prefix) {
    visit(*this, v, prefix);
  }

 private:
  template <class Self, class V>
  static void visit(Self& self, V& v, const std::string& prefix) {
    slot(v, engine::join_name(prefix, "norm.weight"), self.norm);
    slot(v, engine::join_name(prefix, "gate.weight"), self.gate);
    slot(v, engine::join_name(prefix, "up.weight"), self.up);
    slot(v, engine::join_name(prefix, "down.weight"), self.down);
  }
  static void slot(engine::ParameterVisitor<cpu::Parameter>& v, const std::string& id, const cpu::Parameter& p) {
    v.visit({engine::ParameterId(id), p.dtype, p.shape}, p);
  }
  static void slot(engine::ParameterVisitorMut<cpu::Parameter>& v, const std::string& id, cpu::Parameter& p) {
    v.visit_mut({engine::ParameterId(id), p.dtype, p.shape}, p);
  }
};

static_assert(engine::Parameterized<MlpLayer, cpu::Parameter>);

/// The pipeline unit that loads checkpoint block `layer` into a standalone MlpLayer (named
/// "layers.<layer>"). Plain reads, dtype kept: each weight is read straight into its tensor.
engine::PipelineUnit layer_unit(const io::Catalog& catalog, std::uint64_t layer);

/// A batch of token vectors, `tokens` × `hidden`, row-major: the state that flows through
/// the stack. More tokens mean more compute per byte of weights (each weight row is read
/// from memory once per block and used for every token).
struct Activations {
  std::size_t tokens = 0;  ///< batch size
  std::size_t hidden = 0;  ///< vector size
  std::vector<float> x;    ///< tokens × hidden

  /// A deterministic batch (a different smooth vector per token).
  static Activations initial(std::size_t tokens, std::size_t hidden);
};

/// Applies `layer` to every token of `a` in place. Uses tbb::parallel_for: call it inside a
/// cpu::Executor's arena (Executor::submit), never on the event loop.
void apply_layer(const MlpLayer& layer, Activations& a);

}  // namespace eredu::example
