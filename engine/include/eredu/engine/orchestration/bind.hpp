#pragma once
/// \file
/// bind_materialized_unit: publishes a realized unit into a module's parameter slots, all or
/// nothing (the seed's `bind_materialized_unit`).
///
/// Every slot is validated first — a value exists for it, and the backend accepts it (shape,
/// dtype) — and every realized value must belong to some slot. Only then is anything
/// published; `B::bind` cannot fail after `B::validate_bind`, so a failed bind leaves the
/// module exactly as it was.

#include <fmt/format.h>

#include <set>
#include <string>
#include <vector>

#include "eredu/core/error.hpp"
#include "eredu/core/trace.hpp"
#include "eredu/engine/description/parameter_error.hpp"
#include "eredu/engine/description/parameterized.hpp"
#include "eredu/engine/orchestration/engine_error.hpp"
#include "eredu/engine/orchestration/materialized_unit.hpp"

namespace eredu::engine {

/// Checks that `weights` fit `module` exactly — a value for every slot that the backend
/// accepts, and no value without a slot — without changing anything. Throws
/// OrchestrationError (missing_binding naming the first slot without a value;
/// unexpected_bindings naming every value without a slot) or the backend's BackendError
/// with the parameter named.
template <ParameterBackend B, class M>
requires Parameterized<M, typename B::Parameter>
void validate_materialized_unit(const M& module, const typename MaterializedUnit<B>::Weights& weights) {
  using Weights = typename MaterializedUnit<B>::Weights;
  using Parameter = typename B::Parameter;

  struct Validator final : ParameterVisitor<Parameter> {
    explicit Validator(const Weights& w) : weights(w) {}
    void visit(const ParameterMetadata& metadata, const Parameter& parameter) override {
      if (error) return;
      // Every field named: this body is compiled in the code that instantiates it, whose
      // -Wextra would report the ones left out (-Wmissing-field-initializers).
      auto context = [&] { return ErrorContext{.parameter = metadata.id.str()}; };
      auto it = weights.find(metadata.id);
      if (it == weights.end()) {
        error = std::make_exception_ptr(
            OrchestrationError(errc::missing_binding, context(),
                               fmt::format("the materialized unit has no value for this {} {} parameter",
                                           dtype_name(metadata.dtype), format_shape(metadata.shape))));
        return;
      }
      if (!visited.insert(metadata.id).second) {
        error = std::make_exception_ptr(
            OrchestrationError(errc::duplicate_binding, context(), "the module visits this parameter twice"));
        return;
      }
      try {
        B::validate_bind(parameter, it->second);
      } catch (...) {
        error = attach_parameter(std::current_exception(), metadata.id.str());
      }
    }
    const Weights& weights;
    std::set<ParameterId> visited;
    std::exception_ptr error;
  };

  Validator validator(weights);
  module.visit_parameters(validator, std::string());
  if (validator.error) std::rethrow_exception(validator.error);
  if (validator.visited.size() != weights.size()) {
    std::vector<std::string> unexpected;
    for (auto& [id, weight] : weights)
      if (!validator.visited.contains(id)) unexpected.push_back(id.str());
    throw OrchestrationError(errc::unexpected_bindings, {},
                             fmt::format("the materialized unit has values for {} parameter(s) the module does not "
                                         "have: {}",
                                         unexpected.size(), fmt::join(unexpected, ", ")));
  }
}

/// Binds `unit` into `module` (see file comment). Throws what validate_materialized_unit
/// throws; in every case of failure the module is unchanged.
template <ParameterBackend B, class M>
requires Parameterized<M, typename B::Parameter>
void bind_materialized_unit(M& module, MaterializedUnit<B> unit) {
  using Weights = typename MaterializedUnit<B>::Weights;
  using Parameter = typename B::Parameter;

  trace::Span span("bind", "engine");
  Weights weights = std::move(unit).release();
  validate_materialized_unit<B>(std::as_const(module), weights);

  // Publication: every slot was validated against exactly these values.
  struct Binder final : ParameterVisitorMut<Parameter> {
    explicit Binder(Weights& w) : weights(w) {}
    void visit_mut(const ParameterMetadata& metadata, Parameter& parameter) override {
      auto node = weights.extract(metadata.id);
      // Validation saw a value for every slot; a module whose mutable traversal visits a slot
      // its const one did not is broken, and that slot is left untouched rather than read
      // from an empty node.
      if (node) B::bind(parameter, std::move(node.mapped()));
    }
    Weights& weights;
  };
  Binder binder(weights);
  module.visit_parameters_mut(binder, std::string());
}

}  // namespace eredu::engine
