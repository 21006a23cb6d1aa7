#pragma once
/// \file
/// eredu::cpu::Materialization: one weight being realized — the tensor being written and the
/// completion of the work writing it (engine::BasicMaterialization, shared by every backend).

#include "eredu/cpu/tensor.hpp"
#include "eredu/engine/backend/backend_glue.hpp"

namespace eredu::cpu {

/// An in-flight realization. Read `weight` only once `done` has completed successfully.
using Materialization = engine::BasicMaterialization<Tensor>;

}  // namespace eredu::cpu
