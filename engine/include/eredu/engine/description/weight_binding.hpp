#pragma once
/// \file
/// WeightBinding: where one runtime parameter's value comes from — a checkpoint tensor (with
/// a selection), a derived-weight recipe, or an alias of another binding (a tied weight) —
/// and how many bytes it must produce.

#include <cstdint>
#include <string>
#include <variant>

#include "eredu/core/selection.hpp"
#include "eredu/engine/description/parameter_id.hpp"
#include "eredu/engine/description/recipe.hpp"

namespace eredu::engine {

/// One parameter's source: a checkpoint tensor (+ selection), a recipe, or an alias of an
/// owner; with its declared byte size. Immutable and cheap to copy (recipes share nodes).
/// Accessors of another variant's fields (owner() of a tensor binding) throw std::logic_error.
class WeightBinding {
 public:
  /// `name` reads `selection` of checkpoint tensor `checkpoint_key` and declares
  /// `expected_bytes`. Throws DeclarationError(invalid_parameter_id) for a bad name.
  static WeightBinding tensor(std::string name, std::string checkpoint_key, Selection selection,
                              std::uint64_t expected_bytes);
  /// `name` is produced by `recipe` and declares `expected_bytes`. Throws
  /// DeclarationError(invalid_parameter_id) for a bad name.
  static WeightBinding from_recipe(std::string name, DerivedWeightRecipe recipe, std::uint64_t expected_bytes);
  /// `name` shares the materialized value of `owner` (never copied, never re-read) and declares
  /// `expected_bytes` (the owner's). Throws DeclarationError(invalid_parameter_id) for a bad
  /// name or owner.
  static WeightBinding alias(std::string name, std::string owner, std::uint64_t expected_bytes);

  /// The parameter's dotted name.
  const std::string& name() const noexcept { return id_.str(); }
  /// The parameter's identity.
  const ParameterId& id() const noexcept { return id_; }
  /// True for an alias.
  bool is_alias() const noexcept { return std::holds_alternative<ParameterId>(source_); }
  /// Name of the owner (alias only).
  const std::string& owner() const { return owner_id().str(); }
  /// Identity of the owner (alias only).
  const ParameterId& owner_id() const;
  /// The recipe of a from_recipe binding; nullptr for plain tensor bindings and aliases.
  const DerivedWeightRecipe* recipe() const noexcept { return std::get_if<DerivedWeightRecipe>(&source_); }
  /// Checkpoint key (plain tensor only).
  const std::string& checkpoint_key() const;
  /// Selection of the checkpoint tensor (plain tensor only).
  const Selection& selection() const;
  /// Bytes the value must have; checked against inference before any read.
  std::uint64_t expected_bytes() const noexcept { return expected_bytes_; }
  /// What to infer and materialize: source(key, selection) for a plain binding, the recipe for a
  /// recipe binding; throws std::logic_error for an alias (it has no source of its own).
  DerivedWeightRecipe source_recipe() const;

 private:
  struct TensorSource {
    std::string key{};
    Selection selection{};
  };
  using Source = std::variant<TensorSource, DerivedWeightRecipe, ParameterId>;  // ParameterId: alias owner

  WeightBinding(ParameterId id, Source source, std::uint64_t expected_bytes)
      : id_(std::move(id)), source_(std::move(source)), expected_bytes_(expected_bytes) {}
  const TensorSource& expect_tensor(const char* accessor) const;

  ParameterId id_;
  Source source_;
  std::uint64_t expected_bytes_ = 0;
};

}  // namespace eredu::engine
