#include "eredu/io/formats/split_gguf.hpp"

#include <fmt/format.h>

namespace eredu::io::gguf {
namespace {

std::optional<std::uint32_t> five_digits(std::string_view s) {
  if (s.size() != 5) return std::nullopt;
  std::uint32_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return std::nullopt;
    v = v * 10 + static_cast<std::uint32_t>(c - '0');
  }
  return v;
}

}  // namespace

std::optional<SplitName> parse_split_name(std::string_view name) {
  constexpr std::string_view suffix = ".gguf";
  // "-00001-of-00003" is 15 characters.
  if (!name.ends_with(suffix) || name.size() < suffix.size() + 16) return std::nullopt;
  name.remove_suffix(suffix.size());
  const std::string_view tail = name.substr(name.size() - 15);
  if (tail[0] != '-' || tail.substr(6, 4) != "-of-") return std::nullopt;
  const auto number = five_digits(tail.substr(1, 5));
  const auto count = five_digits(tail.substr(10, 5));
  if (!number || !count || *number == 0 || *number > *count) return std::nullopt;
  return SplitName{std::string(name.substr(0, name.size() - 15)), *number, *count};
}

std::string split_file_name(std::string_view prefix, std::uint32_t number, std::uint32_t count) {
  return fmt::format("{}-{:05d}-of-{:05d}.gguf", prefix, number, count);
}

}  // namespace eredu::io::gguf
