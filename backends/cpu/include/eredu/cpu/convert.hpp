#pragma once
/// \file
/// Buffer-wide dtype conversion kernels of the CPU backend: a serial kernel over one
/// contiguous block and a oneTBB-parallel version over cache-sized blocks of it.
///
/// The supported casts are exactly those of convert_supported(); results agree bit for bit
/// with the scalar reference in float_formats.hpp. Buffers are raw bytes in the host's
/// (little-endian) element layout and need no particular alignment.

#include <cstddef>
#include <span>

#include "eredu/core/dtype.hpp"

namespace eredu::cpu {

/// Bytes of output each parallel block of convert() produces: small enough to stay in L2.
inline constexpr std::size_t convert_block_bytes = std::size_t{64} << 10;

/// True when the CPU backend converts `from` to `to`: any dtype to itself (a byte copy),
/// among {F16, BF16, F32}, and from {F8_E4M3, F8_E5M2, F8_E8M0} to {BF16, F32}. The engine
/// validates recipe casts with the same rule.
bool convert_supported(DType from, DType to) noexcept;

/// Converts every element of `in` (of dtype `from`) into `out` (of dtype `to`) on the calling
/// thread. Throws eredu::Error with errc::recipe_unsupported_cast when !convert_supported(from,
/// to), and errc::invalid_argument when the two buffers do not hold the same whole number of
/// elements (for from == to: the same number of bytes) or overlap.
void convert_serial(DType from, DType to, std::span<const std::byte> in, std::span<std::byte> out);

/// convert_serial() split over blocks of about convert_block_bytes of output with
/// tbb::parallel_for, in the task arena of the caller; an input smaller than one block is
/// converted inline. Validates and throws exactly as convert_serial() does, before writing.
void convert(DType from, DType to, std::span<const std::byte> in, std::span<std::byte> out);

}  // namespace eredu::cpu
