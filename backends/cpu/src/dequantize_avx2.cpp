// The AVX2 dequantization kernels of the CPU backend (see dequantize.hpp).
//
// The common types (Q4_0, Q4_1, Q8_0 and the K-quants) are written by hand, because the core
// reference, even auto-vectorized, decodes through a scratch block of floats and rounds to
// bf16 one value at a time (0.1-0.2x the write-bandwidth limit on bf16). Each block is split
// into its integer values (byte shuffles, 32 at a time, into a small int8 array) and its
// per-sub-block scales and mins (scalar, with the reference's own mul); then one loop turns
// 16 values at a time into floats with the reference's expression — the same IEEE operations
// in the same order, eight lanes wide (no FMA: this file is compiled with -ffp-contract=off and
// its target has no FMA) — and stores them as f32 or as bf16 rounded in registers. The other
// types keep the reference's decoder into a scratch block and only share the stores.
// tests/gguf/test_dequantize.cpp holds every kernel here to ggml's output and to the portable
// kernels on random blocks, NaN and infinite scales included.
#include "dequantize.hpp"

#if defined(__x86_64__)

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "eredu/core/float_formats.hpp"
#include "eredu/core/quant_formats.hpp"

// Every function here is compiled for AVX2 and F16C (every AVX2 CPU has F16C; the caller
// checks both).
#define EREDU_AVX2 __attribute__((target("avx2,f16c")))

