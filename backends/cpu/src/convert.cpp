#include "eredu/cpu/convert.hpp"

#include <fmt/format.h>
#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>
#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <cstdint>
#include <cstring>

#include "dequantize.hpp"
#include "eredu/core/error.hpp"
#include "eredu/core/float_formats.hpp"
#include "eredu/core/trace.hpp"

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#define EREDU_CONVERT_X86 1
#else
#define EREDU_CONVERT_X86 0
#endif

namespace eredu::cpu {
namespace {

// Checkpoint bytes carry no alignment guarantee (safetensors offsets are arbitrary), so
// every element is moved with memcpy, which compiles to a plain (vectorizable) load/store.
template <class T>
T load(const std::byte* p) noexcept {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

template <class T>
void store(std::byte* p, T v) noexcept {
  std::memcpy(p, &v, sizeof v);
}

// The element functions below are branchless rewrites of the core reference
// (eredu/core/float_formats.hpp), kept apart from it so the loops vectorize (all but
// f32 -> f16, whose per-lane shifts g++ 12 leaves scalar); the exhaustive tests hold them to
// the reference bit for bit. Lanes choose between results with all-ones masks because g++ 12
// does not if-convert nested ?: here.

// All ones when `c`, else zero.
std::uint32_t mask(bool c) noexcept { return 0u - static_cast<std::uint32_t>(c); }

std::uint32_t bf16_to_f32_bits(std::uint16_t h) noexcept { return std::uint32_t{h} << 16; }

std::uint16_t f32_to_bf16_bits(std::uint32_t x) noexcept {
  const std::uint32_t rounded = (x + 0x7FFFu + ((x >> 16) & 1u)) >> 16;
  const std::uint32_t quiet_nan = (x >> 16) | 0x0040u;
  const bool nan = (x & 0x7FFF'FFFFu) > 0x7F80'0000u;
  return static_cast<std::uint16_t>(nan ? quiet_nan : rounded);
}

std::uint32_t f16_to_f32_bits(std::uint16_t h) noexcept {
  const std::uint32_t sign = std::uint32_t{h & 0x8000u} << 16;
  const std::uint32_t em = h & 0x7FFFu;
  const std::uint32_t normal = (em << 13) + (112u << 23);
  const std::uint32_t inf_nan = (em << 13) | 0x7F80'0000u | (static_cast<std::uint32_t>(em > 0x7C00u) << 22);
  // A subnormal is em units of 2^-24; the int-to-float conversion and the power-of-two
  // scale are both exact, so this does not depend on the rounding mode.
  const std::uint32_t subnormal =
      std::bit_cast<std::uint32_t>(static_cast<float>(static_cast<std::int32_t>(em)) * 0x1p-24f);
  const std::uint32_t special = mask(em >= 0x7C00u), tiny = mask(em < 0x0400u);
  return sign | (inf_nan & special) | (subnormal & tiny) | (normal & ~(special | tiny));
}

std::uint16_t f32_to_f16_bits(std::uint32_t x) noexcept {
  const std::uint32_t sign = (x >> 16) & 0x8000u;
  const std::uint32_t a = x & 0x7FFF'FFFFu;
  // Normal range: rebias the exponent by -112 (mod 2^32) and round half to even at bit 13.
  const std::uint32_t normal = (a + 0xC800'0FFFu + ((a >> 13) & 1u)) >> 13;
  // Subnormal range: units of 2^-24 are m >> (126 - e); the shift is clamped so it stays
  // defined for every lane (values it clamps round to zero or are not selected).
  const std::uint32_t e = a >> 23;
  const auto s = static_cast<std::uint32_t>(std::clamp(126 - static_cast<std::int32_t>(e), 14, 31));
  const std::uint32_t m = (a & 0x7F'FFFFu) | 0x80'0000u;
  const std::uint32_t q = m >> s;
  const std::uint32_t rem = m & ((1u << s) - 1u);
  const std::uint32_t half = 1u << (s - 1u);
  const std::uint32_t subnormal = q + ((rem > half) | ((rem == half) & q & 1u));
  const std::uint32_t nan = 0x7E00u | ((a >> 13) & 0x3FFu);
  const std::uint32_t is_nan = mask(a > 0x7F80'0000u);
  const std::uint32_t is_inf = mask(a >= 0x477F'F000u) & ~is_nan;
  const std::uint32_t is_normal = mask(a >= 0x3880'0000u) & ~(is_nan | is_inf);
  const std::uint32_t is_subnormal = ~(is_nan | is_inf | is_normal);
  const std::uint32_t magnitude =
      (nan & is_nan) | (0x7C00u & is_inf) | (normal & is_normal) | (subnormal & is_subnormal);
  return static_cast<std::uint16_t>(sign | magnitude);
}

// FP8 inputs have 256 patterns: the kernels look each up in a table of the reference's
// results, built at compile time.
template <class To, To (*Element)(std::uint8_t) noexcept>
constexpr std::array<To, 256> f8_table() {
  std::array<To, 256> t{};
  for (unsigned i = 0; i < 256; ++i) t[i] = Element(static_cast<std::uint8_t>(i));
  return t;
}

constexpr auto e4m3_f32 = f8_table<std::uint32_t, formats::f8_e4m3_to_f32>();
constexpr auto e5m2_f32 = f8_table<std::uint32_t, formats::f8_e5m2_to_f32>();
constexpr auto e8m0_f32 = f8_table<std::uint32_t, formats::f8_e8m0_to_f32>();
constexpr auto e4m3_bf16 = f8_table<std::uint16_t, formats::f8_e4m3_to_bf16>();
constexpr auto e5m2_bf16 = f8_table<std::uint16_t, formats::f8_e5m2_to_bf16>();
constexpr auto e8m0_bf16 = f8_table<std::uint16_t, formats::f8_e8m0_to_bf16>();

// Converts n elements; input and output do not overlap (validated), hence __restrict.
using Kernel = void (*)(const std::byte* __restrict in, std::byte* __restrict out, std::size_t n);

template <class From, class To, To (*Element)(From) noexcept>
void map_kernel(const std::byte* __restrict in, std::byte* __restrict out, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) store<To>(out + i * sizeof(To), Element(load<From>(in + i * sizeof(From))));
}

#if EREDU_CONVERT_X86
// The same loop compiled for AVX2: the element functions inline into it and vectorize
// eight lanes wide instead of SSE2's four.
template <class From, class To, To (*Element)(From) noexcept>
__attribute__((target("avx2"))) void map_kernel_avx2(const std::byte* __restrict in, std::byte* __restrict out,
                                                     std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) store<To>(out + i * sizeof(To), Element(load<From>(in + i * sizeof(From))));
}

// Elements before `out` reaches a 32-byte boundary, so the vector stores after them are
// aligned (streaming stores require it).
std::size_t head_elements(const std::byte* out, std::size_t out_elem, std::size_t n) {
  const std::size_t misaligned = reinterpret_cast<std::uintptr_t>(out) % 32;
  if (misaligned == 0) return 0;
  if (misaligned % out_elem != 0) return n;  // never aligns: all scalar (not a tensor's layout)
  return std::min(n, (32 - misaligned) / out_elem);
}

// bf16 -> f32 widening, 16 elements per step. With `Stream`, the f32 results bypass the
// cache: a loader writes each output line once and does not read it back soon, and a
// streaming store skips the read of the line a normal store would do first.
template <bool Stream>
__attribute__((target("avx2"))) void bf16_to_f32_avx2(const std::byte* __restrict in, std::byte* __restrict out,
                                                      std::size_t n) {
  std::size_t i = head_elements(out, 4, n);
  map_kernel<std::uint16_t, std::uint32_t, bf16_to_f32_bits>(in, out, i);
  for (; i + 16 <= n; i += 16) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + 2 * i));
    const __m256i lo = _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm256_castsi256_si128(h)), 16);
    const __m256i hi = _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm256_extracti128_si256(h, 1)), 16);
    auto* o = reinterpret_cast<__m256i*>(out + 4 * i);
    if constexpr (Stream) {
      _mm256_stream_si256(o, lo);
      _mm256_stream_si256(o + 1, hi);
    } else {
      _mm256_store_si256(o, lo);
      _mm256_store_si256(o + 1, hi);
    }
  }
  map_kernel<std::uint16_t, std::uint32_t, bf16_to_f32_bits>(in + 2 * i, out + 4 * i, n - i);
  // Streaming stores are weakly ordered: fence before another thread may see "done".
  if constexpr (Stream) _mm_sfence();
}

