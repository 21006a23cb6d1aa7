#pragma once
/// \file
/// eredu::cuda::Materialization: one weight being realized — the device tensor being written and the
/// completion of the work writing it (engine::BasicMaterialization, shared by every backend).

#include "eredu/cuda/tensor.hpp"
#include "eredu/engine/backend/backend_glue.hpp"

namespace eredu::cuda {

/// An in-flight realization. Read `weight` only once `done` has completed successfully. When
/// `done` fires, every copy and kernel writing `weight` has finished on the device and every
/// lease it read has been returned to its pool.
using Materialization = engine::BasicMaterialization<Tensor>;

}  // namespace eredu::cuda