namespace eredu::cpu::detail {
namespace {

// How a kernel writes its values. The streaming forms need a 32-byte aligned output (the
// kernels fall back to the plain form otherwise).
enum class Out { f32, f32_stream, bf16, bf16_stream, f16 };

constexpr bool is_bf16(Out o) noexcept { return o == Out::bf16 || o == Out::bf16_stream; }
constexpr bool is_stream(Out o) noexcept { return o == Out::f32_stream || o == Out::bf16_stream; }

// The reference's expression for one value q of a sub-block with scale s and min m.
enum class Form {
  mul,      // s * q                (Q4_0, Q8_0, Q3_K, Q6_K)
  mul_sub,  // s * q - m            (Q2_K, Q4_K, Q5_K)
  mul_add,  // q * s + m            (Q4_1)
};

// The f16 at `p` widened to f32. F16C's conversion is exact and quiets a signalling NaN, as
// formats::f16_to_f32 does: the same bits, without the reference's branches and call.
EREDU_AVX2 inline float half(const std::uint8_t* p) noexcept {
  return _cvtsh_ss(static_cast<unsigned short>(quant::u16le(p)));
}

template <Form F>
EREDU_AVX2 inline __m256 apply(__m256 x, __m256 s, __m256 m) noexcept {
  if constexpr (F == Form::mul) {
    (void)m;
    return _mm256_mul_ps(s, x);
  } else if constexpr (F == Form::mul_sub) {
    return _mm256_sub_ps(_mm256_mul_ps(s, x), m);
  } else {
    return _mm256_add_ps(_mm256_mul_ps(x, s), m);
  }
}

// Eight f32 lanes whose high halves are their bf16 roundings (round to nearest even, as
// formats::f32_to_bf16; the low halves are left over). `MaybeNan`: a NaN lane is truncated and
// quieted instead; without it no lane may hold a NaN.
template <bool MaybeNan>
EREDU_AVX2 inline __m256i bf16_high(__m256 v) noexcept {
  const __m256i x = _mm256_castps_si256(v);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(1));
  const __m256i rounded = _mm256_add_epi32(_mm256_add_epi32(x, _mm256_set1_epi32(0x7FFF)), lsb);
  if constexpr (!MaybeNan) {
    return rounded;
  } else {
    const __m256i quiet = _mm256_or_si256(x, _mm256_set1_epi32(0x0040'0000));
    const __m256i nan =
        _mm256_cmpgt_epi32(_mm256_and_si256(x, _mm256_set1_epi32(0x7FFF'FFFF)), _mm256_set1_epi32(0x7F80'0000));
    return _mm256_or_si256(_mm256_and_si256(nan, quiet), _mm256_andnot_si256(nan, rounded));
  }
}

template <Out O>
EREDU_AVX2 inline void store_line_half(std::byte* out, __m256i v) noexcept {
  if constexpr (is_stream(O)) {
    _mm256_stream_si256(reinterpret_cast<__m256i*>(out), v);
  } else {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), v);
  }
}

// Stores values i ... i + 31 of a block's output, in order in v[0] to v[3], in form O (see
// bf16_high for MaybeNan). A whole 64-byte line of bf16 at a time: streaming stores that fill
// half a line, one loop iteration apart, halved the bf16 rate.
template <Out O, bool MaybeNan>
EREDU_AVX2 inline void store32(std::byte* out, std::size_t i, const __m256 (&v)[4]) noexcept {
  if constexpr (O == Out::f32 || O == Out::f32_stream) {
    for (int k = 0; k < 4; ++k) store_line_half<O>(out + 4 * (i + 8 * k), _mm256_castps_si256(v[k]));
  } else if constexpr (is_bf16(O)) {
    for (int k = 0; k < 2; ++k) {
      // packus interleaves the 128-bit lanes of its operands; the permute puts them back.
      const __m256i lo = _mm256_srli_epi32(bf16_high<MaybeNan>(v[2 * k]), 16);
      const __m256i hi = _mm256_srli_epi32(bf16_high<MaybeNan>(v[2 * k + 1]), 16);
      store_line_half<O>(out + 2 * (i + 16 * k), _mm256_permute4x64_epi64(_mm256_packus_epi32(lo, hi), 0xD8));
    }
  } else {
    alignas(32) float f[32];
    for (int k = 0; k < 4; ++k) _mm256_store_ps(f + 8 * k, v[k]);
    for (std::size_t j = 0; j < 32; ++j) {
      const std::uint16_t h = formats::f32_to_f16(quant::to_bits(f[j]));
      std::memcpy(out + 2 * (i + j), &h, sizeof h);
    }
  }
}

// One block's output from its integer values `q` (N of them, a multiple of 32) and the scale
// (and min) of each sub-block of 2^SubShift values (at least 16).
template <Out O, Form F, std::size_t N, unsigned SubShift, bool MaybeNan>
EREDU_AVX2 inline void emit_values(const std::int8_t* q, const float* scale, const float* min,
                                   std::byte* out) noexcept {
  // scale * 2^-24 is exact and (scale * 2^-24) * (q * 2^24) rounds as scale * q: every scale
  // here is 0, a NaN, an infinity or at least 2^-24 in magnitude (an f16 times a nonzero
  // integer), so neither it nor a product comes near the subnormals.
  alignas(32) float scale24[16];
  if constexpr (is_bf16(O)) {
    constexpr std::size_t scales = N >> SubShift;
    if constexpr (scales % 8 == 0) {
      for (std::size_t k = 0; k < scales; k += 8)
        _mm256_store_ps(scale24 + k, _mm256_mul_ps(_mm256_loadu_ps(scale + k), _mm256_set1_ps(0x1p-24f)));
    } else {
      for (std::size_t k = 0; k < scales; ++k) scale24[k] = scale[k] * 0x1p-24f;
    }
  }
  for (std::size_t i = 0; i < N; i += 32) {
    if constexpr (is_bf16(O)) {
      // bf16: each 16 values as their even and odd elements, so that one blend of the two
      // roundings puts every bf16 in its place (no pack, no permute). One shuffle picks them,
      // each into the top byte of its lane: q * 2^24, which scale * 2^-24 turns back exactly.
      const __m256i even_at = _mm256_setr_epi8(-1, -1, -1, 0, -1, -1, -1, 2, -1, -1, -1, 4, -1, -1, -1, 6,  //
                                               -1, -1, -1, 8, -1, -1, -1, 10, -1, -1, -1, 12, -1, -1, -1, 14);
      const __m256i odd_at = _mm256_setr_epi8(-1, -1, -1, 1, -1, -1, -1, 3, -1, -1, -1, 5, -1, -1, -1, 7,  //
                                              -1, -1, -1, 9, -1, -1, -1, 11, -1, -1, -1, 13, -1, -1, -1, 15);
      __m256i line[2];
      for (std::size_t k = 0; k < 2; ++k) {
        const std::size_t at = i + 16 * k;
        const __m256i w = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q + at)));
        const __m256 even = _mm256_cvtepi32_ps(_mm256_shuffle_epi8(w, even_at));
        const __m256 odd = _mm256_cvtepi32_ps(_mm256_shuffle_epi8(w, odd_at));
        const __m256 s = _mm256_set1_ps(scale24[at >> SubShift]);
        const __m256 m = F == Form::mul ? s : _mm256_set1_ps(min[at >> SubShift]);
        const __m256i e = _mm256_srli_epi32(bf16_high<MaybeNan>(apply<F>(even, s, m)), 16);
        line[k] = _mm256_blend_epi16(e, bf16_high<MaybeNan>(apply<F>(odd, s, m)), 0xAA);
      }
      store_line_half<O>(out + 2 * i, line[0]);
      store_line_half<O>(out + 2 * i + 32, line[1]);
    } else {
      __m256 v[4];
      for (std::size_t k = 0; k < 4; ++k) {
        // Eight bytes at a time: the widening takes them straight from memory.
        const std::size_t at = i + 8 * k;
        const __m256 x =
            _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(q + at))));
        const __m256 s = _mm256_set1_ps(scale[at >> SubShift]);
        v[k] = apply<F>(x, s, F == Form::mul ? s : _mm256_set1_ps(min[at >> SubShift]));
      }
      store32<O, MaybeNan>(out, i, v);
    }
  }
}

