#pragma once
/// \file
/// Which eredu dtypes NCCL reduces, and how: F32, F16, BF16, F64, I8, U8, I32, U32, I64 and
/// U64 map to NCCL's types of the same layout; every other dtype (BOOL, I16, U16, C64, FP8,
/// quantized blocks) has no NCCL reduction and is refused before anything starts. Gathers and
/// exchanges move a tensor's bytes (ncclUint8), so they take every dtype. Needs no device.

#include <nccl.h>

#include <optional>

#include "eredu/core/dtype.hpp"
#include "eredu/engine/backend/collective_backend.hpp"

namespace eredu::nccl {

/// NCCL's type for reducing `dtype`, or nullopt when NCCL cannot reduce it.
std::optional<ncclDataType_t> reduce_data_type(DType dtype) noexcept;

/// NCCL's reduction for `op` (ncclSum, ncclMin, ncclMax).
ncclRedOp_t reduce_op(engine::ReduceOp op) noexcept;

/// Throws Error(invalid_argument) naming `dtype`, `op` and the dtypes NCCL reduces when NCCL
/// cannot reduce `dtype`; returns NCCL's type otherwise.
ncclDataType_t require_reducible(DType dtype, engine::ReduceOp op);

}  // namespace eredu::nccl
