#pragma once
/// \file
/// Tensor-parallel sharding: how each checkpoint tensor is divided among the ranks of a
/// tensor-parallel group (a Shard), rules that choose it by name pattern (ShardingRules), and
/// the per-rank plan they give (plan_tensor_parallel): one WeightBinding per tensor whose
/// selection covers exactly this rank's part, so each rank reads only its own bytes — the io
/// layer reads only the bytes a selection needs.
///
/// A Llama-shaped checkpoint in a few lines (PyTorch weights are [out, in]):
/// \code
///   engine::ShardingRules rules;
///   rules.add("*.self_attn.[qkv]_proj.weight", engine::Shard::column_parallel(head_dim))  // whole heads
///       .add("*.self_attn.o_proj.weight", engine::Shard::row_parallel(head_dim))
///       .add("*.mlp.gate_proj.weight", engine::Shard::column_parallel())
///       .add("*.mlp.up_proj.weight", engine::Shard::column_parallel())
///       .add("*.mlp.down_proj.weight", engine::Shard::row_parallel())
///       .add("model.embed_tokens.weight", engine::Shard::split(0))                      // vocab-parallel
///       .add("lm_head.weight", engine::Shard::column_parallel())
///       .otherwise(engine::Shard::replicated());                                        // norms
///   engine::TensorParallelPlan plan = engine::plan_tensor_parallel(source->catalog(), rules, tp.rank(), tp.size());
///   auto model = engine::PlanModule<cpu::Parameter>::from_tensor_parallel(plan);
///   co_await engine::async_load<cpu::Backend>(model, *source, plan.bindings, context, asio::use_awaitable);
/// \endcode
/// (ShardingRules::llama builds these rules, and those of fused qkv_proj / gate_up_proj.)
///
/// How a dimension is divided: it is cut into units of `granule` indices (a head's rows for
/// attention, 1 otherwise); with U units and N ranks, rank r gets U / N units, and the first
/// U % N ranks one more (uneven sizes are allowed, contiguous, in rank order). When there are
/// fewer units than ranks and N is a multiple of U, each unit is replicated on N / U
/// consecutive ranks (grouped-query attention's key/value heads on more ranks than heads). A
/// fused tensor (a QKV projection stored as one tensor) concatenates parts along its dim; each
/// part is divided on its own and a rank's tensor is the concatenation of its piece of each, so
/// every rank holds the q, k and v rows of the same heads.
///
/// Replicated tensors are read whole by every rank (ReplicatedReads::every_rank), or, on
/// storage the ranks share, read once in total (ReplicatedReads::gather, the InstantTensor
/// scheme): each rank reads rows shard_range(rows, 1, rank, N) of dim 0 and the group
/// all-gathers them after the load (engine::async_gather_replicated, gather_replicated.hpp).
/// The rule: a replicated tensor is gathered when N > 1, it has a dim 0 that N divides, whole-byte
/// elements and at least one byte; every rank then reads exactly 1/N of it, the blocks have
/// one shape (what an all_gather needs: no padding, no copy) and the gather in rank order is
/// the tensor, bit for bit. Any other replicated tensor (a scalar, a dim 0 that N does not
/// divide, fewer rows than ranks, a sub-byte dtype) is read whole by every rank, as before,
/// and counted in TensorParallelPlan::whole_replicated_tensors. A gathered tensor's slot has
/// its full shape from the start (ShardedTensor::local_shape): the load materializes this
/// rank's rows and the gather binds the whole tensor, so no parameter ever changes shape.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "eredu/core/dtype.hpp"
#include "eredu/core/selection.hpp"
#include "eredu/core/shape.hpp"
#include "eredu/engine/description/weight_binding_plan.hpp"
#include "eredu/io/formats/catalog.hpp"

namespace eredu::engine {

/// How one tensor is divided among the ranks of a group (see file comment). A value type.
class Shard {
 public:
  /// What a shard does.
  enum class Kind {
    replicated,  ///< every rank holds the whole tensor
    split,       ///< one dimension is divided among the ranks
    fused,       ///< one dimension concatenates parts, each divided among the ranks
  };

