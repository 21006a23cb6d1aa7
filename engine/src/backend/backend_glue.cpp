#include "eredu/engine/backend/backend_glue.hpp"

#include <fmt/format.h>

#include "eredu/core/error.hpp"

namespace eredu::engine {

void check_bind_fits(DType slot_dtype, const Shape& slot_shape, DType dtype, const Shape& shape) {
  if (dtype != slot_dtype)
    throw BackendError(
        errc::bind_dtype_mismatch, {},
        fmt::format("the parameter holds {} but the weight is {}", dtype_name(slot_dtype), dtype_name(dtype)));
  if (shape != slot_shape)
    throw BackendError(errc::bind_shape_mismatch, {},
                       fmt::format("the parameter has shape {} but the weight has shape {}", format_shape(slot_shape),
                                   format_shape(shape)));
}

}  // namespace eredu::engine
