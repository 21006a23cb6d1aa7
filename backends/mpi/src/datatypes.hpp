#pragma once
// MPI datatypes and reduction operators for eredu's dtypes (private to eredu::mpi). MPI 3.1
// has no 16-bit floats, so BF16 and F16 are 2-byte contiguous types with user-defined sum,
// min and max, created once when MPI starts (create_custom_types, on the initializing thread)
// and freed before it finalizes.

#include <mpi.h>

#include <cstddef>
#include <string>

#include "eredu/core/dtype.hpp"
#include "eredu/engine/backend/collective_backend.hpp"

namespace eredu::mpi::detail {

/// How MPI reduces one dtype with one reduction.
struct ReduceType {
  MPI_Datatype type = MPI_DATATYPE_NULL;  ///< one element
  MPI_Op op = MPI_OP_NULL;                ///< the reduction
  std::size_t element_bytes = 0;          ///< bytes of one element
};

/// Creates the BF16 and F16 types and operators. Call once, after MPI_Init_thread, before
/// the progress thread starts. Returns an MPI error code.
int create_custom_types();
/// Frees them; call after the progress thread stopped, before MPI_Finalize.
void free_custom_types();

/// The MPI type and operator for `op` over `dtype`. Throws Error(invalid_argument) naming
/// `what` for a dtype MPI cannot reduce that way (FP8, FP4, FP6, complex min/max, BOOL sum).
ReduceType reduce_type(DType dtype, engine::ReduceOp op, const std::string& what);

/// The reductions' element functions on 16-bit floats, exposed for the tests: `inout[i] =
/// in[i] op inout[i]`, computed in f32 and rounded to nearest even (sum), or the smaller /
/// larger of the two (min / max, exactly one of the inputs).
void reduce_bf16(engine::ReduceOp op, const std::uint16_t* in, std::uint16_t* inout, std::size_t n) noexcept;
/// As reduce_bf16, for F16.
void reduce_f16(engine::ReduceOp op, const std::uint16_t* in, std::uint16_t* inout, std::size_t n) noexcept;

}  // namespace eredu::mpi::detail
