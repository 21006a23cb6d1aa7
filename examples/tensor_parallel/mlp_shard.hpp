#pragma once
/// \file
/// The tensor_parallel example's model: a stack of transformer MLP blocks whose weights are
/// divided among the ranks of a tensor-parallel group, and the single-process reference that
/// says what every step must answer.
///
/// Each block computes, for the token vector x,
///   x += down · (silu(gate · xn) ⊙ (up · xn)),   xn = rmsnorm(x) ⊙ norm,
/// then the stack ends with y = rmsnorm(x) ⊙ final_norm. On a rank, gate and up are
/// column-parallel (rows [start, stop) of [inter, hidden]: this rank's slice of the inner
/// activations, no communication), down is row-parallel (columns [start, stop) of
/// [hidden, inter]: a partial sum of every output element), and the partial outputs of the
/// ranks are summed by one all_reduce per block. Norms are replicated.
///
/// The names are Hugging Face Llama's (`model.layers.N.mlp.{gate,up,down}_proj.weight`,
/// `model.layers.N.post_attention_layernorm.weight`, `model.norm.weight`), so the same rules
/// would shard a real checkpoint's MLPs.

#include <cstdint>
#include <filesystem>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "eredu/cpu/parameter.hpp"
#include "eredu/engine/description/plan_module.hpp"
#include "eredu/engine/parallel/sharding.hpp"
#include "eredu/io/formats/catalog.hpp"
#include "eredu/synth/safetensors_writer.hpp"

namespace eredu::example {

/// The model loaded on one rank: its slots are its shard of every tensor.
using Module = engine::PlanModule<cpu::Parameter>;

/// Sizes of the stack (F32 weights).
struct StackDims {
  std::uint64_t hidden = 128;  ///< token vector size
  std::uint64_t inter = 384;   ///< MLP inner size: divisible by 2, 3 and 4 ranks
  std::uint64_t layers = 4;    ///< blocks
};

/// "model.layers.<layer>.<leaf>".
std::string layer_key(std::uint64_t layer, std::string_view leaf);

/// Every tensor of the checkpoint, in file order.
std::vector<synth::TensorSpec> stack_tensors(const StackDims& dims);

/// Writes a sharded checkpoint into `dir`: `shards` files plus model.safetensors.index.json,
/// values from eredu::synth's generator with `seed`, and the SHA-256 sidecar of the true
/// bytes (checksums.sha256.json, what a publisher ships with it). Throws eredu::Error.
void write_checkpoint(const std::filesystem::path& dir, const StackDims& dims, std::uint64_t seed,
                      std::uint32_t shards);

/// Overwrites four bytes of tensor `name` in its shard file under `dir`, leaving the sidecar
/// as it is: bit rot on one node's copy, which only the checksums can tell.
void corrupt_tensor(const std::filesystem::path& dir, const std::string& name);

/// The sharding of the stack: gate/up column-parallel, down row-parallel, the rest (norms)
/// replicated. (engine::ShardingRules::llama gives the same for these names.)
engine::ShardingRules stack_rules();

/// The token vector every step computes on.
std::vector<float> step_input(std::size_t hidden);

/// Sums a block's partial output over the tensor-parallel group, in place.
using ReducePartial = std::function<void(std::vector<float>& partial)>;

/// The forward pass on this rank's shard `m` (see file comment): `reduce` is called once per
/// block with this rank's partial output and must leave the group's sum in it.
std::vector<float> forward_shard(const Module& m, const StackDims& dims, std::span<const float> input,
                                 const ReducePartial& reduce);

/// The whole tensors of one version, read with plain file reads from its checkpoint.
class ReferenceStack {
 public:
  /// Reads every tensor of `catalog` (F32). Throws std::runtime_error when one cannot be read.
  ReferenceStack(const io::Catalog& catalog, const StackDims& dims);

  /// The forward pass of the whole model in one process, in f32, with each down projection's
  /// dot products cut where the ranks of a group of `ranks` cut them and the pieces summed in
  /// rank order (see README.md: why this gives every rank's result bit for bit at 2 ranks).
  std::vector<float> forward(std::span<const float> input, int ranks) const;

 private:
  struct Block {
    std::vector<float> norm, gate, up, down;
  };
  StackDims dims_;
  std::vector<Block> layers_;
  std::vector<float> norm_;
};

}  // namespace eredu::example
