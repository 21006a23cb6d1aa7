#include "eredu/engine/description/bindings_from_recipe_set.hpp"

#include <cstdint>
#include <string>
#include <unordered_map>
#include <unordered_set>

#include <fmt/format.h>

#include "eredu/core/error.hpp"
#include "eredu/engine/description/weight_binding_plan.hpp"
#include "eredu/engine/orchestration/engine_error.hpp"

namespace eredu::engine {

std::vector<WeightBinding> bindings_from_recipe_set(const io::Catalog& catalog, AtomicRecipeSet set) {
  auto [outputs, aliases] = std::move(set).into_parts();
  std::vector<WeightBinding> bindings;
  bindings.reserve(outputs.size() + aliases.size());
  std::unordered_map<std::string, std::uint64_t> bytes;
  for (auto& [name, recipe] : outputs) {
    std::uint64_t produced = 0;
    try {
      produced = recipe.infer(catalog).bytes;
    } catch (const RecipeError& e) {
      ErrorContext context = e.context();
      context.parameter = name;
      throw RecipeError(e.kind(), std::move(context), e.detail());
    }
    bytes.emplace(name, produced);
    bindings.push_back(WeightBinding::from_recipe(std::move(name), std::move(recipe), produced));
  }
  std::unordered_set<std::string> alias_names;
  for (const auto& a : aliases) alias_names.insert(a.first);
  for (auto& [alias, owner] : aliases) {
    auto it = bytes.find(owner);
    if (it == bytes.end()) {
      // Name the precise fault here: the owner's bytes are unknown, so no plan can be built.
      if (alias_names.contains(owner)) {
        throw DeclarationError(
            errc::alias_chain, {.parameter = alias},
            fmt::format("alias of '{}', which is itself an alias; alias the output directly", owner));
      }
      throw DeclarationError(errc::alias_unknown_owner, {.parameter = alias},
                             fmt::format("alias of '{}', which is not an output of the recipe set", owner));
    }
    bindings.push_back(WeightBinding::alias(std::move(alias), std::move(owner), it->second));
  }
  // Validates the declarations once more as a whole, and hands the bindings back untouched.
  return WeightBindingPlan(std::move(bindings)).into_bindings();
}

}  // namespace eredu::engine
