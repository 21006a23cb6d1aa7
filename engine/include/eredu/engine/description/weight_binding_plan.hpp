#pragma once
/// \file
/// WeightBindingPlan: a validated set of bindings for one atomic unit. Construction checks the
/// declarations alone (names, aliases, alias bytes); check() then infers every owner against
/// the catalog and compares declared bytes, before anything is read.

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "eredu/engine/description/recipe.hpp"
#include "eredu/engine/description/weight_binding.hpp"
#include "eredu/io/formats/catalog.hpp"

namespace eredu::engine {

/// A validated set of bindings: unique names, aliases point to owners, no alias chains, each
/// alias declares its owner's bytes. Owns its bindings.
class WeightBindingPlan {
 public:
  /// Validates and takes `bindings`. Throws DeclarationError: duplicate_binding (a name given
  /// twice), alias_unknown_owner, alias_chain (an alias of an alias, or of itself), byte_mismatch
  /// (an alias declaring other bytes than its owner).
  explicit WeightBindingPlan(std::vector<WeightBinding> bindings);

  /// Every binding, in the order given.
  const std::vector<WeightBinding>& bindings() const noexcept { return bindings_; }
  /// Moves the bindings out (the plan is left empty).
  std::vector<WeightBinding> into_bindings() && { return std::move(bindings_); }
  /// The non-alias bindings, in the order given.
  std::vector<const WeightBinding*> owners() const;
  /// (alias, owner) for every alias, in the order given.
  std::vector<std::pair<const WeightBinding*, const WeightBinding*>> aliases() const;

  /// Infers every owner against the catalog and compares its declared bytes, reading nothing.
  /// Throws RecipeError from inference (with ErrorContext::parameter set to the owner), or
  /// OrchestrationError(byte_mismatch): "parameter 'x': declares N bytes but its recipe produces
  /// M". Returns the inferred weights of the owners, in owners() order.
  std::vector<InferredWeight> check(const io::Catalog& catalog) const;
  /// Sum of the owners' inferred bytes (what materializing the plan allocates); runs check().
  /// Throws what check() throws, or eredu::Error(size_overflow) if the sum overflows.
  std::uint64_t owner_bytes(const io::Catalog& catalog) const;

 private:
  std::vector<WeightBinding> bindings_;
  std::vector<std::size_t> owners_;                           // indices into bindings_
  std::vector<std::pair<std::size_t, std::size_t>> aliases_;  // (alias, owner) indices
};

}  // namespace eredu::engine
