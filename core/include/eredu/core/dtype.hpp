#pragma once
/// \file
/// Element types of checkpoint tensors (C++17: the CUDA kernels include it): the 22 safetensors types, named exactly as
/// safetensors spells them, and ggml's quantized block types as GGUF stores them.
///
/// Every dtype is stored in blocks (dtype_block): `elements` values packed in `bytes` bytes.
/// A plain element type is a block of one element; the sub-byte floats pack 2 (F4) or 4 (F6)
/// elements per block; a quantized type packs 32 or 256 values with their scales (Q4_K: 256
/// values in 144 bytes). Along a tensor's last dimension its values are grouped into whole
/// blocks, so a quantized tensor's last dimension is a multiple of its block's elements.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace eredu {

/// Element type of a tensor. The first 22 are the safetensors types, in the safetensors
/// writer's alignment order; the rest are ggml's quantized block types (GGUF), whose layouts
/// are those of ggml's `ggml-common.h`. Values are stable.
enum class DType : std::uint8_t {
  BOOL,
  F4,
  F6_E2M3,
  F6_E3M2,
  U8,
  I8,
  F8_E5M2,
  F8_E4M3,
  F8_E8M0,
  F8_E4M3FNUZ,
  F8_E5M2FNUZ,
  I16,
  U16,
  F16,
  BF16,
  I32,
  U32,
  F32,
  C64,
  F64,
  I64,
  U64,
  // ggml's quantized block types (elements per block / bytes per block).
  Q4_0,     ///< 32 / 18: f16 scale, 4-bit values minus 8
  Q4_1,     ///< 32 / 20: f16 scale and min, 4-bit values
  Q5_0,     ///< 32 / 22: f16 scale, 5-bit values minus 16
  Q5_1,     ///< 32 / 24: f16 scale and min, 5-bit values
  Q8_0,     ///< 32 / 34: f16 scale, int8 values
  Q8_1,     ///< 32 / 36: f16 scale and sum, int8 values (ggml's activation type)
  Q2_K,     ///< 256 / 84: 16 sub-blocks of 2-bit values, 4-bit scales and mins
  Q3_K,     ///< 256 / 110: 16 sub-blocks of 3-bit values, 6-bit scales
  Q4_K,     ///< 256 / 144: 8 sub-blocks of 4-bit values, 6-bit scales and mins
  Q5_K,     ///< 256 / 176: 8 sub-blocks of 5-bit values, 6-bit scales and mins
  Q6_K,     ///< 256 / 210: 16 sub-blocks of 6-bit values, 8-bit scales
  Q8_K,     ///< 256 / 292: f32 scale, int8 values, int16 group sums (ggml's activation type)
  IQ2_XXS,  ///< 256 / 66: 2.06 bits per value on an E8 lattice codebook
  IQ2_XS,   ///< 256 / 74
  IQ3_XXS,  ///< 256 / 98
  IQ1_S,    ///< 256 / 50
  IQ4_NL,   ///< 32 / 18: f16 scale, 4-bit indices into a non-linear codebook
  IQ3_S,    ///< 256 / 110
  IQ2_S,    ///< 256 / 82
  IQ4_XS,   ///< 256 / 136
  IQ1_M,    ///< 256 / 56
  TQ1_0,    ///< 256 / 54: ternary, 5 values per byte
  TQ2_0,    ///< 256 / 66: ternary, 2 bits per value
  MXFP4,    ///< 32 / 17: OCP MX FP4 (E2M1) values with an E8M0 scale
};

/// Number of element types in DType.
inline constexpr std::size_t dtype_count = 46;

/// Number of safetensors element types: DType values [0, safetensors_dtype_count).
inline constexpr std::size_t safetensors_dtype_count = 22;

/// How a dtype is stored: `elements` values in `bytes` bytes.
struct DTypeBlock {
  std::uint32_t elements = 1;  ///< values per block
  std::uint32_t bytes = 1;     ///< bytes per block
  /// Same elements and bytes (spelled out: nvcc compiles this header as C++17).
  friend constexpr bool operator==(const DTypeBlock& a, const DTypeBlock& b) noexcept {
    return a.elements == b.elements && a.bytes == b.bytes;
  }
};

