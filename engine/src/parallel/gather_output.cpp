#include "eredu/engine/detail/gather_output.hpp"

#include <cstdint>
#include <string>

#include <fmt/format.h>

#include "eredu/core/error.hpp"

namespace eredu::engine::detail {
namespace {

std::string describe(DType dtype, const Shape& shape) {
  return fmt::format("{} {}", dtype_name(dtype), format_shape(shape));
}

}  // namespace

Shape gathered_shape(const Shape& shape, int size) {
  Shape out = shape.empty() ? Shape{1} : shape;
  out[0] *= static_cast<std::uint64_t>(size);
  return out;
}

bool check_gather_output(std::string_view operation, const GatherOperand& input, const GatherOperand& output, int rank,
                         int size) {
  const Shape want = gathered_shape(input.shape, size);
  const std::string what = fmt::format("{} of {} over {} ranks", operation, describe(input.dtype, input.shape), size);
  // Addresses as integers: the two sides are usually unrelated objects, which `<` may not order.
  const auto in = reinterpret_cast<std::uintptr_t>(input.data);
  const auto out = reinterpret_cast<std::uintptr_t>(output.data);
  const bool overlap = input.bytes > 0 && output.bytes > 0 && in < out + output.bytes && out < in + input.bytes;
  const std::uint64_t own_block = static_cast<std::uint64_t>(rank) * input.bytes;
  const bool in_place =
      overlap && in == out + own_block && output.bytes == static_cast<std::uint64_t>(size) * input.bytes;
  if (overlap && !in_place)
    throw Error(errc::invalid_argument, {},
                fmt::format("{}: the output {} shares storage with the input, which is not this rank's block of it "
                            "(rank {}: bytes {}-{}); gather into a tensor of its own",
                            what, describe(output.dtype, output.shape), rank, own_block, own_block + input.bytes));
  if (output.dtype != input.dtype || output.shape != want)
    throw Error(errc::invalid_argument, {},
                fmt::format("{}: the output is {}, the gather needs {}", what, describe(output.dtype, output.shape),
                            describe(input.dtype, want)));
  return in_place;
}

}  // namespace eredu::engine::detail
