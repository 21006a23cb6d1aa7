#pragma once
/// \file
/// DerivedWeightRecipe: how one runtime weight is derived from checkpoint tensors (a fused
/// QKV concat, a transposed matrix, a cast), as an immutable value tree whose dtype, shape and
/// byte size are inferred from the catalog alone, before any byte is read.
///
/// Nodes: `source(key, selection)` reads a tensor (or a per-dimension sub-range of it);
/// `slice`, `concat`, `permute`, `reshape` rearrange; `cast` converts elements. Copies share
/// their nodes, so recipes are cheap to pass around and to keep in bindings.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "eredu/core/dtype.hpp"
#include "eredu/core/float_formats.hpp"
#include "eredu/core/selection.hpp"
#include "eredu/core/shape.hpp"
#include "eredu/io/formats/catalog.hpp"

namespace eredu::engine {

/// dtype, shape and byte size a recipe produces, inferred without reading data.
struct InferredWeight {
  DType dtype{};            ///< element type of the result
  Shape shape{};            ///< shape of the result
  std::uint64_t bytes = 0;  ///< byte size of the result (checked against u64 overflow)
  friend bool operator==(const InferredWeight&, const InferredWeight&) = default;
};

/// True when a cast from -> to is supported: from == to; or both in {F16, BF16, F32}; or from
/// in {F8_E4M3, F8_E5M2, F8_E8M0} and to in {BF16, F32}. The rule is a property of the float
/// formats and is defined once, in core (eredu/core/float_formats.hpp); every backend's
/// supports_cast implements exactly this set.
using eredu::is_supported_cast;

/// An immutable recipe tree over checkpoint tensors. Factories never throw on content (only
/// allocation can fail): every rule is checked by infer(), which knows the catalog. Accessors
/// of another kind's fields (key() of a concat) throw std::logic_error.
class DerivedWeightRecipe {
 public:
  /// What a node does.
  enum class Kind {
    source,   ///< a checkpoint tensor, optionally a selection of it
    slice,    ///< indices [start, stop) of one dimension of the input
    concat,   ///< the inputs joined along one dimension
    permute,  ///< the input's dimensions reordered (result dim i = input dim order[i])
    reshape,  ///< the input's elements, row-major, with another shape of the same count
    cast,     ///< the input's elements converted to another dtype
  };

  /// The tensor `key` of the checkpoint, restricted to `selection`.
  static DerivedWeightRecipe source(std::string key, Selection selection = Selection::all());
  /// Indices `range` of dimension `dim` of `input`.
  static DerivedWeightRecipe slice(DerivedWeightRecipe input, std::size_t dim, Range range);
  /// `inputs` joined along `dim` (e.g. q, k, v along dim 0 for a fused QKV weight).
  static DerivedWeightRecipe concat(std::vector<DerivedWeightRecipe> inputs, std::size_t dim);
  /// `input` with its dimensions reordered: result dim i is input dim order[i].
  static DerivedWeightRecipe permute(DerivedWeightRecipe input, std::vector<std::size_t> order);
  /// Swaps the last two dimensions: permute {1, 0} for a matrix, {0, .., r-1, r-2} for rank r.
  /// The result is a permute node. When the input's rank is not known without the catalog (a
  /// whole-tensor source beneath), the node records "swap the last two" and order() reads
  /// {1, 0}; consumers resolve it for the actual rank with permutation(rank).
  static DerivedWeightRecipe transpose(DerivedWeightRecipe input);
  /// `input`'s elements, row-major, viewed with `shape` (same element count).
  static DerivedWeightRecipe reshape(DerivedWeightRecipe input, Shape shape);
  /// `input`'s elements converted to `dtype` (see is_supported_cast).
  static DerivedWeightRecipe cast(DerivedWeightRecipe input, DType dtype);

  // Copies share nodes. There is deliberately no move constructor: a "moved-from" recipe is a
  // copy, so no recipe is ever empty and every accessor is always valid.
  /// Shares `other`'s nodes.
  DerivedWeightRecipe(const DerivedWeightRecipe& other) = default;
  /// Shares `other`'s nodes.
  DerivedWeightRecipe& operator=(const DerivedWeightRecipe& other) = default;
  /// Releases this handle on the shared nodes.
  ~DerivedWeightRecipe() = default;

  /// What this node does.
  Kind kind() const noexcept;
  /// Checkpoint key (source).
  const std::string& key() const;
  /// Selection of the tensor (source).
  const Selection& selection() const;
  /// Dimension sliced or concatenated along (slice, concat).
  std::size_t dim() const;
  /// Indices kept along dim() (slice).
  Range range() const;
  /// Inputs: none (source), one (slice, permute, reshape, cast) or any number (concat).
  std::span<const DerivedWeightRecipe> inputs() const noexcept;
  /// The permutation (permute); for a transpose of not-yet-known rank, {1, 0} (see transpose).
  std::span<const std::size_t> order() const;
  /// True for a permute made by transpose() whose rank was not known statically.
  bool swaps_last_two() const noexcept;
  /// The permutation this node applies to an input of rank `rank` (permute): order() as a
  /// vector, or for swaps_last_two() the identity with the last two dimensions swapped.
  std::vector<std::size_t> permutation(std::size_t rank) const;
  /// Target shape (reshape).
  const Shape& shape() const;
  /// Target element type (cast).
  DType dtype() const;

  /// Infers dtype, shape and bytes from the catalog, reading nothing. Throws RecipeError
  /// (recipe_unknown_key, recipe_invalid_selection, recipe_rank_mismatch, recipe_shape_mismatch,
  /// recipe_bad_dim, recipe_dtype_mismatch, recipe_unsupported_cast, recipe_sub_byte_layout)
  /// whose message names the node's path ("concat[1] > source 'k'"), the tensor, its file and
  /// the offending numbers.
  InferredWeight infer(const io::Catalog& catalog) const;
  /// The checkpoint keys this recipe reads, in order of first use, without duplicates.
  std::vector<std::string> source_keys() const;
  /// "concat(dim=0, source('q'), source('k'), source('v'))", for messages and logs.
  std::string to_string() const;

  /// Structural equality (same kinds, fields and inputs); shared nodes compare equal at once.
  friend bool operator==(const DerivedWeightRecipe& a, const DerivedWeightRecipe& b) noexcept;
  /// True when both share the same root node (a copy of the other).
  bool shares_nodes_with(const DerivedWeightRecipe& other) const noexcept { return node_ == other.node_; }

 private:
  struct Node;
  explicit DerivedWeightRecipe(std::shared_ptr<const Node> node) noexcept : node_(std::move(node)) {}
  const Node& expect(Kind k, const char* accessor) const;

  std::shared_ptr<const Node> node_;  // never null
};

/// Human-readable name of a kind ("concat").
const char* recipe_kind_name(DerivedWeightRecipe::Kind kind) noexcept;

}  // namespace eredu::engine
