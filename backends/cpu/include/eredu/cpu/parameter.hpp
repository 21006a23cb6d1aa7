#pragma once
/// \file
/// eredu::cpu::Parameter: one parameter slot of a CPU module — what it must hold (dtype,
/// shape) and, once bound, the tensor (engine::BasicParameter, the slot every backend shares).

#include "eredu/cpu/tensor.hpp"
#include "eredu/engine/backend/backend_glue.hpp"

namespace eredu::cpu {

/// A slot declared with the dtype and shape it accepts; `value` is empty until bound.
using Parameter = engine::BasicParameter<Tensor>;

}  // namespace eredu::cpu
