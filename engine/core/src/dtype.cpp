#include "eredu/core/dtype.hpp"

#include <array>

namespace eredu {
namespace {
constexpr std::array<std::string_view, dtype_count> names = {
    "BOOL", "F4",  "F6_E2M3", "F6_E3M2", "U8",  "I8",  "F8_E5M2", "F8_E4M3", "F8_E8M0", "F8_E4M3FNUZ", "F8_E5M2FNUZ",
    "I16",  "U16", "F16",     "BF16",    "I32", "U32", "F32",     "C64",     "F64",     "I64",         "U64",
};
}  // namespace

std::string_view dtype_name(DType t) noexcept {
  auto i = static_cast<std::size_t>(t);
  return i < names.size() ? names[i] : std::string_view{"?"};
}

std::optional<DType> dtype_from_name(std::string_view name) noexcept {
  for (std::size_t i = 0; i < names.size(); ++i) {
    if (names[i] == name) return static_cast<DType>(i);
  }
  return std::nullopt;
}

}  // namespace eredu