  /// Every rank holds (and reads) the whole tensor.
  static Shard replicated();
  /// Dimension `dim` divided among the ranks in units of `granule` indices.
  static Shard split(std::size_t dim, std::uint64_t granule = 1);
  /// A column-parallel linear layer's weight [out, in] (or bias [out]): the output dim 0 split.
  static Shard column_parallel(std::uint64_t granule = 1) { return split(0, granule); }
  /// A row-parallel linear layer's weight [out, in]: the input dim 1 split (its output is then
  /// all-reduced).
  static Shard row_parallel(std::uint64_t granule = 1) { return split(1, granule); }
  /// Dimension `dim` is `parts` blocks of the given sizes (a fused QKV: {q rows, k rows, v
  /// rows}), each divided in units of `granule`; the sizes must add up to the dimension.
  static Shard fused(std::size_t dim, std::vector<std::uint64_t> parts, std::uint64_t granule = 1);
  /// Dimension `dim` is `count` blocks of equal size (a fused gate_up: 2).
  static Shard fused_even(std::size_t dim, std::size_t count, std::uint64_t granule = 1);

  /// What it does.
  Kind kind() const noexcept { return kind_; }
  /// The divided dimension (split, fused).
  std::size_t dim() const noexcept { return dim_; }
  /// Indices per unit along dim().
  std::uint64_t granule() const noexcept { return granule_; }
  /// The parts' sizes (fused with explicit sizes); empty otherwise.
  const std::vector<std::uint64_t>& parts() const noexcept { return parts_; }
  /// The number of equal parts (fused_even); 0 otherwise.
  std::size_t even_parts() const noexcept { return even_parts_; }
  /// "split(dim=1, granule=128)", for messages.
  std::string to_string() const;

  friend bool operator==(const Shard&, const Shard&) = default;

 private:
  Kind kind_ = Kind::replicated;
  std::size_t dim_ = 0;
  std::uint64_t granule_ = 1;
  std::vector<std::uint64_t> parts_;
  std::size_t even_parts_ = 0;
};

/// Indices [start, stop) of a dimension of `extent` indices that rank `rank` of `size` holds,
/// in units of `granule` (see file comment). Throws Error(invalid_argument), naming `what`,
/// when the extent is not a multiple of the granule, or the units cannot be divided (fewer
/// than the ranks, and not a divisor of their number).
Range shard_range(std::uint64_t extent, std::uint64_t granule, int rank, int size, std::string_view what);

/// True when `name` matches the glob `pattern` as a whole: `*` matches any run of characters
/// (dots included), `?` any one, `[abc]` / `[a-z]` one of a set, `[!abc]` one outside it;
/// every other character matches itself.
bool glob_match(std::string_view pattern, std::string_view name) noexcept;

/// The dimensions ShardingRules::llama needs.
struct LlamaSharding {
  std::uint64_t head_dim = 128;  ///< indices per attention head (the split unit of q/k/v/o)
  std::uint64_t heads = 0;       ///< query heads: with kv_heads, enables fused `qkv_proj` tensors
  std::uint64_t kv_heads = 0;    ///< key/value heads (grouped-query attention when < heads)
  bool vocab_parallel = true;    ///< split the embedding's vocabulary rows (else replicate it)
};

/// Sharding rules by tensor name (see file comment): the first pattern that matches a name
/// gives its Shard; names no pattern matches get the fallback.
class ShardingRules {
 public:
  /// Rules with no pattern, whose fallback is Shard::replicated().
  ShardingRules() = default;
  /// Appends a rule: tensors whose whole name matches the glob `pattern` get `shard`.
  ShardingRules& add(std::string pattern, Shard shard);
  /// What names no pattern matches get; nullopt makes them an error (a safeguard against a
  /// mistyped pattern silently replicating a large tensor).
  ShardingRules& otherwise(std::optional<Shard> shard);
  /// The shard for `name`, or nullopt when no rule matches and there is no fallback.
  std::optional<Shard> find(std::string_view name) const;
  /// The rules, in order.
  const std::vector<std::pair<std::string, Shard>>& rules() const noexcept { return rules_; }

