#include "eredu/nccl/data_type.hpp"

#include <fmt/format.h>

#include "eredu/core/error.hpp"

namespace eredu::nccl {

std::optional<ncclDataType_t> reduce_data_type(DType dtype) noexcept {
  switch (dtype) {
    case DType::F32:
      return ncclFloat32;
    case DType::F16:
      return ncclFloat16;
    case DType::BF16:
      return ncclBfloat16;
    case DType::F64:
      return ncclFloat64;
    case DType::I8:
      return ncclInt8;
    case DType::U8:
      return ncclUint8;
    case DType::I32:
      return ncclInt32;
    case DType::U32:
      return ncclUint32;
    case DType::I64:
      return ncclInt64;
    case DType::U64:
      return ncclUint64;
    default:
      // BOOL, I16/U16, C64, the FP8/FP6/FP4 formats and quantized blocks: NCCL has no type
      // for them (its FP8 types reduce only on sm_90 and later, so they are not offered).
      return std::nullopt;
  }
}

ncclRedOp_t reduce_op(engine::ReduceOp op) noexcept {
  switch (op) {
    case engine::ReduceOp::sum:
      return ncclSum;
    case engine::ReduceOp::min:
      return ncclMin;
    case engine::ReduceOp::max:
      return ncclMax;
  }
  return ncclSum;
}

ncclDataType_t require_reducible(DType dtype, engine::ReduceOp op) {
  const std::optional<ncclDataType_t> type = reduce_data_type(dtype);
  if (!type)
    throw Error(
        errc::invalid_argument, {},
        fmt::format("all_reduce ({}) of {}: NCCL reduces only F32, F16, BF16, F64, I8, U8, I32, U32, I64 and U64",
                    engine::reduce_op_name(op), dtype_name(dtype)));
  return *type;
}

}  // namespace eredu::nccl
