#pragma once
/// \file
/// The request of the hot_swap example: a forward pass over the weights of one model
/// version, and the independent path to what it must answer.
///
/// The forward pass reads its weights through `Weights`, a set of spans. A served request
/// takes them from a loaded `Model` (Weights::of); the reference takes them from
/// `ReferenceWeights`, rebuilt from the checkpoint file with plain reads, scalar BF16→F32
/// widening and hand-written concatenation — none of the engine's recipes. Both run the
/// same arithmetic, so a correct version answers bit for bit what the reference does.

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "../load_unit/model.hpp"
#include "eredu/io/formats/catalog.hpp"

namespace eredu::example {

/// One block's weights, F32, in the Block's fused layouts.
struct BlockWeights {
  std::span<const float> attn_norm;  ///< [h]
  std::span<const float> qkv;        ///< [h + 2 kv, h]: q rows, then k, then v
  std::span<const float> o;          ///< [h, h]
  std::span<const float> mlp_norm;   ///< [h]
  std::span<const float> gate_up;    ///< [2 inter, h]: gate rows, then up
  std::span<const float> down;       ///< [h, inter]
};

/// Every weight a request reads, as views.
struct Weights {
  std::size_t hidden = 0;                ///< h
  std::span<const std::uint16_t> embed;  ///< BF16 [vocab, h]
  std::vector<BlockWeights> layers;      ///< one per decoder layer
  std::span<const float> norm;           ///< [h]

  /// Views of a loaded model's tensors (valid while the model is).
  static Weights of(const Model& model);
};

/// The forward pass of token `token`: x = embed[token]; per block, x += o · q(rmsnorm(x))
/// (a stand-in for attention) and x += down · (silu(gate) ⊙ up)(rmsnorm(x)); then the
/// final rmsnorm. About 2.5 M multiply-adds for the example's checkpoints.
std::vector<float> forward(const Weights& w, std::uint32_t token);

/// SHA-256 of every weight's bytes, in a fixed order: which version answered.
std::string weight_tag(const Weights& w);

/// FNV-1a over the floats' bytes: a response's output, compared exactly.
std::uint64_t hash_floats(std::span<const float> v);

/// The stored bytes of tensor `name`, read with an ifstream from its file.
std::vector<std::byte> read_bytes(const io::Catalog& catalog, const std::string& name);

/// Weights rebuilt from the checkpoint files alone (see file comment). BF16 checkpoints only.
class ReferenceWeights {
 public:
  /// Reads and converts every tensor of `catalog` the model uses.
  ReferenceWeights(const io::Catalog& catalog, const ModelConfig& config);
  /// Views of the rebuilt weights.
  Weights view() const;

 private:
  struct Block {
    std::vector<float> attn_norm, qkv, o, mlp_norm, gate_up, down;
  };
  std::size_t hidden_ = 0;
  std::vector<std::uint16_t> embed_;
  std::vector<Block> layers_;
  std::vector<float> norm_;
};

}  // namespace eredu::example
