#pragma once
/// \file
/// JSON text helpers shared by the header parser, the safetensors writer and the CLI's
/// --json output: UTF-8 validation and string quoting exactly as serde_json does them.

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

namespace eredu::io::json {

/// Offset of the first byte that makes `bytes` invalid UTF-8 (overlong forms, encoded
/// surrogates, code points above U+10FFFF, truncated sequences), or nullopt when valid.
std::optional<std::size_t> find_invalid_utf8(std::string_view bytes) noexcept;

/// Appends `s` as a JSON string literal, escaped like serde_json: quote, backslash,
/// \b \f \n \r \t, \u00xx (lowercase) for other control bytes, everything else verbatim.
void append_quoted(std::string& out, std::string_view s);

/// `s` as a JSON string literal (see append_quoted).
inline std::string quoted(std::string_view s) {
  std::string out;
  append_quoted(out, s);
  return out;
}

}  // namespace eredu::io::json
