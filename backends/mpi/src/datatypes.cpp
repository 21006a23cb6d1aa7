#include "datatypes.hpp"

#include <bit>
#include <cstdint>

#include <fmt/format.h>

#include "eredu/core/error.hpp"
#include "eredu/core/float_formats.hpp"

namespace eredu::mpi::detail {
namespace {

MPI_Datatype half_type = MPI_DATATYPE_NULL;  // two bytes, shared by BF16 and F16
MPI_Op bf16_ops[3] = {MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL};
MPI_Op f16_ops[3] = {MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL};

float as_float(std::uint32_t bits) noexcept { return std::bit_cast<float>(bits); }
std::uint32_t as_bits(float f) noexcept { return std::bit_cast<std::uint32_t>(f); }

template <std::uint32_t (*ToF32)(std::uint16_t), std::uint16_t (*FromF32)(std::uint32_t)>
void reduce_half(engine::ReduceOp op, const std::uint16_t* in, std::uint16_t* inout, std::size_t n) noexcept {
  for (std::size_t i = 0; i < n; ++i) {
    const float a = as_float(ToF32(in[i]));
    const float b = as_float(ToF32(inout[i]));
    switch (op) {
      case engine::ReduceOp::sum:
        inout[i] = FromF32(as_bits(a + b));
        break;
      case engine::ReduceOp::min:
        inout[i] = a < b ? in[i] : inout[i];  // exactly one of the inputs, never re-rounded
        break;
      case engine::ReduceOp::max:
        inout[i] = a > b ? in[i] : inout[i];
        break;
    }
  }
}

template <engine::ReduceOp Op>
void bf16_fn(void* in, void* inout, int* len, MPI_Datatype*) {
  reduce_bf16(Op, static_cast<const std::uint16_t*>(in), static_cast<std::uint16_t*>(inout),
              static_cast<std::size_t>(*len));
}
template <engine::ReduceOp Op>
void f16_fn(void* in, void* inout, int* len, MPI_Datatype*) {
  reduce_f16(Op, static_cast<const std::uint16_t*>(in), static_cast<std::uint16_t*>(inout),
             static_cast<std::size_t>(*len));
}

MPI_Op builtin_op(engine::ReduceOp op) {
  switch (op) {
    case engine::ReduceOp::sum:
      return MPI_SUM;
    case engine::ReduceOp::min:
      return MPI_MIN;
    case engine::ReduceOp::max:
      return MPI_MAX;
  }
  return MPI_OP_NULL;
}

}  // namespace

void reduce_bf16(engine::ReduceOp op, const std::uint16_t* in, std::uint16_t* inout, std::size_t n) noexcept {
  reduce_half<formats::bf16_to_f32, formats::f32_to_bf16>(op, in, inout, n);
}

void reduce_f16(engine::ReduceOp op, const std::uint16_t* in, std::uint16_t* inout, std::size_t n) noexcept {
  reduce_half<formats::f16_to_f32, formats::f32_to_f16>(op, in, inout, n);
}

int create_custom_types() {
  int rc = MPI_Type_contiguous(2, MPI_BYTE, &half_type);
  if (rc == MPI_SUCCESS) rc = MPI_Type_commit(&half_type);
  // Commutative (a + b and b + a round alike), so MPI may reduce in any order: the same on
  // every rank for the algorithms OpenMPI uses, but not necessarily the order of a loop.
  if (rc == MPI_SUCCESS) rc = MPI_Op_create(&bf16_fn<engine::ReduceOp::sum>, 1, &bf16_ops[0]);
  if (rc == MPI_SUCCESS) rc = MPI_Op_create(&bf16_fn<engine::ReduceOp::min>, 1, &bf16_ops[1]);
  if (rc == MPI_SUCCESS) rc = MPI_Op_create(&bf16_fn<engine::ReduceOp::max>, 1, &bf16_ops[2]);
  if (rc == MPI_SUCCESS) rc = MPI_Op_create(&f16_fn<engine::ReduceOp::sum>, 1, &f16_ops[0]);
  if (rc == MPI_SUCCESS) rc = MPI_Op_create(&f16_fn<engine::ReduceOp::min>, 1, &f16_ops[1]);
  if (rc == MPI_SUCCESS) rc = MPI_Op_create(&f16_fn<engine::ReduceOp::max>, 1, &f16_ops[2]);
  return rc;
}

void free_custom_types() {
  for (MPI_Op* ops : {bf16_ops, f16_ops})
    for (int i = 0; i < 3; ++i)
      if (ops[i] != MPI_OP_NULL) MPI_Op_free(&ops[i]);
  if (half_type != MPI_DATATYPE_NULL) MPI_Type_free(&half_type);
}

ReduceType reduce_type(DType dtype, engine::ReduceOp op, const std::string& what) {
  const auto index = static_cast<std::size_t>(op);
  const MPI_Op builtin = builtin_op(op);
  switch (dtype) {
    case DType::F64:
      return {MPI_DOUBLE, builtin, 8};
    case DType::F32:
      return {MPI_FLOAT, builtin, 4};
    case DType::BF16:
      return {half_type, bf16_ops[index], 2};
    case DType::F16:
      return {half_type, f16_ops[index], 2};
    case DType::I8:
      return {MPI_INT8_T, builtin, 1};
    case DType::U8:
      return {MPI_UINT8_T, builtin, 1};
    case DType::I16:
      return {MPI_INT16_T, builtin, 2};
    case DType::U16:
      return {MPI_UINT16_T, builtin, 2};
    case DType::I32:
      return {MPI_INT32_T, builtin, 4};
    case DType::U32:
      return {MPI_UINT32_T, builtin, 4};
    case DType::I64:
      return {MPI_INT64_T, builtin, 8};
    case DType::U64:
      return {MPI_UINT64_T, builtin, 8};
    case DType::BOOL:
      // min is "all", max is "any"; a sum of booleans is not a boolean.
      if (op == engine::ReduceOp::min) return {MPI_C_BOOL, MPI_LAND, 1};
      if (op == engine::ReduceOp::max) return {MPI_C_BOOL, MPI_LOR, 1};
      break;
    case DType::C64:
      if (op == engine::ReduceOp::sum) return {MPI_C_FLOAT_COMPLEX, MPI_SUM, 8};
      break;
    default:
      break;
  }
  throw Error(
      errc::invalid_argument, {},
      fmt::format("{}: MPI cannot {}-reduce {} (reduce F64, F32, BF16, F16 or an integer type; BOOL with min or "
                  "max; C64 with sum)",
                  what, engine::reduce_op_name(op), dtype_name(dtype)));
}

}  // namespace eredu::mpi::detail
