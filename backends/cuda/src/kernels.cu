// The CUDA backend's kernels: dtype conversion, strided row copies, permutation.
#include "eredu/cuda/kernels.hpp"

#include <cuda_runtime.h>

#include <cstdint>

#include "dequantize.cuh"
#include "eredu/core/float_formats.hpp"

namespace eredu::cuda {
namespace {

constexpr unsigned block_threads = 256;

// A grid large enough to keep every SM busy with a grid-stride loop, small enough that the
// loop, not the launch, covers very large tensors.
unsigned grid_for(std::size_t work) {
  const std::size_t blocks = (work + block_threads - 1) / block_threads;
  return static_cast<unsigned>(blocks < 65535 ? (blocks == 0 ? 1 : blocks) : 65535);
}

// Element functions over bit patterns: the core reference's conversions, as functors the
// kernel template can inline.
template <class In, class Out, Out (*Element)(In) noexcept>
struct Elementwise {
  __device__ Out operator()(In v) const { return Element(v); }
};

template <class In, class Out, class Fn>
__global__ void convert_kernel(const In* __restrict__ in, Out* __restrict__ out, std::size_t n) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    out[i] = Fn{}(in[i]);
}

template <class In, class Out, class Fn>
cudaError_t run_convert(const void* in, void* out, std::size_t n, cudaStream_t stream) {
  convert_kernel<In, Out, Fn>
      <<<grid_for(n), block_threads, 0, stream>>>(static_cast<const In*>(in), static_cast<Out*>(out), n);
  return cudaGetLastError();
}

// Queues the conversion of n elements (see launch_convert).
using ConvertLauncher = cudaError_t (*)(const void* in, void* out, std::size_t n, cudaStream_t stream);

// The launcher for a cast between distinct dtypes, or nullptr: the backend's cast table,
// which convert_supported reports and the tests hold to eredu::is_supported_cast.
ConvertLauncher find_convert(DType from, DType to) noexcept {
  namespace f = formats;
  using D = DType;
  using u8 = std::uint8_t;
  using u16 = std::uint16_t;
  using u32 = std::uint32_t;
  if (from == D::BF16 && to == D::F32) return run_convert<u16, u32, Elementwise<u16, u32, f::bf16_to_f32>>;
  if (from == D::F32 && to == D::BF16) return run_convert<u32, u16, Elementwise<u32, u16, f::f32_to_bf16>>;
  if (from == D::F16 && to == D::F32) return run_convert<u16, u32, Elementwise<u16, u32, f::f16_to_f32>>;
  if (from == D::F32 && to == D::F16) return run_convert<u32, u16, Elementwise<u32, u16, f::f32_to_f16>>;
  if (from == D::BF16 && to == D::F16) return run_convert<u16, u16, Elementwise<u16, u16, f::bf16_to_f16>>;
  if (from == D::F16 && to == D::BF16) return run_convert<u16, u16, Elementwise<u16, u16, f::f16_to_bf16>>;
  if (from == D::F8_E4M3 && to == D::F32) return run_convert<u8, u32, Elementwise<u8, u32, f::f8_e4m3_to_f32>>;
  if (from == D::F8_E5M2 && to == D::F32) return run_convert<u8, u32, Elementwise<u8, u32, f::f8_e5m2_to_f32>>;
  if (from == D::F8_E8M0 && to == D::F32) return run_convert<u8, u32, Elementwise<u8, u32, f::f8_e8m0_to_f32>>;
  if (from == D::F8_E4M3 && to == D::BF16) return run_convert<u8, u16, Elementwise<u8, u16, f::f8_e4m3_to_bf16>>;
  if (from == D::F8_E5M2 && to == D::BF16) return run_convert<u8, u16, Elementwise<u8, u16, f::f8_e5m2_to_bf16>>;
  if (from == D::F8_E8M0 && to == D::BF16) return run_convert<u8, u16, Elementwise<u8, u16, f::f8_e8m0_to_bf16>>;
  return nullptr;
}

// Words of W bytes: the widest unit that divides every address, stride and length of a copy.
template <std::size_t W>
struct alignas(W) Word {
  unsigned char b[W];
};

template <std::size_t W>
__global__ void copy_rows_kernel(unsigned char* dst, std::size_t dst_stride, const unsigned char* src,
                                 std::size_t src_stride, std::size_t rows, std::size_t row_words) {
  const std::size_t total = rows * row_words;
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += stride) {
    const std::size_t r = i / row_words, w = i % row_words;
    reinterpret_cast<Word<W>*>(dst + r * dst_stride)[w] = reinterpret_cast<const Word<W>*>(src + r * src_stride)[w];
  }
}

template <std::size_t W>
cudaError_t run_copy_rows(void* dst, std::size_t dst_stride, const void* src, std::size_t src_stride, std::size_t rows,
                          std::size_t row_bytes, cudaStream_t stream) {
  const std::size_t words = row_bytes / W;
  copy_rows_kernel<W><<<grid_for(rows * words), block_threads, 0, stream>>>(
      static_cast<unsigned char*>(dst), dst_stride, static_cast<const unsigned char*>(src), src_stride, rows, words);
  return cudaGetLastError();
}

// Dimensions and strides of a permutation, passed by value to the kernel.
struct PermuteShape {
  std::size_t rank;
  std::size_t out_dims[max_permute_rank];
  std::size_t in_strides[max_permute_rank];  // input stride (in elements) of output dim i
};

