#pragma once
/// \file
/// eredu::cuda::Materialization: one weight being realized on the device — the tensor being
/// written and the completion of the work writing it.

#include "eredu/core/completion.hpp"
#include "eredu/cuda/tensor.hpp"

namespace eredu::cuda {

/// An in-flight realization. Read `weight` only once `done` has completed successfully. When
/// `done` fires, every copy and kernel writing `weight` has finished on the device and every
/// lease it read has been returned to its pool.
struct Materialization {
  Tensor weight{};    ///< the destination, allocated up front on the executor's stream
  Completion done{};  ///< completes when every byte of `weight` is written and every lease released
};

}  // namespace eredu::cuda