// emit_values, told whether the block's f16 scales are `finite`: then no value is a NaN —
// every scale and min is a finite f16 times an integer below 64, every value that times an
// integer below 128, and none of them comes near overflow — and bf16 skips the NaN check.
template <Out O, Form F, std::size_t N, unsigned SubShift>
EREDU_AVX2 inline void emit(const std::int8_t* q, const float* scale, const float* min, bool finite,
                            std::byte* out) noexcept {
  if (finite) {
    emit_values<O, F, N, SubShift, false>(q, scale, min, out);
  } else {
    emit_values<O, F, N, SubShift, true>(q, scale, min, out);
  }
}

// scale[j] = d * float(ints[j]) for eight integers (the reference's mul, eight lanes wide).
EREDU_AVX2 inline void times(float d, __m256i ints, float* scale) noexcept {
  _mm256_storeu_ps(scale, _mm256_mul_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(ints)));
}
// The eight bytes at `p`, widened to i32 lanes (signed or not).
EREDU_AVX2 inline __m256i widen_u8(const std::uint8_t* p) noexcept {
  return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
}
EREDU_AVX2 inline __m256i widen_i8(const std::uint8_t* p) noexcept {
  return _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
}

// True when the f16 at `p` is finite.
EREDU_AVX2 inline bool finite_half(const std::uint8_t* p) noexcept { return (quant::u16le(p) & 0x7C00u) != 0x7C00u; }

EREDU_AVX2 inline __m256i load32(const std::uint8_t* p) noexcept {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
}
EREDU_AVX2 inline void store_bytes(std::int8_t* p, __m256i v) noexcept {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), v);
}
EREDU_AVX2 inline __m256i bytes(int v) noexcept { return _mm256_set1_epi8(static_cast<char>(v)); }
// Bit `from` of every byte of `v`, moved to bit `to` of the byte (the other bits clear). A
// 16-bit shift moves both bytes of a word alike, and the mask drops what crossed between them.
EREDU_AVX2 inline __m256i bit_to(__m256i v, int from, int to) noexcept {
  const __m256i moved = to >= from ? _mm256_slli_epi16(v, to - from) : _mm256_srli_epi16(v, from - to);
  return _mm256_and_si256(moved, bytes(1 << to));
}
// The 2-bit field at `shift` of every byte of `v`.
EREDU_AVX2 inline __m256i crumbs(__m256i v, int shift) noexcept {
  return _mm256_and_si256(_mm256_srli_epi16(v, shift), bytes(3));
}
// The 2-bit field at `shift` of every byte of `v`, moved to bits 4-5 (Q6_K's high bits; a
// crumb shifted by 4 stays within its byte).
EREDU_AVX2 inline __m256i high(__m256i v, int shift) noexcept { return _mm256_slli_epi16(crumbs(v, shift), 4); }
EREDU_AVX2 inline __m256i low_nibbles(__m256i v) noexcept { return _mm256_and_si256(v, bytes(0x0F)); }
EREDU_AVX2 inline __m256i high_nibbles(__m256i v) noexcept {
  return _mm256_and_si256(_mm256_srli_epi16(v, 4), bytes(0x0F));
}

