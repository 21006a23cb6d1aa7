#pragma once
/// \file
/// Element types of checkpoint tensors, named exactly as safetensors spells them.

#include <cstdint>
#include <optional>
#include <string_view>

namespace eredu {

/// Element type of a tensor; the order is the safetensors writer's alignment order.
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
};

/// Number of element types in DType.
inline constexpr std::size_t dtype_count = 22;

/// Bits one element occupies in the file (4 and 6 for the sub-byte float types).
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
  }
  return 0;
}

/// The safetensors name of `t` ("BF16", "F8_E4M3", ...).
std::string_view dtype_name(DType t) noexcept;

/// Parses a case-sensitive safetensors dtype name; nullopt for anything else.
std::optional<DType> dtype_from_name(std::string_view name) noexcept;

}  // namespace eredu