// f16 -> f32 with F16C, which converts subnormals exactly and quiets NaNs keeping their
// payload, as f16_to_f32_bits does (the exhaustive tests check every pattern).
template <bool Stream>
__attribute__((target("avx2,f16c"))) void f16_to_f32_f16c(const std::byte* __restrict in, std::byte* __restrict out,
                                                          std::size_t n) {
  std::size_t i = head_elements(out, 4, n);
  map_kernel<std::uint16_t, std::uint32_t, f16_to_f32_bits>(in, out, i);
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + 2 * i)));
    auto* o = reinterpret_cast<float*>(out + 4 * i);
    if constexpr (Stream)
      _mm256_stream_ps(o, v);
    else
      _mm256_store_ps(o, v);
  }
  map_kernel<std::uint16_t, std::uint32_t, f16_to_f32_bits>(in + 2 * i, out + 4 * i, n - i);
  if constexpr (Stream) _mm_sfence();
}
#endif

template <class To, const std::array<To, 256>& Table>
void table_kernel(const std::byte* __restrict in, std::byte* __restrict out, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) store<To>(out + i * sizeof(To), Table[std::to_integer<std::uint8_t>(in[i])]);
}

void copy_kernel(const std::byte* __restrict in, std::byte* __restrict out, std::size_t n) {
  if (n != 0) std::memcpy(out, in, n);
}

