#pragma once
/// \file
/// What every backend's all_gather_into checks before anything starts (the output's dtype and
/// shape, and whether it shares bytes with the input), in one place so that MPI and NCCL refuse
/// the same outputs with the same messages and agree on the in-place form.

#include <cstddef>
#include <string_view>

#include "eredu/core/dtype.hpp"
#include "eredu/core/shape.hpp"

namespace eredu::engine::detail {

/// Shape of the all_gather of `shape` over `size` ranks: dim 0 times `size` (a scalar counts as [1]).
Shape gathered_shape(const Shape& shape, int size);

/// One side of a gather as the check sees it; `data` may be a host or a device address, it is
/// only compared with the other side's.
struct GatherOperand {
  DType dtype;            ///< element type
  const Shape& shape;     ///< dimensions
  const std::byte* data;  ///< first byte (nullptr when empty)
  std::size_t bytes;      ///< byte size
};

/// Checks that `output` can receive `operation`'s gather of `input` from `size` ranks, this one
/// being `rank`; true when the input is exactly this rank's block of the output (the in-place
/// form, which MPI_IN_PLACE and NCCL take). Throws Error(invalid_argument), naming both
/// tensors, for an output of another dtype or shape than the gathered one, or one that shares
/// bytes with the input in any other way (the transport would read what it already overwrote).
bool check_gather_output(std::string_view operation, const GatherOperand& input, const GatherOperand& output, int rank,
                         int size);

}  // namespace eredu::engine::detail
