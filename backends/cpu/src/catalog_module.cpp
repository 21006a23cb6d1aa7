#include "eredu/cpu/catalog_module.hpp"

#include <fmt/format.h>

#include "eredu/engine/description/parameter_id.hpp"
#include "eredu/engine/description/recipe.hpp"

namespace eredu::cpu {

CatalogModule CatalogModule::mirror(const io::Catalog& catalog, std::optional<DType> cast_to) {
  std::vector<Slot> slots;
  std::vector<engine::WeightBinding> bindings;
  std::uint64_t total = 0;
  const auto tensors = catalog.tensors();
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const io::TensorInfo& t = tensors[i];
    std::string name = engine::ParameterId::parse(t.name) ? t.name : fmt::format("tensor_{}", i);
    if (cast_to && *cast_to != t.dtype && engine::is_supported_cast(t.dtype, *cast_to)) {
      auto recipe = engine::DerivedWeightRecipe::cast(engine::DerivedWeightRecipe::source(t.name), *cast_to);
      std::uint64_t bytes = recipe.infer(catalog).bytes;
      bindings.push_back(engine::WeightBinding::from_recipe(name, std::move(recipe), bytes));
      slots.push_back({name, Parameter(*cast_to, t.shape)});
      total += bytes;
    } else {
      bindings.push_back(engine::WeightBinding::tensor(name, t.name, Selection::all(), t.nbytes));
      slots.push_back({name, Parameter(t.dtype, t.shape)});
      total += t.nbytes;
    }
  }
  return CatalogModule(std::move(slots), engine::WeightBindingPlan(std::move(bindings)), total);
}

CatalogModule CatalogModule::unbound() const {
  std::vector<Slot> slots;
  slots.reserve(slots_.size());
  for (const Slot& s : slots_) slots.push_back({s.name, Parameter(s.parameter.dtype, s.parameter.shape)});
  return CatalogModule(std::move(slots), plan_, bytes_);
}

void CatalogModule::visit_parameters(engine::ParameterVisitor<Parameter>& v, const std::string& prefix) const {
  for (const Slot& s : slots_)
    v.visit({engine::ParameterId(engine::join_name(prefix, s.name)), s.parameter.dtype, s.parameter.shape},
            s.parameter);
}

void CatalogModule::visit_parameters_mut(engine::ParameterVisitorMut<Parameter>& v, const std::string& prefix) {
  for (Slot& s : slots_)
    v.visit_mut({engine::ParameterId(engine::join_name(prefix, s.name)), s.parameter.dtype, s.parameter.shape},
                s.parameter);
}

}  // namespace eredu::cpu