#if EREDU_CONVERT_X86
// A byte copy with streaming stores: memcpy streams only above a threshold near the cache
// size, while a loader copies gigabytes in blocks far smaller than that.
__attribute__((target("avx2"))) void copy_stream_avx2(const std::byte* __restrict in, std::byte* __restrict out,
                                                      std::size_t n) {
  std::size_t i = std::min(n, (32 - reinterpret_cast<std::uintptr_t>(out) % 32) % 32);
  copy_kernel(in, out, i);
  for (; i + 64 <= n; i += 64) {
    const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + i));
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + i + 32));
    _mm256_stream_si256(reinterpret_cast<__m256i*>(out + i), a);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(out + i + 32), b);
  }
  copy_kernel(in + i, out + i, n - i);
  _mm_sfence();
}
#endif

std::uint16_t bf16_to_f16_bits(std::uint16_t h) noexcept { return f32_to_f16_bits(bf16_to_f32_bits(h)); }
std::uint16_t f16_to_bf16_bits(std::uint16_t h) noexcept { return f32_to_bf16_bits(f16_to_f32_bits(h)); }

// What the CPU offers, probed once.
struct Cpu {
  bool avx2 = false;
  bool f16c = false;
  bool avx512bf16 = false;  // with AVX512F, BW, VL, and the OS saving the AVX-512 state
};

Cpu probe_cpu() noexcept {
  Cpu c;
#if EREDU_CONVERT_X86
  __builtin_cpu_init();
  c.avx2 = __builtin_cpu_supports("avx2");
  // clang 14's __builtin_cpu_supports does not know "f16c": CPUID leaf 1, ECX bit 29. AVX2
  // being usable already means the OS saves the YMM registers F16C writes.
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  c.f16c = c.avx2 && __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & bit_F16C);
  // AVX512-BF16 (CPUID leaf 7.1, EAX bit 5) is usable only with F, BW and VL (leaf 7.0, EBX
  // bits 16, 30, 31) and an OS that saves the opmask and ZMM state (XCR0 bits 1, 2, 5-7).
  const bool osxsave = (ecx & bit_OSXSAVE) != 0;
  if (c.f16c && osxsave) {
    unsigned xcr0 = 0, xcr0_high = 0;
    __asm__("xgetbv" : "=a"(xcr0), "=d"(xcr0_high) : "c"(0));
    const bool os_avx512 = (xcr0 & 0xE6u) == 0xE6u;
    const bool fbwvl = __get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) && (ebx & (1u << 16)) && (ebx & (1u << 30)) &&
                       (ebx & (1u << 31));
    c.avx512bf16 = os_avx512 && fbwvl && __get_cpuid_count(7, 1, &eax, &ebx, &ecx, &edx) && (eax & (1u << 5));
  }
#endif
  return c;
}

const Cpu& cpu_features() noexcept {
  static const Cpu c = probe_cpu();
  return c;
}

std::atomic<ConvertIsa> wanted_isa{ConvertIsa::best};

// True when the AVX2 kernels are to be used: the CPU has them and they were not turned off.
bool use_avx2() noexcept {
  return cpu_features().avx2 && wanted_isa.load(std::memory_order_relaxed) != ConvertIsa::generic;
}

// The dequantization kernels in effect.
detail::DequantizeIsa dequantize_isa() noexcept {
  if (!use_avx2() || !cpu_features().f16c) return detail::DequantizeIsa::portable;
  const bool best = wanted_isa.load(std::memory_order_relaxed) == ConvertIsa::best;
  return best && cpu_features().avx512bf16 ? detail::DequantizeIsa::avx512bf16 : detail::DequantizeIsa::avx2_f16c;
}