  /// The rules of a Llama-shaped checkpoint with Hugging Face names: q/k/v column-parallel and
  /// o row-parallel in whole heads, gate/up column- and down row-parallel, a fused qkv_proj
  /// (when heads and kv_heads are given) and gate_up_proj per part, the embedding and lm_head
  /// split by vocabulary rows, everything else (norms) replicated.
  static ShardingRules llama(const LlamaSharding& dims);

 private:
  std::vector<std::pair<std::string, Shard>> rules_;
  std::optional<Shard> fallback_ = Shard::replicated();
};

/// How replicated tensors are read (see file comment).
enum class ReplicatedReads {
  every_rank,  ///< every rank reads every replicated tensor whole (N reads of each in total)
  gather,      ///< each rank reads 1/N of dim 0 and the group all-gathers (one read in total)
};

/// "read" or "gather" (the names of `eredu load --replicated`), for reports.
const char* replicated_reads_name(ReplicatedReads reads) noexcept;

/// One tensor as one rank holds it.
struct ShardedTensor {
  std::string key{};        ///< the checkpoint tensor
  std::string parameter{};  ///< the parameter it is bound to (the key, or "tensor_<i>" when invalid)
  Shard shard{};            ///< how it is divided
  DType dtype{};            ///< its dtype
  Shape full_shape{};       ///< the checkpoint's shape
  Shape local_shape{};      ///< the shape this rank binds (a gathered tensor: its full shape)
  /// The selections this rank reads, concatenated along shard.dim() (fused: one per part; a
  /// gathered tensor: this rank's rows of dim 0).
  std::vector<Selection> pieces{};
  std::uint64_t read_bytes = 0;  ///< the bytes those selections select
  /// Replicated, read in rows by each rank and all-gathered after the load (ReplicatedReads::gather).
  bool gathered = false;
};

/// What one rank of a tensor-parallel group loads (see plan_tensor_parallel).
struct TensorParallelPlan {
  int rank = 0;                                              ///< this rank
  int size = 1;                                              ///< ranks in the group
  std::vector<ShardedTensor> tensors{};                      ///< every tensor, in catalog order
  WeightBindingPlan bindings{std::vector<WeightBinding>{}};  ///< this rank's bindings, in catalog order
  std::uint64_t split_bytes = 0;                             ///< whole bytes of split and fused tensors
  std::uint64_t replicated_bytes = 0;                        ///< whole bytes of replicated tensors
  std::uint64_t read_bytes = 0;                              ///< bytes this rank's selections select (what it reads)
  std::uint64_t bound_bytes = 0;                             ///< bytes this rank's parameters hold once loaded
  ReplicatedReads replicated_reads = ReplicatedReads::every_rank;  ///< how replicated tensors are read
  std::uint64_t gathered_bytes = 0;  ///< whole bytes of the gathered tensors (part of replicated_bytes)
  /// Bytes of the gathered tensors this rank receives from the others (gathered_bytes less its own rows).
  std::uint64_t gather_received_bytes = 0;
  std::size_t gathered_tensors = 0;  ///< replicated tensors read in rows and all-gathered
  /// Replicated tensors every rank reads whole: all of them under every_rank; under gather,
  /// those the rule leaves out (see file comment).
  std::size_t whole_replicated_tensors = 0;
};

/// Divides every tensor of `catalog` by `rules` for rank `rank` of `size`, reading nothing.
/// Throws Error(invalid_argument) naming the tensor and the rule: a rank or size out of range,
/// no rule for a tensor (with no fallback), a dim outside the tensor, a dim that does not
/// divide (shard_range), fused parts that do not add up to the dim, or a sub-byte dtype split
/// other than along dim 0. Under ReplicatedReads::gather, replicated tensors are gathered
/// or read whole by the rule in the file comment; the default reads them whole on every rank.
TensorParallelPlan plan_tensor_parallel(const io::Catalog& catalog, const ShardingRules& rules, int rank, int size,
                                        ReplicatedReads replicated = ReplicatedReads::every_rank);

}  // namespace eredu::engine