// ---- one block of each hand-written type (layouts: eredu/core/quant_formats.hpp) ----

template <Out O>
EREDU_AVX2 inline void q4_0_block(const std::uint8_t* b, std::byte* out) noexcept {
  alignas(32) std::int8_t q[32];
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 2));
  const __m128i nib = _mm_set1_epi8(0x0F), eight = _mm_set1_epi8(8);
  _mm_store_si128(reinterpret_cast<__m128i*>(q), _mm_sub_epi8(_mm_and_si128(v, nib), eight));
  _mm_store_si128(reinterpret_cast<__m128i*>(q + 16), _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(v, 4), nib), eight));
  const float d = half(b);
  emit<O, Form::mul, 32, 5>(q, &d, nullptr, finite_half(b), out);
}

template <Out O>
EREDU_AVX2 inline void q4_1_block(const std::uint8_t* b, std::byte* out) noexcept {
  alignas(32) std::int8_t q[32];
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 4));
  const __m128i nib = _mm_set1_epi8(0x0F);
  _mm_store_si128(reinterpret_cast<__m128i*>(q), _mm_and_si128(v, nib));
  _mm_store_si128(reinterpret_cast<__m128i*>(q + 16), _mm_and_si128(_mm_srli_epi16(v, 4), nib));
  const float d = half(b), m = half(b + 2);
  emit<O, Form::mul_add, 32, 5>(q, &d, &m, finite_half(b) && finite_half(b + 2), out);
}

template <Out O>
EREDU_AVX2 inline void q8_0_block(const std::uint8_t* b, std::byte* out) noexcept {
  const float d = half(b);
  emit<O, Form::mul, 32, 5>(reinterpret_cast<const std::int8_t*>(b + 2), &d, nullptr, finite_half(b), out);
}

template <Out O>
EREDU_AVX2 inline void q2_k_block(const std::uint8_t* b, std::byte* out) noexcept {
  alignas(32) std::int8_t q[256];
  for (int n = 0; n < 2; ++n) {
    const __m256i v = load32(b + 16 + 32 * n);
    for (int s = 0; s < 4; ++s) store_bytes(q + 128 * n + 32 * s, crumbs(v, 2 * s));
  }
  const float d = half(b + 80), dmin = half(b + 82);
  float scale[16], min[16];
  for (int h = 0; h < 2; ++h) {
    const __m256i sc = widen_u8(b + 8 * h);
    times(d, _mm256_and_si256(sc, _mm256_set1_epi32(0xF)), scale + 8 * h);
    times(dmin, _mm256_srli_epi32(sc, 4), min + 8 * h);
  }
  emit<O, Form::mul_sub, 256, 4>(q, scale, min, finite_half(b + 80) && finite_half(b + 82), out);
}

template <Out O>
EREDU_AVX2 inline void q3_k_block(const std::uint8_t* b, std::byte* out) noexcept {
  alignas(32) std::int8_t q[256];
  const __m256i hm = load32(b);
  for (int n = 0; n < 2; ++n) {
    const __m256i v = load32(b + 32 + 32 * n);
    for (int s = 0; s < 4; ++s) {
      // q - 4 unless the high-mask bit is set: (q | 4 * bit) - 4.
      const __m256i x = _mm256_or_si256(crumbs(v, 2 * s), bit_to(hm, 4 * n + s, 2));
      store_bytes(q + 128 * n + 32 * s, _mm256_sub_epi8(x, bytes(4)));
    }
  }
  const std::uint8_t* packed = b + 96;
  const float d_all = half(b + 108);
  constexpr std::uint32_t kmask1 = 0x03030303, kmask2 = 0x0f0f0f0f;
  const std::uint32_t a0 = quant::u32le(packed), a1 = quant::u32le(packed + 4), tmp = quant::u32le(packed + 8);
  const std::uint32_t aux[4] = {
      (a0 & kmask2) | (((tmp >> 0) & kmask1) << 4), (a1 & kmask2) | (((tmp >> 2) & kmask1) << 4),
      ((a0 >> 4) & kmask2) | (((tmp >> 4) & kmask1) << 4), ((a1 >> 4) & kmask2) | (((tmp >> 6) & kmask1) << 4)};
  std::uint8_t sc[16];
  std::memcpy(sc, aux, sizeof sc);
  float scale[16];
  for (int h = 0; h < 2; ++h)
    times(d_all, _mm256_sub_epi32(widen_i8(sc + 8 * h), _mm256_set1_epi32(32)), scale + 8 * h);
  emit<O, Form::mul, 256, 4>(q, scale, nullptr, finite_half(b + 108), out);
}