// The portable kernel for a supported cast between distinct dtypes, or nullptr.
Kernel find_generic_kernel(DType from, DType to) noexcept {
  using D = DType;
  using u16 = std::uint16_t;
  using u32 = std::uint32_t;
  if (from == D::BF16 && to == D::F32) return map_kernel<u16, u32, bf16_to_f32_bits>;
  if (from == D::F32 && to == D::BF16) return map_kernel<u32, u16, f32_to_bf16_bits>;
  if (from == D::F16 && to == D::F32) return map_kernel<u16, u32, f16_to_f32_bits>;
  if (from == D::F32 && to == D::F16) return map_kernel<u32, u16, f32_to_f16_bits>;
  if (from == D::BF16 && to == D::F16) return map_kernel<u16, u16, bf16_to_f16_bits>;
  if (from == D::F16 && to == D::BF16) return map_kernel<u16, u16, f16_to_bf16_bits>;
  if (from == D::F8_E4M3 && to == D::F32) return table_kernel<u32, e4m3_f32>;
  if (from == D::F8_E5M2 && to == D::F32) return table_kernel<u32, e5m2_f32>;
  if (from == D::F8_E8M0 && to == D::F32) return table_kernel<u32, e8m0_f32>;
  if (from == D::F8_E4M3 && to == D::BF16) return table_kernel<u16, e4m3_bf16>;
  if (from == D::F8_E5M2 && to == D::BF16) return table_kernel<u16, e5m2_bf16>;
  if (from == D::F8_E8M0 && to == D::BF16) return table_kernel<u16, e8m0_bf16>;
  return nullptr;
}

// The kernel convert() runs for a supported cast (nullptr if unsupported; from == to is a
// byte copy): the AVX2 / F16C one when use_avx2(), else the portable one. `stream` picks
// cache-bypassing stores where a kernel has them.
Kernel find_kernel(DType from, DType to, bool stream) noexcept {
  // Dequantization kernels live in dequantize.cpp; their unit is a block.
  if (from != to && dtype_is_quantized(from)) return detail::find_dequantize_kernel(from, to, dequantize_isa(), stream);
#if EREDU_CONVERT_X86
  using D = DType;
  using u16 = std::uint16_t;
  using u32 = std::uint32_t;
  const Cpu& cpu = cpu_features();
  if (use_avx2()) {
    if (from == to) return stream ? copy_stream_avx2 : copy_kernel;
    if (from == D::BF16 && to == D::F32) return stream ? bf16_to_f32_avx2<true> : bf16_to_f32_avx2<false>;
    if (from == D::F16 && to == D::F32 && cpu.f16c) return stream ? f16_to_f32_f16c<true> : f16_to_f32_f16c<false>;
    if (from == D::F32 && to == D::BF16) return map_kernel_avx2<u32, u16, f32_to_bf16_bits>;
    if (from == D::F16 && to == D::F32) return map_kernel_avx2<u16, u32, f16_to_f32_bits>;
    if (from == D::F32 && to == D::F16) return map_kernel_avx2<u32, u16, f32_to_f16_bits>;
    if (from == D::BF16 && to == D::F16) return map_kernel_avx2<u16, u16, bf16_to_f16_bits>;
    if (from == D::F16 && to == D::BF16) return map_kernel_avx2<u16, u16, f16_to_bf16_bits>;
  }
#else
  (void)stream;
#endif
  return from == to ? copy_kernel : find_generic_kernel(from, to);
}

// What a validated conversion runs: the kernel and the bytes of one of its elements on
// each side (a same-dtype copy counts single bytes, which also covers sub-byte dtypes).
struct Plan {
  Kernel kernel = nullptr;
  std::size_t in_elem = 1;
  std::size_t out_elem = 1;
  std::size_t count = 0;  // elements
};

