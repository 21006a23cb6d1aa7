#pragma once
/// \file
/// bindings_from_recipe_set: lowers one atomic recipe publication into runtime bindings.

#include <vector>

#include "eredu/engine/description/atomic_recipe_set.hpp"
#include "eredu/engine/description/weight_binding.hpp"
#include "eredu/io/formats/catalog.hpp"

namespace eredu::engine {

/// Consumes `set` into owner bindings (one from_recipe binding per output, declaring the bytes
/// its recipe infers to) followed by its aliases (declaring their owner's bytes), each in
/// insertion order, and validates them as a WeightBindingPlan. Recipes are moved, never
/// cloned. Throws RecipeError from inference (ErrorContext::parameter names the output), or
/// DeclarationError (alias_unknown_owner, alias_chain, duplicate_binding, invalid_parameter_id).
std::vector<WeightBinding> bindings_from_recipe_set(const io::Catalog& catalog, AtomicRecipeSet set);

}  // namespace eredu::engine