// The eight scales and mins of a Q4_K or Q5_K block: quant::scale_min_k4 for all eight at
// once, on the twelve packed bytes as three words (6-bit fields; sub-blocks 4-7 take their
// low four bits from the third word and their top two from the top of the first two).
EREDU_AVX2 inline void k4_scales(const std::uint8_t* b, float* scale, float* min) noexcept {
  constexpr std::uint32_t six = 0x3F3F'3F3F, four = 0x0F0F'0F0F, two = 0x0303'0303;
  const std::uint32_t w0 = quant::u32le(b + 4), w1 = quant::u32le(b + 8), w2 = quant::u32le(b + 12);
  const std::uint32_t fields[4] = {
      w0 & six,                                      // scales 0-3
      (w2 & four) | (((w0 >> 6) & two) << 4),        // scales 4-7
      w1 & six,                                      // mins 0-3
      ((w2 >> 4) & four) | (((w1 >> 6) & two) << 4)  // mins 4-7
  };
  std::uint8_t bytes_of[16];
  std::memcpy(bytes_of, fields, sizeof bytes_of);
  times(half(b), widen_u8(bytes_of), scale);
  times(half(b + 2), widen_u8(bytes_of + 8), min);
}

template <Out O>
EREDU_AVX2 inline void q4_k_block(const std::uint8_t* b, std::byte* out) noexcept {
  alignas(32) std::int8_t q[256];
  for (int g = 0; g < 4; ++g) {
    const __m256i v = load32(b + 16 + 32 * g);
    store_bytes(q + 64 * g, low_nibbles(v));
    store_bytes(q + 64 * g + 32, high_nibbles(v));
  }
  float scale[8], min[8];
  k4_scales(b, scale, min);
  emit<O, Form::mul_sub, 256, 5>(q, scale, min, finite_half(b) && finite_half(b + 2), out);
}

template <Out O>
EREDU_AVX2 inline void q5_k_block(const std::uint8_t* b, std::byte* out) noexcept {
  alignas(32) std::int8_t q[256];
  const __m256i qh = load32(b + 16);
  for (int g = 0; g < 4; ++g) {
    const __m256i v = load32(b + 48 + 32 * g);
    const int bit = 2 * g;
    store_bytes(q + 64 * g, _mm256_or_si256(low_nibbles(v), bit_to(qh, bit, 4)));
    store_bytes(q + 64 * g + 32, _mm256_or_si256(high_nibbles(v), bit_to(qh, bit + 1, 4)));
  }
  float scale[8], min[8];
  k4_scales(b, scale, min);
  emit<O, Form::mul_sub, 256, 5>(q, scale, min, finite_half(b) && finite_half(b + 2), out);
}

template <Out O>
EREDU_AVX2 inline void q6_k_block(const std::uint8_t* b, std::byte* out) noexcept {
  alignas(32) std::int8_t q[256];
  for (int n = 0; n < 2; ++n) {
    const __m256i l0 = load32(b + 64 * n), l1 = load32(b + 64 * n + 32), h = load32(b + 128 + 32 * n);
    const __m256i thirty_two = bytes(32);
    store_bytes(q + 128 * n, _mm256_sub_epi8(_mm256_or_si256(low_nibbles(l0), high(h, 0)), thirty_two));
    store_bytes(q + 128 * n + 32, _mm256_sub_epi8(_mm256_or_si256(low_nibbles(l1), high(h, 2)), thirty_two));
    store_bytes(q + 128 * n + 64, _mm256_sub_epi8(_mm256_or_si256(high_nibbles(l0), high(h, 4)), thirty_two));
    store_bytes(q + 128 * n + 96, _mm256_sub_epi8(_mm256_or_si256(high_nibbles(l1), high(h, 6)), thirty_two));
  }
  const float d = half(b + 208);
  float scale[16];
  for (int h = 0; h < 2; ++h) times(d, widen_i8(b + 192 + 8 * h), scale + 8 * h);
  emit<O, Form::mul, 256, 4>(q, scale, nullptr, finite_half(b + 208), out);
}

