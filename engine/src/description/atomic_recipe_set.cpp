#include "eredu/engine/description/atomic_recipe_set.hpp"

#include <fmt/format.h>

#include "eredu/core/error.hpp"
#include "eredu/engine/description/parameter_id.hpp"
#include "eredu/engine/orchestration/engine_error.hpp"

namespace eredu::engine {

void AtomicRecipeSet::claim(const std::string& name) {
  static_cast<void>(ParameterId(name));  // validates: throws invalid_parameter_id
  if (names_.contains(name)) {
    throw DeclarationError(errc::duplicate_binding, {.parameter = name},
                           "the recipe set already has an output or alias of this name");
  }
}

void AtomicRecipeSet::add_output(std::string name, DerivedWeightRecipe recipe) {
  claim(name);
  names_.insert(name);
  parts_.outputs.emplace_back(std::move(name), std::move(recipe));
}

void AtomicRecipeSet::add_alias(std::string alias, std::string owner) {
  claim(alias);
  static_cast<void>(ParameterId(owner));
  names_.insert(alias);
  parts_.aliases.emplace_back(std::move(alias), std::move(owner));
}

AtomicRecipeSet::Parts AtomicRecipeSet::into_parts() && {
  Parts out = std::move(parts_);
  // A moved-from vector is only "valid but unspecified": make the consumed state explicit.
  parts_.outputs.clear();
  parts_.aliases.clear();
  names_.clear();
  return out;
}

}  // namespace eredu::engine
