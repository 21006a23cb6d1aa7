#include "eredu/engine/description/parameter_id.hpp"

#include <fmt/format.h>

#include "eredu/core/error.hpp"
#include "eredu/engine/orchestration/engine_error.hpp"

namespace eredu::engine {
namespace {

bool is_segment_char(char c) noexcept {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
}

// The name as it can be shown in a message: at most 80 characters, control and non-ASCII
// bytes escaped, so a hostile or binary name cannot garble a log line.
std::string printable(std::string_view name) {
  constexpr std::size_t shown = 80;
  std::string out;
  for (std::size_t i = 0; i < name.size() && i < shown; ++i) {
    const auto c = static_cast<unsigned char>(name[i]);
    if (c >= 0x20 && c < 0x7f && c != '\\') {
      out.push_back(static_cast<char>(c));
    } else {
      out += fmt::format("\\x{:02x}", c);
    }
  }
  if (name.size() > shown) out += fmt::format("... ({} bytes)", name.size());
  return out;
}

[[noreturn]] void throw_invalid(std::string_view name, const std::string& why) {
  throw DeclarationError(errc::invalid_parameter_id, {.parameter = printable(name)},
                         fmt::format("invalid parameter identity: {}", why));
}

}  // namespace

std::string ParameterId::check(std::string_view name) {
  if (name.empty()) return "the name is empty";
  if (name.size() > max_length) {
    return fmt::format("the name is {} bytes long, more than the limit of {}", name.size(), max_length);
  }
  if (name.front() == '.') return "the name starts with '.'";
  if (name.back() == '.') return "the name ends with '.'";
  for (std::size_t i = 0; i < name.size(); ++i) {
    const char c = name[i];
    if (c == '.') {
      if (name[i + 1] == '.') return fmt::format("empty segment (\"..\") at byte {}", i);
      continue;
    }
    if (!is_segment_char(c)) {
      const auto u = static_cast<unsigned char>(c);
      const std::string shown = u >= 0x20 && u < 0x7f ? fmt::format("'{}'", c) : fmt::format("byte 0x{:02x}", u);
      return fmt::format("{} at byte {} is not allowed (segments are [A-Za-z0-9_-]+ joined by '.')", shown, i);
    }
  }
  return {};
}

ParameterId::ParameterId(std::string name) : name_(std::move(name)) {
  if (auto why = check(name_); !why.empty()) throw_invalid(name_, why);
}

std::optional<ParameterId> ParameterId::parse(std::string_view name) noexcept {
  try {
    if (!check(name).empty()) return std::nullopt;
    return ParameterId(Trusted{}, std::string(name));
  } catch (...) {
    // Only allocation can fail here; "not a usable identity" is the honest answer.
    return std::nullopt;
  }
}

ParameterId ParameterId::child(std::string_view relative) const {
  if (auto why = check(relative); !why.empty()) {
    throw_invalid(relative, fmt::format("child name of '{}': {}", name_, why));
  }
  std::string joined;
  joined.reserve(name_.size() + 1 + relative.size());
  joined.append(name_).append(1, '.').append(relative);
  return ParameterId(std::move(joined));
}

}  // namespace eredu::engine