Plan validate(DType from, DType to, std::span<const std::byte> in, std::span<std::byte> out,
              ConvertStores stores = ConvertStores::automatic) {
  if (!convert_supported(from, to))
    throw Error(errc::recipe_unsupported_cast, {},
                fmt::format("the CPU backend cannot convert {} to {}", dtype_name(from), dtype_name(to)));
  Plan plan;
  plan.kernel = find_kernel(from, to, stores == ConvertStores::streaming || out.size() >= convert_stream_bytes);
  if (from == to) {
    if (in.size() != out.size())
      throw Error(errc::invalid_argument, {},
                  fmt::format("copying {} needs equal sizes, but the input has {} bytes and the output {} bytes",
                              dtype_name(from), in.size(), out.size()));
  } else {
    const ConvertUnits units = convert_units(from, to);
    plan.in_elem = units.in_bytes;
    plan.out_elem = units.out_bytes;
    if (in.size() % plan.in_elem != 0 || out.size() % plan.out_elem != 0 ||
        in.size() / plan.in_elem != out.size() / plan.out_elem)
      throw Error(errc::invalid_argument, {},
                  fmt::format("converting {} to {}: {} input bytes ({} per element) and {} output bytes ({} per "
                              "element) do not hold the same whole number of elements",
                              dtype_name(from), dtype_name(to), in.size(), plan.in_elem, out.size(), plan.out_elem));
  }
  plan.count = out.size() / plan.out_elem;
  if (!in.empty() && !out.empty()) {
    const auto in_begin = reinterpret_cast<std::uintptr_t>(in.data());
    const auto out_begin = reinterpret_cast<std::uintptr_t>(out.data());
    if (in_begin < out_begin + out.size() && out_begin < in_begin + in.size())
      throw Error(errc::invalid_argument, {},
                  fmt::format("converting {} to {}: the {}-byte input and the {}-byte output overlap", dtype_name(from),
                              dtype_name(to), in.size(), out.size()));
  }
  return plan;
}

}  // namespace

ConvertIsa use_convert_isa(ConvertIsa wanted) noexcept {
  wanted_isa.store(wanted, std::memory_order_relaxed);
  return use_avx2() ? wanted : ConvertIsa::generic;
}

const char* convert_isa_name() noexcept {
  if (!use_avx2()) return "generic";
  if (dequantize_isa() == detail::DequantizeIsa::avx512bf16) return "avx2+f16c+avx512bf16";
  return cpu_features().f16c ? "avx2+f16c" : "avx2";
}

bool convert_supported(DType from, DType to) noexcept {
  // What the kernels implement, not a second copy of the rule: the tests hold this to
  // eredu::is_supported_cast, the one definition.
  return from == to || find_generic_kernel(from, to) != nullptr ||
         (dtype_is_quantized(from) &&
          detail::find_dequantize_kernel(from, to, detail::DequantizeIsa::portable, false) != nullptr);
}

ConvertUnits convert_units(DType from, DType to) noexcept {
  if (from == to) return {1, 1};
  const DTypeBlock block = dtype_block(from);
  return {block.bytes, std::size_t{block.elements} * (dtype_bits(to) / 8)};
}

void convert_serial(DType from, DType to, std::span<const std::byte> in, std::span<std::byte> out) {
  convert_serial(from, to, in, out, ConvertStores::automatic);
}

void convert_serial(DType from, DType to, std::span<const std::byte> in, std::span<std::byte> out,
                    ConvertStores stores) {
  const Plan plan = validate(from, to, in, out, stores);
  plan.kernel(in.data(), out.data(), plan.count);
}

void convert(DType from, DType to, std::span<const std::byte> in, std::span<std::byte> out) {
  const Plan plan = validate(from, to, in, out);
  const std::size_t per_block = std::max<std::size_t>(1, convert_block_bytes / plan.out_elem);
  if (plan.count <= per_block) {
    trace::Span span(
        "convert", "cpu",
        trace::enabled() ? fmt::format("{} to {}: {} elements", dtype_name(from), dtype_name(to), plan.count) : "");
    plan.kernel(in.data(), out.data(), plan.count);
    return;
  }
  const std::size_t blocks = (plan.count + per_block - 1) / per_block;
  // Blocks are fixed by index (not by the partitioner's splits) so each covers whole
  // elements and about one block of output, however TBB groups them.
  tbb::parallel_for(tbb::blocked_range<std::size_t>(0, blocks), [&](const tbb::blocked_range<std::size_t>& r) {
    trace::Span span(
        "convert", "cpu",
        trace::enabled() ? fmt::format("{} to {}: {} blocks", dtype_name(from), dtype_name(to), r.size()) : "");
    for (std::size_t b = r.begin(); b != r.end(); ++b) {
      const std::size_t first = b * per_block;
      const std::size_t n = std::min(per_block, plan.count - first);
      plan.kernel(in.data() + first * plan.in_elem, out.data() + first * plan.out_elem, n);
    }
  });
}

}  // namespace eredu::cpu
