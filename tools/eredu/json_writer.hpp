#pragma once
/// \file
/// JsonWriter: the one JSON writer behind every `--json` output of the eredu command, its
/// errors under `--json`, and any later machine-readable output (a trace-event file).
///
/// It writes compact JSON text in document order into a string, placing commas and
/// escaping strings itself, so a caller cannot produce invalid JSON by forgetting a comma
/// or a quote. Keys and string values may hold any bytes (paths, tensor names, messages):
/// io::json::append_quoted_bytes encodes them, so every document is valid UTF-8 JSON, and a
/// byte that is not UTF-8 reads `\xNN`, as in eredu::printable's messages (docs/cli.md).
///
/// The field vocabulary of docs/cli.md is part of the API: sizes, times, rates and counts
/// are written through bytes(), seconds(), rate() and count(), which add the unit suffix
/// (`_bytes`, `_seconds`, `_gb_per_s`, `_count`), so the same kind of figure gets the same
/// kind of name in every command.
///
/// take() hands out the text written so far and keeps the nesting state, so a long array
/// (trace events, say) can be streamed to a file in pieces instead of held whole.

#include <concepts>
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace eredu::cli {

/// Version of the `--json` schema (docs/cli.md); every document carries it as "schema".
inline constexpr int json_schema_version = 1;

/// Writes one JSON document (see file comment). Misuse (a value where a key is due, an
/// unbalanced end) is a programming error and asserts.
class JsonWriter {
 public:
  /// Opens an object, as a value (top level, array element, or after key()).
  JsonWriter& begin_object();
  /// Closes the innermost object.
  JsonWriter& end_object();
  /// Opens an array, as a value.
  JsonWriter& begin_array();
  /// Closes the innermost array.
  JsonWriter& end_array();
  /// Writes a member name (any bytes, see the file comment) inside an object; the next call
  /// writes its value.
  JsonWriter& key(std::string_view name);

  /// A string value of any bytes (io::json::append_quoted_bytes: see the file comment).
  JsonWriter& value(std::string_view s);
  /// A string value (keeps string literals from converting to bool).
  JsonWriter& value(const char* s) { return value(std::string_view(s)); }
  /// `true` or `false`.
  JsonWriter& value(bool b);
  /// A number: shortest text that reads back to the same double; NaN and infinities are
  /// written as null (JSON has no spelling for them).
  JsonWriter& value(double d);
  /// An integer, exactly.
  template <std::integral T>
  requires(!std::same_as<T, bool>) JsonWriter& value(T n) {
    if constexpr (std::is_signed_v<T>)
      return raw_value(std::to_string(static_cast<long long>(n)));
    else
      return raw_value(std::to_string(static_cast<unsigned long long>(n)));
  }
  /// `null`.
  JsonWriter& null();

  /// key(name) then value(v).
  template <class T>
  JsonWriter& field(std::string_view name, const T& v) {
    key(name);
    return value(v);
  }
  /// key(name) then null().
  JsonWriter& null_field(std::string_view name) {
    key(name);
    return null();
  }
  /// A size: member "<name>_bytes", or "bytes" when `name` is empty.
  JsonWriter& bytes(std::string_view name, std::uint64_t n);
  /// A duration: member "<name>_seconds", or "seconds" when `name` is empty.
  JsonWriter& seconds(std::string_view name, double s);
  /// A rate in 10^9 bytes per second: member "<name>_gb_per_s", or "gb_per_s".
  JsonWriter& rate(std::string_view name, double gb_per_s);
  /// A number of things: member "<name>_count", or "count".
  JsonWriter& count(std::string_view name, std::uint64_t n);
  /// `json`, which must already be one valid UTF-8 JSON value (e.g. a GGUF value's
  /// to_json()), as is.
  JsonWriter& json_value(std::string_view json) { return raw_value(json); }

  /// The text written since the last take(); the writer keeps its nesting state, so
  /// writing may go on (streaming).
  std::string take();
  /// True once a whole top-level value has been written.
  bool complete() const noexcept { return done_; }

 private:
  enum class Scope { object, array };
  JsonWriter& raw_value(std::string_view text);
  JsonWriter& unit_key(std::string_view name, std::string_view unit);
  void before_value();

  std::string out_;
  std::vector<Scope> scopes_;
  std::vector<bool> first_;  // per scope: nothing written in it yet
  bool key_pending_ = false;
  bool done_ = false;
};

}  // namespace eredu::cli
