#pragma once
/// \file
/// Parameterized modules: a module visits each of its parameter slots with that slot's
/// metadata, through a const visitor (validation) or a mutable one (binding). Nested modules
/// visit their children with a name prefix, so identities come out fully dotted.
///
/// Example: a layer with two slots, and a model that visits its layers as `layers.N`:
/// ```
/// struct Layer {
///   Tensor q, o;
///   void visit_parameters(ParameterVisitor<Tensor>& v, const std::string& prefix) const {
///     v.visit({ParameterId(join_name(prefix, "q.weight")), DType::BF16, {64, 64}}, q);
///     v.visit({ParameterId(join_name(prefix, "o.weight")), DType::BF16, {64, 64}}, o);
///   }
///   void visit_parameters_mut(ParameterVisitorMut<Tensor>& v, const std::string& prefix) {
///     v.visit_mut({ParameterId(join_name(prefix, "q.weight")), DType::BF16, {64, 64}}, q);
///     v.visit_mut({ParameterId(join_name(prefix, "o.weight")), DType::BF16, {64, 64}}, o);
///   }
/// };
/// struct Model {
///   std::vector<Layer> layers;
///   void visit_parameters(ParameterVisitor<Tensor>& v, const std::string& prefix) const {
///     for (std::size_t i = 0; i < layers.size(); ++i)
///       layers[i].visit_parameters(v, join_name(prefix, fmt::format("layers.{}", i)));
///   }
///   // visit_parameters_mut likewise
/// };
/// static_assert(Parameterized<Model, Tensor>);
/// // model.visit_parameters(v, "") visits "layers.0.q.weight", "layers.0.o.weight", ...
/// ```

#include <concepts>
#include <string>
#include <string_view>

#include "eredu/engine/description/parameter_metadata.hpp"

namespace eredu::engine {

/// Receives each parameter slot of a module, read-only (e.g. to validate a binding first).
template <class P>
class ParameterVisitor {
 public:
  /// Called once per slot, in the module's declaration order.
  virtual void visit(const ParameterMetadata& metadata, const P& parameter) = 0;

 protected:
  // Visitors are used through references only, never deleted through this base.
  ~ParameterVisitor() = default;
};

/// Receives each parameter slot of a module, writable (e.g. to bind materialized weights).
template <class P>
class ParameterVisitorMut {
 public:
  /// Called once per slot, in the module's declaration order.
  virtual void visit_mut(const ParameterMetadata& metadata, P& parameter) = 0;

 protected:
  // Visitors are used through references only, never deleted through this base.
  ~ParameterVisitorMut() = default;
};

/// A module whose parameter slots (of type P) can be visited const and mutably; `prefix` is
/// "" at the root, and each visited identity is join_name(prefix, local name).
template <class M, class P>
concept Parameterized = requires(const M& c, M& m, ParameterVisitor<P>& v, ParameterVisitorMut<P>& vm,
                                 const std::string& prefix) {
  c.visit_parameters(v, prefix);
  m.visit_parameters_mut(vm, prefix);
};

/// `prefix + "." + local`, without the dot when either side is empty: ("", "w") = "w",
/// ("a", "w") = "a.w", ("a", "") = "a". Does not validate: ParameterId does.
inline std::string join_name(std::string_view prefix, std::string_view local) {
  if (prefix.empty()) return std::string(local);
  if (local.empty()) return std::string(prefix);
  std::string out;
  out.reserve(prefix.size() + 1 + local.size());
  out.append(prefix).append(1, '.').append(local);
  return out;
}

}  // namespace eredu::engine
