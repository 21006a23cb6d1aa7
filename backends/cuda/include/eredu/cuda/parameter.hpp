#pragma once
/// \file
/// eredu::cuda::Parameter: one parameter slot of a CUDA module — what it must hold (dtype,
/// shape) and, once bound, the device tensor (engine::BasicParameter, the slot every backend shares).

#include "eredu/cuda/tensor.hpp"
#include "eredu/engine/backend/backend_glue.hpp"

namespace eredu::cuda {

/// A slot declared with the dtype and shape it accepts; `value` is empty until bound.
using Parameter = engine::BasicParameter<Tensor>;

}  // namespace eredu::cuda
