#pragma once
/// \file
/// eredu::cpu::Parameter: one parameter slot of a CPU module — what it must hold (dtype,
/// shape) and, once bound, the tensor.

#include <utility>

#include "eredu/core/dtype.hpp"
#include "eredu/core/shape.hpp"
#include "eredu/cpu/tensor.hpp"

namespace eredu::cpu {

/// A slot declared with the dtype and shape it accepts; `value` is empty until bound.
struct Parameter {
  DType dtype{};   ///< the dtype a bound tensor must have
  Shape shape{};   ///< the shape a bound tensor must have
  Tensor value{};  ///< the bound tensor (empty before the first bind)

  /// A slot for a `dtype` tensor of `shape`.
  Parameter(DType d, Shape s) : dtype(d), shape(std::move(s)) {}
  Parameter() = default;
  /// True once a tensor is bound.
  bool bound() const noexcept { return static_cast<bool>(value); }
};

}  // namespace eredu::cpu
