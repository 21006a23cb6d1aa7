#include "eredu/engine/description/weight_binding_plan.hpp"

#include <string_view>
#include <unordered_map>

#include <fmt/format.h>

#include "eredu/core/error.hpp"
#include "eredu/engine/orchestration/engine_error.hpp"

namespace eredu::engine {

WeightBindingPlan::WeightBindingPlan(std::vector<WeightBinding> bindings) : bindings_(std::move(bindings)) {
  // Views into bindings_, which no longer changes.
  std::unordered_map<std::string_view, std::size_t> index;
  index.reserve(bindings_.size());
  for (std::size_t i = 0; i < bindings_.size(); ++i) {
    auto [it, inserted] = index.emplace(bindings_[i].name(), i);
    if (!inserted) {
      throw DeclarationError(errc::duplicate_binding, {.parameter = bindings_[i].name()},
                             fmt::format("bound twice (bindings {} and {} of {})", it->second, i, bindings_.size()));
    }
  }
  for (std::size_t i = 0; i < bindings_.size(); ++i) {
    const WeightBinding& b = bindings_[i];
    if (!b.is_alias()) {
      owners_.push_back(i);
      continue;
    }
    auto it = index.find(b.owner());
    if (it == index.end()) {
      throw DeclarationError(errc::alias_unknown_owner, {.parameter = b.name()},
                             fmt::format("alias of '{}', which no binding of the plan names", b.owner()));
    }
    const WeightBinding& owner = bindings_[it->second];
    if (owner.is_alias()) {
      throw DeclarationError(
          errc::alias_chain, {.parameter = b.name()},
          it->second == i ? std::string("alias of itself")
                          : fmt::format("alias of '{}', which is itself an alias (of '{}'); alias the owner directly",
                                        owner.name(), owner.owner()));
    }
    if (b.expected_bytes() != owner.expected_bytes()) {
      throw DeclarationError(errc::byte_mismatch, {.parameter = b.name()},
                             fmt::format("alias declares {} bytes but its owner '{}' declares {}", b.expected_bytes(),
                                         owner.name(), owner.expected_bytes()));
    }
    aliases_.emplace_back(i, it->second);
  }
}

std::vector<const WeightBinding*> WeightBindingPlan::owners() const {
  std::vector<const WeightBinding*> out;
  out.reserve(owners_.size());
  for (auto i : owners_) out.push_back(&bindings_[i]);
  return out;
}

std::vector<std::pair<const WeightBinding*, const WeightBinding*>> WeightBindingPlan::aliases() const {
  std::vector<std::pair<const WeightBinding*, const WeightBinding*>> out;
  out.reserve(aliases_.size());
  for (auto [a, o] : aliases_) out.emplace_back(&bindings_[a], &bindings_[o]);
  return out;
}

std::vector<InferredWeight> WeightBindingPlan::check(const io::Catalog& catalog) const {
  std::vector<InferredWeight> out;
  out.reserve(owners_.size());
  for (auto i : owners_) {
    const WeightBinding& b = bindings_[i];
    InferredWeight inferred;
    try {
      inferred = b.source_recipe().infer(catalog);
    } catch (const RecipeError& e) {
      // Re-thrown with the parameter, so the message says which binding the recipe belongs to.
      ErrorContext context = e.context();
      context.parameter = b.name();
      throw RecipeError(e.kind(), std::move(context), e.detail());
    }
    if (inferred.bytes != b.expected_bytes()) {
      const auto* t = b.recipe() ? nullptr : catalog.find(b.checkpoint_key());
      throw OrchestrationError(errc::byte_mismatch,
                               {.file = t ? catalog.file_of(*t).path : std::string{},
                                .parameter = b.name(),
                                .tensor = b.recipe() ? std::string{} : b.checkpoint_key()},
                               fmt::format("declares {} bytes but its recipe produces {} ({} {}, from {})",
                                           b.expected_bytes(), inferred.bytes, dtype_name(inferred.dtype),
                                           format_shape(inferred.shape), b.source_recipe().to_string()));
    }
    out.push_back(std::move(inferred));
  }
  return out;
}

std::uint64_t WeightBindingPlan::owner_bytes(const io::Catalog& catalog) const {
  std::uint64_t total = 0;
  for (const auto& w : check(catalog)) {
    if (__builtin_add_overflow(total, w.bytes, &total)) {
      throw Error(errc::size_overflow, {}, "the owners' bytes together overflow 64 bits");
    }
  }
  return total;
}

}  // namespace eredu::engine
