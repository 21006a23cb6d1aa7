#pragma once
/// \file
/// JSON text helpers shared by the header parser, the safetensors writer and the CLI's
/// --json output: UTF-8 validation, string quoting exactly as serde_json does it, and the
/// quoting of any bytes (names from files) into a document that stays valid UTF-8.

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

/// Appends any bytes (a path, a tensor name, a message) as a JSON string literal that is
/// valid UTF-8 whatever they hold. The rule (docs/cli.md, "--json"): quote and backslash
/// escaped; C0 controls as \b \f \n \r \t or \u00xx, DEL and C1 controls (U+0080..U+009F)
/// as \u00xx, U+2028 and U+2029 as \u2028 and \u2029; each byte that is not part of valid
/// UTF-8 as the four characters `\xNN` (JSON text `\\xNN`), as eredu::printable writes it
/// in messages; all other UTF-8 verbatim. Valid text reads back unchanged.
void append_quoted_bytes(std::string& out, std::string_view bytes);

/// `bytes` as a JSON string literal (see append_quoted_bytes).
inline std::string quoted_bytes(std::string_view bytes) {
  std::string out;
  append_quoted_bytes(out, bytes);
  return out;
}

}  // namespace eredu::io::json
