#include "eredu/engine/description/weight_binding.hpp"

#include <stdexcept>

#include <fmt/format.h>

namespace eredu::engine {
namespace {

const char* variant_name(bool alias, bool recipe) noexcept {
  if (alias) return "an alias";
  return recipe ? "a recipe binding" : "a plain tensor binding";
}

}  // namespace

WeightBinding WeightBinding::tensor(std::string name, std::string checkpoint_key, Selection selection,
                                    std::uint64_t expected_bytes) {
  return WeightBinding(ParameterId(std::move(name)), TensorSource{std::move(checkpoint_key), std::move(selection)},
                       expected_bytes);
}

WeightBinding WeightBinding::from_recipe(std::string name, DerivedWeightRecipe recipe, std::uint64_t expected_bytes) {
  return WeightBinding(ParameterId(std::move(name)), std::move(recipe), expected_bytes);
}

WeightBinding WeightBinding::alias(std::string name, std::string owner, std::uint64_t expected_bytes) {
  ParameterId id(std::move(name));
  return WeightBinding(std::move(id), ParameterId(std::move(owner)), expected_bytes);
}

const ParameterId& WeightBinding::owner_id() const {
  if (const auto* owner = std::get_if<ParameterId>(&source_)) return *owner;
  throw std::logic_error(
      fmt::format("WeightBinding::owner() called on {} ('{}')", variant_name(false, recipe() != nullptr), name()));
}

const WeightBinding::TensorSource& WeightBinding::expect_tensor(const char* accessor) const {
  if (const auto* t = std::get_if<TensorSource>(&source_)) return *t;
  throw std::logic_error(fmt::format("WeightBinding::{}() called on {} ('{}')", accessor,
                                     variant_name(is_alias(), recipe() != nullptr), name()));
}

const std::string& WeightBinding::checkpoint_key() const { return expect_tensor("checkpoint_key").key; }

const Selection& WeightBinding::selection() const { return expect_tensor("selection").selection; }

DerivedWeightRecipe WeightBinding::source_recipe() const {
  if (const auto* t = std::get_if<TensorSource>(&source_)) return DerivedWeightRecipe::source(t->key, t->selection);
  if (const auto* r = recipe()) return *r;
  throw std::logic_error(fmt::format(
      "WeightBinding::source_recipe() called on alias '{}' of '{}': an alias has no source", name(), owner()));
}

}  // namespace eredu::engine
