#pragma once
/// \file
/// Layout kernels of the CPU backend: slice along one dimension, concatenation and
/// permutation (transpose) of row-major tensors, parallel with oneTBB when large.
///
/// Tensors are raw row-major bytes of `elem` bytes per element (dtype_bits / 8: only
/// whole-byte dtypes reach these kernels), with no alignment requirement. Outputs are
/// contiguous, row-major, and must not overlap inputs. The engine validates recipes before
/// calling these; they still check every size and rank against the buffers and throw
/// eredu::Error with errc::invalid_argument, naming the numbers, before writing anything,
/// so they never write out of bounds. Parallel work runs in the caller's tbb::task_arena.

#include <cstddef>
#include <span>

#include "eredu/core/selection.hpp"
#include "eredu/core/shape.hpp"

namespace eredu::cpu {

/// Bytes of output each parallel task of the layout kernels writes, about: small enough to stay in L2.
inline constexpr std::size_t layout_block_bytes = std::size_t{64} << 10;

/// Copies to `out` the sub-tensor of `in` (shape `in_shape`) whose dimension `dim` is restricted
/// to `range`, contiguous and row-major: out holds in_shape with in_shape[dim] = range.size().
void copy_slice(std::span<const std::byte> in, const Shape& in_shape, std::size_t elem, std::size_t dim, Range range,
                std::span<std::byte> out);

/// One input of concat(): a row-major tensor's bytes and its shape.
struct ConcatInput {
  std::span<const std::byte> bytes{};  ///< row-major elements, exactly shape's element count x elem bytes
  Shape shape{};                       ///< dimensions; all inputs share rank and every dimension but the concat one
};

/// Concatenates `inputs`, in order, along dimension `dim` into `out` (the shape of the inputs
/// with dimension `dim` summed). Fused QKV or gate+up weights concatenate along dim 0.
void concat(std::span<const ConcatInput> inputs, std::size_t dim, std::size_t elem, std::span<std::byte> out);

/// Permutes the dimensions of `in` (shape `in_shape`) into `out`, whose dimension i is
/// in_shape[order[i]]. A swap of the last two dimensions (after merging dimensions that stay
/// adjacent and dropping those of size 1) runs as a cache-blocked tiled transpose; other
/// orders use a general strided copy.
void permute(std::span<const std::byte> in, const Shape& in_shape, std::size_t elem, std::span<const std::size_t> order,
             std::span<std::byte> out);

}  // namespace eredu::cpu
