#pragma once
/// \file
/// eredu::cpu::Materialization: one weight being realized — the tensor being written and the
/// completion of the work writing it (which holds the leases it reads until then).

#include "eredu/core/completion.hpp"
#include "eredu/cpu/tensor.hpp"

namespace eredu::cpu {

/// An in-flight realization. Read `weight` only once `done` has completed successfully.
struct Materialization {
  Tensor weight{};    ///< the destination, allocated up front
  Completion done{};  ///< completes when every byte of `weight` is written and every lease released
};

}  // namespace eredu::cpu
