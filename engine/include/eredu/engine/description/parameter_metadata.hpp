#pragma once
/// \file
/// ParameterMetadata: what a module declares about one parameter slot when it visits it.

#include "eredu/core/dtype.hpp"
#include "eredu/core/shape.hpp"
#include "eredu/engine/description/parameter_id.hpp"

namespace eredu::engine {

/// Identity, element type and shape a module expects of one of its parameters.
struct ParameterMetadata {
  ParameterId id;  ///< full dotted identity (prefix included)
  DType dtype{};   ///< element type the slot expects
  Shape shape{};   ///< shape the slot expects
  friend bool operator==(const ParameterMetadata&, const ParameterMetadata&) = default;
};

}  // namespace eredu::engine
