#include "eredu/core/dtype.hpp"

#include <array>

namespace eredu {
namespace {
constexpr std::array<std::string_view, dtype_count> names = {
    "BOOL",        "F4",     "F6_E2M3", "F6_E3M2", "U8",      "I8",     "F8_E5M2", "F8_E4M3", "F8_E8M0", "F8_E4M3FNUZ",
    "F8_E5M2FNUZ", "I16",    "U16",     "F16",     "BF16",    "I32",    "U32",     "F32",     "C64",     "F64",
    "I64",         "U64",    "Q4_0",    "Q4_1",    "Q5_0",    "Q5_1",   "Q8_0",    "Q8_1",    "Q2_K",    "Q3_K",
    "Q4_K",        "Q5_K",   "Q6_K",    "Q8_K",    "IQ2_XXS", "IQ2_XS", "IQ3_XXS", "IQ1_S",   "IQ4_NL",  "IQ3_S",
    "IQ2_S",       "IQ4_XS", "IQ1_M",   "TQ1_0",   "TQ2_0",   "MXFP4",
};

constexpr char upper(char c) noexcept { return c >= 'a' && c <= 'z' ? static_cast<char>(c - 'a' + 'A') : c; }

bool equal_ignoring_case(std::string_view a, std::string_view b) noexcept {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (upper(a[i]) != upper(b[i])) return false;
  }
  return true;
}
}  // namespace

std::string_view dtype_name(DType t) noexcept {
  auto i = static_cast<std::size_t>(t);
  return i < names.size() ? names[i] : std::string_view{"?"};
}

std::optional<DType> dtype_from_name(std::string_view name) noexcept {
  for (std::size_t i = 0; i < safetensors_dtype_count; ++i) {
    if (names[i] == name) return static_cast<DType>(i);
  }
  return std::nullopt;
}

std::optional<DType> dtype_from_any_name(std::string_view name) noexcept {
  for (std::size_t i = 0; i < names.size(); ++i) {
    if (equal_ignoring_case(names[i], name)) return static_cast<DType>(i);
  }
  return std::nullopt;
}

}  // namespace eredu