// Any other type: the reference's decoder into a scratch block, then the shared stores.
template <DType T, Out O>
EREDU_AVX2 inline void reference_block(const std::uint8_t* b, std::byte* out, const quant::QuantGrids& grids) noexcept {
  alignas(32) float v[quant::max_block_elements];
  quant::dequantize_block(T, b, v, grids);
  for (std::size_t i = 0; i < dtype_block(T).elements; i += 32) {
    const __m256 lanes[4] = {_mm256_load_ps(v + i), _mm256_load_ps(v + i + 8), _mm256_load_ps(v + i + 16),
                             _mm256_load_ps(v + i + 24)};
    store32<O, true>(out, i, lanes);
  }
}

template <DType T, Out O>
EREDU_AVX2 inline void one_block(const std::uint8_t* b, std::byte* out, const quant::QuantGrids& grids) noexcept {
  if constexpr (T == DType::Q4_0) {
    q4_0_block<O>(b, out);
  } else if constexpr (T == DType::Q4_1) {
    q4_1_block<O>(b, out);
  } else if constexpr (T == DType::Q8_0) {
    q8_0_block<O>(b, out);
  } else if constexpr (T == DType::Q2_K) {
    q2_k_block<O>(b, out);
  } else if constexpr (T == DType::Q3_K) {
    q3_k_block<O>(b, out);
  } else if constexpr (T == DType::Q4_K) {
    q4_k_block<O>(b, out);
  } else if constexpr (T == DType::Q5_K) {
    q5_k_block<O>(b, out);
  } else if constexpr (T == DType::Q6_K) {
    q6_k_block<O>(b, out);
  } else {
    reference_block<T, O>(b, out, grids);
  }
}

template <DType T, Out O>
EREDU_AVX2 void run(const std::byte* __restrict in, std::byte* __restrict out, std::size_t blocks) {
  constexpr DTypeBlock block = dtype_block(T);
  constexpr std::size_t out_block = block.elements * (O == Out::f32 || O == Out::f32_stream ? 4 : 2);
  const quant::QuantGrids grids = quant::host_quant_grids();
  for (std::size_t k = 0; k < blocks; ++k)
    one_block<T, O>(reinterpret_cast<const std::uint8_t*>(in) + k * block.bytes, out + k * out_block, grids);
}

// Streaming stores when the output allows them (32-byte aligned; every block's output is a
// multiple of 64 bytes, so one aligned start keeps every store aligned).
template <DType T, Out Stream, Out Plain>
EREDU_AVX2 void run_streaming(const std::byte* __restrict in, std::byte* __restrict out, std::size_t blocks) {
  if (reinterpret_cast<std::uintptr_t>(out) % 32 != 0) {
    run<T, Plain>(in, out, blocks);
    return;
  }
  run<T, Stream>(in, out, blocks);
  // Streaming stores are weakly ordered: fence before another thread may see "done".
  _mm_sfence();
}

template <DType T>
DequantizeKernel pick(DType to, bool stream) noexcept {
  if (to == DType::F32) return stream ? run_streaming<T, Out::f32_stream, Out::f32> : run<T, Out::f32>;
  if (to == DType::BF16) return stream ? run_streaming<T, Out::bf16_stream, Out::bf16> : run<T, Out::bf16>;
  if (to == DType::F16) return run<T, Out::f16>;
  return nullptr;
}

}  // namespace

DequantizeKernel find_avx2_dequantize_kernel(DType from, DType to, bool stream) noexcept {
  switch (from) {
#define EREDU_DEQUANTIZE_CASE(t) \
  case DType::t:                 \
    return pick<DType::t>(to, stream);
    EREDU_DEQUANTIZE_TYPES(EREDU_DEQUANTIZE_CASE)
#undef EREDU_DEQUANTIZE_CASE
    default:
      return nullptr;
  }
}

}  // namespace eredu::cpu::detail

#else

namespace eredu::cpu::detail {
DequantizeKernel find_avx2_dequantize_kernel(DType, DType, bool) noexcept { return nullptr; }
}  // namespace eredu::cpu::detail

#endif
