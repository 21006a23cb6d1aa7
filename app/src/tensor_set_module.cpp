#include "eredu/app/tensor_set_module.hpp"

#include <fmt/format.h>

#include <set>
#include <utility>

#include "eredu/core/error.hpp"
#include "eredu/engine/description/parameter_id.hpp"
#include "eredu/engine/description/recipe.hpp"

namespace eredu::app {

TensorSetModule TensorSetModule::build(const io::Catalog& catalog, const std::vector<TensorRequest>& requests,
                                       const Check& check) {
  using R = engine::DerivedWeightRecipe;
  std::vector<engine::WeightBinding> bindings;
  std::vector<Slot> slots;
  std::uint64_t total = 0;
  std::set<std::string> taken;
  for (std::size_t i = 0; i < requests.size(); ++i) {
    const TensorRequest& request = requests[i];
    const io::TensorInfo& info = catalog.at(request.key);
    const std::string& file = catalog.file_of(info).path;
    std::string name = request.name.empty() ? request.key : request.name;
    if (!engine::ParameterId::parse(name) || taken.contains(name)) name = fmt::format("tensor_{}", i);
    taken.insert(name);

    if (std::string why = request.selection.check(info.shape); !why.empty())
      throw Error(
          errc::invalid_selection, {.file = file, .tensor = request.key},
          fmt::format("selection {} of a {} tensor: {}", request.selection.to_string(), format_shape(info.shape), why));
    const Shape shape = request.selection.selected_shape(info.shape);
    DType dtype = info.dtype;
    std::uint64_t bytes = 0;
    if (request.cast && *request.cast != info.dtype) {
      R recipe = R::cast(R::source(request.key, request.selection), *request.cast);
      const engine::InferredWeight inferred = recipe.infer(catalog);
      dtype = inferred.dtype;
      bytes = inferred.bytes;
      bindings.push_back(engine::WeightBinding::from_recipe(name, std::move(recipe), bytes));
    } else {
      auto elements = checked_element_count(shape);
      auto size = elements ? checked_byte_size(*elements, dtype) : std::nullopt;
      if (!size)
        throw Error(errc::invalid_selection, {.file = file, .tensor = request.key},
                    fmt::format("selection {} of a {} {} tensor is not a whole number of bytes",
                                request.selection.to_string(), dtype_name(dtype), format_shape(info.shape)));
      bytes = *size;
      bindings.push_back(engine::WeightBinding::tensor(name, request.key, request.selection, bytes));
    }
    // Checked now, so that a load never reads what its caller could not hand over.
    if (check) check(i, SlotShape{info, file, dtype, shape});
    slots.push_back({name, cpu::Parameter(dtype, shape)});
    if (__builtin_add_overflow(total, bytes, &total))
      throw Error(errc::size_overflow, {.file = file, .tensor = request.key}, "the tensors' bytes overflow 64 bits");
  }
  return TensorSetModule(std::move(slots), engine::WeightBindingPlan(std::move(bindings)), total);
}

TensorSetModule TensorSetModule::mirror(const io::Catalog& catalog, std::optional<DType> cast_to) {
  std::vector<TensorRequest> requests;
  for (const io::TensorInfo& t : catalog.tensors()) {
    TensorRequest r{.key = t.name};
    if (cast_to && engine::is_supported_cast(t.dtype, *cast_to)) r.cast = cast_to;
    requests.push_back(std::move(r));
  }
  return build(catalog, requests);
}

TensorSetModule TensorSetModule::unbound() const {
  std::vector<Slot> slots;
  slots.reserve(slots_.size());
  for (const Slot& s : slots_) slots.push_back({s.name, cpu::Parameter(s.parameter.dtype, s.parameter.shape)});
  return TensorSetModule(std::move(slots), plan_, bytes_);
}

void TensorSetModule::visit_parameters(engine::ParameterVisitor<cpu::Parameter>& v, const std::string& prefix) const {
  for (const Slot& s : slots_)
    v.visit({engine::ParameterId(engine::join_name(prefix, s.name)), s.parameter.dtype, s.parameter.shape},
            s.parameter);
}

void TensorSetModule::visit_parameters_mut(engine::ParameterVisitorMut<cpu::Parameter>& v, const std::string& prefix) {
  for (Slot& s : slots_)
    v.visit_mut({engine::ParameterId(engine::join_name(prefix, s.name)), s.parameter.dtype, s.parameter.shape},
                s.parameter);
}

}  // namespace eredu::app
