#pragma once
// Hand-made safetensors bytes for format tests: 8-byte LE length + header + data.

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

namespace eredu::test {

/// The bytes of a safetensors file: `header`'s length as u64 LE, `header`, then
/// `data_bytes` bytes counting up from 0.
inline std::vector<std::byte> st_file(std::string_view header, std::size_t data_bytes = 0) {
  std::vector<std::byte> out;
  const std::uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<std::byte>(n >> (8 * i)));
  for (char c : header) out.push_back(static_cast<std::byte>(c));
  for (std::size_t i = 0; i < data_bytes; ++i) out.push_back(static_cast<std::byte>(i));
  return out;
}

/// One tensor entry of a safetensors header, `"name":{...}` (without braces around it).
inline std::string st_entry(std::string_view name, std::string_view dtype, std::string_view shape, std::uint64_t begin,
                            std::uint64_t end) {
  return fmt::format(R"("{}":{{"dtype":"{}","shape":{},"data_offsets":[{},{}]}})", name, dtype, shape, begin, end);
}

/// Raw bytes from a string (any content).
inline std::vector<std::byte> raw_bytes(std::string_view s) {
  std::vector<std::byte> out;
  for (char c : s) out.push_back(static_cast<std::byte>(c));
  return out;
}

/// Writes `bytes` to `path`, replacing it.
inline void write_bytes(const std::filesystem::path& path, const std::vector<std::byte>& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  if (!f) throw std::runtime_error("cannot write " + path.string());
}

}  // namespace eredu::test
