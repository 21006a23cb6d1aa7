#pragma once
// Test support for GGUF: the fixture directories under ../shared/data (skipped with a WARN
// when absent), a MANIFEST.json reader, and a byte builder for hand-made GGUF headers.

#include <fcntl.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "eredu/io/integrity/sha256.hpp"
#include "json.hpp"
#include "support/temp_dir.hpp"

namespace eredu::test {

/// ../shared/data/gguf-quant, or empty when absent.
inline std::filesystem::path gguf_quant_dir() {
  std::filesystem::path p = shared_data_dir() / "gguf-quant";
  std::error_code ec;
  return std::filesystem::is_regular_file(p / "MANIFEST.json", ec) ? p : std::filesystem::path{};
}

/// The whole file at `p`.
inline std::string read_file_text(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

/// `n` bytes at `offset` of the file at `path`.
inline std::vector<std::byte> read_range(const std::string& path, std::uint64_t offset, std::uint64_t n) {
  std::vector<std::byte> out(static_cast<std::size_t>(n));
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw std::runtime_error("cannot open " + path);
  std::size_t done = 0;
  while (done < out.size()) {
    const ssize_t r = ::pread(fd, out.data() + done, out.size() - done, static_cast<off_t>(offset + done));
    if (r <= 0) break;
    done += static_cast<std::size_t>(r);
  }
  ::close(fd);
  if (done != out.size()) throw std::runtime_error("short read of " + path);
  return out;
}

/// A JSON document with its text (the text must outlive the document).
struct JsonFile {
  std::string text;
  io::json::Document doc;
  explicit JsonFile(const std::filesystem::path& p) : text(read_file_text(p)), doc(io::json::Document::parse(text)) {}
};

/// The member `key` of a JSON object.
inline std::optional<io::json::Value> member(const io::json::Value& object, std::string_view key) {
  for (const auto& m : object.members()) {
    if (m.key.as_string() == key) return m.value;
  }
  return std::nullopt;
}

/// Builds GGUF bytes field by field, little-endian, for hand-made (often broken) files.
struct GgufBytes {
  std::vector<std::byte> bytes;
  GgufBytes& raw(const void* p, std::size_t n) {
    const std::size_t at = bytes.size();
    bytes.resize(at + n);
    if (n) std::memcpy(bytes.data() + at, p, n);
    return *this;
  }
  template <class T>
  GgufBytes& le(T v) {
    return raw(&v, sizeof v);
  }
  GgufBytes& u32(std::uint32_t v) { return le(v); }
  GgufBytes& u64(std::uint64_t v) { return le(v); }
  GgufBytes& i64(std::int64_t v) { return le(v); }
  GgufBytes& str(std::string_view s) {
    u64(s.size());
    return raw(s.data(), s.size());
  }
  /// "GGUF", version, tensor count, KV count.
  GgufBytes& preamble(std::int64_t tensors, std::int64_t kvs, std::uint32_t version = 3) {
    raw("GGUF", 4);
    u32(version);
    i64(tensors);
    return i64(kvs);
  }
  /// A u32 KV pair.
  GgufBytes& kv_u32(std::string_view key, std::uint32_t v) {
    str(key);
    u32(4);
    return u32(v);
  }
  /// A tensor info: name, ne (innermost first), ggml type, offset.
  GgufBytes& tensor(std::string_view name, std::vector<std::int64_t> ne, std::uint32_t type, std::uint64_t offset) {
    str(name);
    u32(static_cast<std::uint32_t>(ne.size()));
    for (auto d : ne) i64(d);
    u32(type);
    return u64(offset);
  }
  /// Zero bytes up to a multiple of `a`.
  GgufBytes& pad(std::size_t a) {
    bytes.resize((bytes.size() + a - 1) / a * a, std::byte{0});
    return *this;
  }
  /// `n` data bytes of value `v`.
  GgufBytes& data(std::size_t n, std::uint8_t v = 0) {
    bytes.resize(bytes.size() + n, std::byte{v});
    return *this;
  }
};

}  // namespace eredu::test
