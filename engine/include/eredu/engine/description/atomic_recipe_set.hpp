#pragma once
/// \file
/// AtomicRecipeSet: one atomic publication of recipes for a unit (a layer, an expert): named
/// outputs plus aliases (tied weights) of those outputs, consumed whole by
/// bindings_from_recipe_set.

#include <cstddef>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include "eredu/engine/description/recipe.hpp"

namespace eredu::engine {

/// Named recipe outputs plus aliases (alias -> owner), in insertion order, consumed whole.
class AtomicRecipeSet {
 public:
  /// Adds output `name` (a valid ParameterId) produced by `recipe`. Throws
  /// DeclarationError(invalid_parameter_id) for a bad name, (duplicate_binding) if an output or
  /// alias already has that name.
  void add_output(std::string name, DerivedWeightRecipe recipe);
  /// Adds `alias` as another name for output `owner` (which may be added later; it is checked
  /// when the set is lowered). Same errors as add_output, for either name.
  void add_alias(std::string alias, std::string owner);

  /// Outputs and aliases, each in insertion order.
  struct Parts {
    std::vector<std::pair<std::string, DerivedWeightRecipe>> outputs{};  ///< (name, recipe)
    std::vector<std::pair<std::string, std::string>> aliases{};          ///< (alias, owner)
  };
  /// Moves everything out; the set is left empty (size() == 0).
  Parts into_parts() &&;

  /// Outputs plus aliases.
  std::size_t size() const noexcept { return parts_.outputs.size() + parts_.aliases.size(); }
  /// True when the set holds no output and no alias.
  bool empty() const noexcept { return size() == 0; }

 private:
  void claim(const std::string& name);

  Parts parts_;
  std::unordered_set<std::string> names_;  // outputs and aliases: one namespace
};

}  // namespace eredu::engine
