#pragma once
/// \file
/// The CUDA backend's device kernels, as host functions that queue them on a stream:
/// dtype conversion (eredu/core/float_formats.hpp, bit for bit, as every backend), a
/// strided row copy (slice and concat), and a permutation (transpose).
///
/// These are the raw launchers: pointers are device addresses, sizes are trusted, and the
/// result is the launch status (cudaSuccess or the launch error); validation and error
/// messages are the caller's (backend.cpp checks every size against the tensors first).
/// Kernel faults surface asynchronously, through the stream's completion.

#include <cuda_runtime_api.h>

#include <cstddef>

#include "eredu/core/dtype.hpp"

namespace eredu::cuda {

/// Highest rank launch_permute handles.
inline constexpr std::size_t max_permute_rank = 8;

/// True when launch_convert has a kernel for `from` -> `to` (the backend's supports_cast):
/// any dtype to itself, among {F16, BF16, F32}, from {F8_E4M3, F8_E5M2, F8_E8M0} to {BF16,
/// F32}, and from a quantized dtype other than Q8_1 to {F32, BF16, F16} (dequantization by
/// the core reference, eredu/core/quant_formats.hpp) — exactly eredu::is_supported_cast,
/// which the tests check for every pair.
bool convert_supported(DType from, DType to) noexcept;

/// Queues the conversion of `count` elements from `in` (dtype `from`, naturally aligned) to
/// `out` (dtype `to`, naturally aligned); they must not overlap. `from == to` copies bytes.
/// A quantized `from` counts whole blocks' elements (count a multiple of its block).
cudaError_t launch_convert(DType from, DType to, const void* in, void* out, std::size_t count,
                           cudaStream_t stream) noexcept;

/// Queues a copy of `rows` rows of `row_bytes` bytes from `src` (rows `src_stride` bytes
/// apart) to `dst` (rows `dst_stride` bytes apart): a slice or one input of a concat.
cudaError_t launch_copy_rows(void* dst, std::size_t dst_stride, const void* src, std::size_t src_stride,
                             std::size_t rows, std::size_t row_bytes, cudaStream_t stream) noexcept;

/// Queues the permutation of a row-major tensor `in` of `rank` dimensions `dims` (elements
/// of `elem` bytes) into `out`, whose dimension i is dims[order[i]]. rank <= max_permute_rank.
cudaError_t launch_permute(const void* in, void* out, const std::size_t* dims, const std::size_t* order,
                           std::size_t rank, std::size_t elem, cudaStream_t stream) noexcept;

/// Queues a kernel that keeps `stream` busy for about `microseconds`: a diagnostic hook that
/// tests use to hold copies back, widening the window in which a lease released too early
/// would be overwritten under its copy.
cudaError_t launch_sleep(cudaStream_t stream, unsigned microseconds) noexcept;

}  // namespace eredu::cuda
