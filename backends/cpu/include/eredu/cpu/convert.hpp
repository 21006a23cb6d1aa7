#pragma once
/// \file
/// Buffer-wide dtype conversion kernels of the CPU backend: a serial kernel over one
/// contiguous block and a oneTBB-parallel version over cache-sized blocks of it.
///
/// The supported casts are exactly those of convert_supported() (the set
/// eredu::is_supported_cast defines); results agree bit for bit with the one float-format
/// reference, eredu/core/float_formats.hpp. Buffers are raw bytes in the host's
/// (little-endian) element layout and need no particular alignment.

#include <cstddef>
#include <span>

#include "eredu/core/dtype.hpp"

namespace eredu::cpu {

/// Bytes of output each parallel block of convert() produces: small enough to stay in L2.
inline constexpr std::size_t convert_block_bytes = std::size_t{64} << 10;

/// Outputs at least this large are written with streaming (cache-bypassing) stores where a
/// kernel has them: a load writes gigabytes it does not read back soon.
inline constexpr std::size_t convert_stream_bytes = std::size_t{1} << 20;

/// Which kernels conversions use: `best` takes AVX2 and F16C where the CPU has them, and
/// AVX512-BF16 for dequantizing to bf16 where it has that too; `avx2` stops at AVX2 and F16C;
/// `generic` takes the portable ones. All give the same bits; the switch is for tests and A/B
/// runs.
enum class ConvertIsa { best, generic, avx2 };

/// Selects the kernels of every later conversion in the process; returns the set in effect
/// (`generic` when `best` or `avx2` was asked on a CPU without AVX2).
ConvertIsa use_convert_isa(ConvertIsa wanted) noexcept;

/// The kernel set now in effect, for reports: "avx2+f16c+avx512bf16", "avx2+f16c", "avx2" or
/// "generic".
const char* convert_isa_name() noexcept;

/// True when the CPU backend has a kernel converting `from` to `to` (the backend's
/// supports_cast): any dtype to itself (a byte copy), among {F16, BF16, F32}, from {F8_E4M3,
/// F8_E5M2, F8_E8M0} to {BF16, F32}, and from a quantized dtype other than Q8_1 to {F32, BF16,
/// F16} (dequantization, bit for bit as ggml: eredu/core/quant_formats.hpp) — exactly
/// eredu::is_supported_cast, which the tests check for every pair.
bool convert_supported(DType from, DType to) noexcept;

/// The unit a conversion moves: `in_bytes` of input become `out_bytes` of output. One byte
/// for a same-dtype copy, one element for a float cast, one block for a dequantization (a
/// Q4_K block of 144 bytes becomes 256 f32 values, 1024 bytes). Buffers of a conversion hold
/// whole units; chunked callers split inputs on unit boundaries.
struct ConvertUnits {
  std::size_t in_bytes = 1;   ///< input bytes per unit
  std::size_t out_bytes = 1;  ///< output bytes per unit
};

/// The units of a conversion from `from` to `to` (see ConvertUnits).
ConvertUnits convert_units(DType from, DType to) noexcept;

/// Converts every element of `in` (of dtype `from`) into `out` (of dtype `to`) on the calling
/// thread. Throws eredu::Error with errc::recipe_unsupported_cast when !convert_supported(from,
/// to), and errc::invalid_argument when the two buffers do not hold the same whole number of
/// units (convert_units: elements, or blocks of a quantized `from`) or overlap.
void convert_serial(DType from, DType to, std::span<const std::byte> in, std::span<std::byte> out);

/// How a conversion writes its output: `automatic` streams outputs of at least
/// convert_stream_bytes, `streaming` streams any size (for the blocks of a large output
/// that a caller splits itself).
enum class ConvertStores { automatic, streaming };

/// convert_serial() with the choice of stores.
void convert_serial(DType from, DType to, std::span<const std::byte> in, std::span<std::byte> out,
                    ConvertStores stores);

/// convert_serial() split over blocks of about convert_block_bytes of output with
/// tbb::parallel_for, in the task arena of the caller; an input smaller than one block is
/// converted inline. Validates and throws exactly as convert_serial() does, before writing.
void convert(DType from, DType to, std::span<const std::byte> in, std::span<std::byte> out);

}  // namespace eredu::cpu
