#pragma once
/// \file
/// ParameterId: the validated, stable, dotted identity of one runtime parameter
/// ("layers.3.attn.qkv.weight"). Bindings, materialized units and module visitors all key on it.
///
/// Rules: the name is non-empty and at most `ParameterId::max_length` bytes; it is one or
/// more segments separated by single dots (no leading, trailing or doubled dot); each segment
/// is one or more of `[A-Za-z0-9_-]`.

#include <compare>
#include <cstddef>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include <fmt/format.h>

namespace eredu::engine {

/// A validated dotted parameter name; immutable, ordered and hashable like its string.
class ParameterId {
 public:
  /// Longest accepted name, in bytes.
  static constexpr std::size_t max_length = 1024;

  /// Validates `name`; throws DeclarationError(invalid_parameter_id) naming it and why.
  explicit ParameterId(std::string name);
  /// The identity for `name`, or nullopt if it is invalid.
  static std::optional<ParameterId> parse(std::string_view name) noexcept;
  /// Empty if `name` is a valid identity, else one phrase saying why not.
  static std::string check(std::string_view name);

  /// The dotted name.
  const std::string& str() const noexcept { return name_; }
  /// This name extended by a relative name: "a.b" + "c" = "a.b.c", "a.b" + "c.d" = "a.b.c.d";
  /// throws DeclarationError(invalid_parameter_id) if `relative` or the result is invalid.
  ParameterId child(std::string_view relative) const;

  /// Ordered as the names are (lexicographic bytes).
  friend auto operator<=>(const ParameterId&, const ParameterId&) = default;

 private:
  struct Trusted {};
  // Skips validation: for names already checked (parse).
  ParameterId(Trusted, std::string name) noexcept : name_(std::move(name)) {}

  std::string name_;
};

/// The dotted name of `id` (for messages and logs).
inline const std::string& to_string(const ParameterId& id) noexcept { return id.str(); }

}  // namespace eredu::engine

/// Hashes a ParameterId as its name.
template <>
struct std::hash<eredu::engine::ParameterId> {
  /// Hash of the name.
  std::size_t operator()(const eredu::engine::ParameterId& id) const noexcept {
    return std::hash<std::string>{}(id.str());
  }
};

/// Formats a ParameterId as its name (all string format specs apply).
template <>
struct fmt::formatter<eredu::engine::ParameterId> : fmt::formatter<std::string_view> {
  /// Writes the name.
  template <class FormatContext>
  auto format(const eredu::engine::ParameterId& id, FormatContext& ctx) const -> decltype(ctx.out()) {
    return fmt::formatter<std::string_view>::format(id.str(), ctx);
  }
};