/// True for ggml's quantized block types (Q4_0 ... MXFP4): neither an element type nor a
/// sub-byte float, so layout recipes may move their blocks but never cut one.
constexpr bool dtype_is_quantized(DType t) noexcept { return t >= DType::Q4_0; }

/// Bits one element occupies in the file (4 and 6 for the sub-byte float types), or 0 for a
/// quantized block type, whose values have no whole number of bits: use dtype_block.
constexpr unsigned dtype_bits(DType t) noexcept {
  switch (t) {
    case DType::F4:
      return 4;
    case DType::F6_E2M3:
    case DType::F6_E3M2:
      return 6;
    case DType::BOOL:
    case DType::U8:
    case DType::I8:
    case DType::F8_E5M2:
    case DType::F8_E4M3:
    case DType::F8_E8M0:
    case DType::F8_E4M3FNUZ:
    case DType::F8_E5M2FNUZ:
      return 8;
    case DType::I16:
    case DType::U16:
    case DType::F16:
    case DType::BF16:
      return 16;
    case DType::I32:
    case DType::U32:
    case DType::F32:
      return 32;
    case DType::C64:
    case DType::F64:
    case DType::I64:
    case DType::U64:
      return 64;
    default:
      return 0;
  }
}

/// The storage block of `t` (see the file comment): {1, bits / 8} for whole-byte element
/// types, {2, 1} for F4, {4, 3} for F6, and ggml's block sizes for the quantized types.
constexpr DTypeBlock dtype_block(DType t) noexcept {
  switch (t) {
    case DType::F4:
      return {2, 1};
    case DType::F6_E2M3:
    case DType::F6_E3M2:
      return {4, 3};
    case DType::Q4_0:
      return {32, 18};
    case DType::Q4_1:
      return {32, 20};
    case DType::Q5_0:
      return {32, 22};
    case DType::Q5_1:
      return {32, 24};
    case DType::Q8_0:
      return {32, 34};
    case DType::Q8_1:
      return {32, 36};
    case DType::Q2_K:
      return {256, 84};
    case DType::Q3_K:
      return {256, 110};
    case DType::Q4_K:
      return {256, 144};
    case DType::Q5_K:
      return {256, 176};
    case DType::Q6_K:
      return {256, 210};
    case DType::Q8_K:
      return {256, 292};
    case DType::IQ2_XXS:
      return {256, 66};
    case DType::IQ2_XS:
      return {256, 74};
    case DType::IQ3_XXS:
      return {256, 98};
    case DType::IQ1_S:
      return {256, 50};
    case DType::IQ4_NL:
      return {32, 18};
    case DType::IQ3_S:
      return {256, 110};
    case DType::IQ2_S:
      return {256, 82};
    case DType::IQ4_XS:
      return {256, 136};
    case DType::IQ1_M:
      return {256, 56};
    case DType::TQ1_0:
      return {256, 54};
    case DType::TQ2_0:
      return {256, 66};
    case DType::MXFP4:
      return {32, 17};
    default:
      return {1, dtype_bits(t) / 8};
  }
}

/// The largest dtype_block(t).bytes of any dtype (Q8_K's 292).
inline constexpr std::size_t max_dtype_block_bytes = 292;

/// The name of `t`: the safetensors name ("BF16", "F8_E4M3") or ggml's type name in upper
/// case ("Q4_K", "IQ2_XXS", "MXFP4").
std::string_view dtype_name(DType t) noexcept;

/// Parses a case-sensitive safetensors dtype name (one of the first 22); nullopt for anything
/// else, quantized names included: a safetensors file cannot hold them.
std::optional<DType> dtype_from_name(std::string_view name) noexcept;

/// Parses any dtype name dtype_name gives, case-insensitively ("q4_k", "Q4_K", "bf16").
std::optional<DType> dtype_from_any_name(std::string_view name) noexcept;

}  // namespace eredu