// One thread per output element, in output order: writes are coalesced, reads gather.
template <std::size_t E>
__global__ void permute_kernel(const unsigned char* in, unsigned char* out, PermuteShape s, std::size_t n,
                               std::size_t elem) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    std::size_t rest = i, offset = 0;
    for (std::size_t k = s.rank; k-- > 0;) {
      offset += (rest % s.out_dims[k]) * s.in_strides[k];
      rest /= s.out_dims[k];
    }
    if constexpr (E == 0) {
      for (std::size_t b = 0; b < elem; ++b) out[i * elem + b] = in[offset * elem + b];
    } else {
      reinterpret_cast<Word<E>*>(out)[i] = reinterpret_cast<const Word<E>*>(in)[offset];
    }
  }
}

template <std::size_t E>
cudaError_t run_permute(const void* in, void* out, const PermuteShape& s, std::size_t n, std::size_t elem,
                        cudaStream_t stream) {
  permute_kernel<E><<<grid_for(n), block_threads, 0, stream>>>(static_cast<const unsigned char*>(in),
                                                               static_cast<unsigned char*>(out), s, n, elem);
  return cudaGetLastError();
}

bool aligned(std::uintptr_t v, std::size_t w) { return v % w == 0; }

__global__ void sleep_kernel(unsigned microseconds) {
  // __nanosleep takes at most about 1 ms per call; loop on the global timer instead.
  unsigned long long t0 = 0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  for (;;) {
    unsigned long long t = 0;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    if (t - t0 >= 1000ull * microseconds) break;
    __nanosleep(1000);
  }
}

}  // namespace

bool convert_supported(DType from, DType to) noexcept {
  return from == to || find_convert(from, to) != nullptr || detail::dequantize_supported(from, to);
}

cudaError_t launch_convert(DType from, DType to, const void* in, void* out, std::size_t count,
                           cudaStream_t stream) noexcept {
  if (count == 0) return cudaSuccess;
  const DTypeBlock block = dtype_block(from);
  if (from == to) {
    return cudaMemcpyAsync(out, in, count / block.elements * block.bytes, cudaMemcpyDeviceToDevice, stream);
  }
  if (dtype_is_quantized(from)) return detail::launch_dequantize(from, to, in, out, count / block.elements, stream);
  const ConvertLauncher run = find_convert(from, to);
  return run != nullptr ? run(in, out, count, stream) : cudaErrorInvalidValue;
}

cudaError_t launch_copy_rows(void* dst, std::size_t dst_stride, const void* src, std::size_t src_stride,
                             std::size_t rows, std::size_t row_bytes, cudaStream_t stream) noexcept {
  if (rows == 0 || row_bytes == 0) return cudaSuccess;
  const auto d = reinterpret_cast<std::uintptr_t>(dst), s = reinterpret_cast<std::uintptr_t>(src);
  auto fits = [&](std::size_t w) {
    return aligned(d, w) && aligned(s, w) && dst_stride % w == 0 && src_stride % w == 0 && row_bytes % w == 0;
  };
  if (fits(16)) return run_copy_rows<16>(dst, dst_stride, src, src_stride, rows, row_bytes, stream);
  if (fits(8)) return run_copy_rows<8>(dst, dst_stride, src, src_stride, rows, row_bytes, stream);
  if (fits(4)) return run_copy_rows<4>(dst, dst_stride, src, src_stride, rows, row_bytes, stream);
  if (fits(2)) return run_copy_rows<2>(dst, dst_stride, src, src_stride, rows, row_bytes, stream);
  return run_copy_rows<1>(dst, dst_stride, src, src_stride, rows, row_bytes, stream);
}

cudaError_t launch_permute(const void* in, void* out, const std::size_t* dims, const std::size_t* order,
                           std::size_t rank, std::size_t elem, cudaStream_t stream) noexcept {
  if (rank == 0 || rank > max_permute_rank || elem == 0) return cudaErrorInvalidValue;
  std::size_t in_strides[max_permute_rank];
  std::size_t n = 1;
  for (std::size_t k = rank; k-- > 0;) {
    in_strides[k] = n;
    n *= dims[k];
  }
  if (n == 0) return cudaSuccess;
  PermuteShape s{};
  s.rank = rank;
  for (std::size_t i = 0; i < rank; ++i) {
    s.out_dims[i] = dims[order[i]];
    s.in_strides[i] = in_strides[order[i]];
  }
  const auto a = reinterpret_cast<std::uintptr_t>(in) | reinterpret_cast<std::uintptr_t>(out);
  switch (elem) {
    case 1:
      return run_permute<1>(in, out, s, n, elem, stream);
    case 2:
      if (aligned(a, 2)) return run_permute<2>(in, out, s, n, elem, stream);
      break;
    case 4:
      if (aligned(a, 4)) return run_permute<4>(in, out, s, n, elem, stream);
      break;
    case 8:
      if (aligned(a, 8)) return run_permute<8>(in, out, s, n, elem, stream);
      break;
    case 16:
      if (aligned(a, 16)) return run_permute<16>(in, out, s, n, elem, stream);
      break;
    default:
      break;
  }
  return run_permute<0>(in, out, s, n, elem, stream);
}

cudaError_t launch_sleep(cudaStream_t stream, unsigned microseconds) noexcept {
  sleep_kernel<<<1, 1, 0, stream>>>(microseconds);
  return cudaGetLastError();
}

}  // namespace eredu::cuda
