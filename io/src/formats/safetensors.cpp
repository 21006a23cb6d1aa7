#include "eredu/io/formats/safetensors.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <optional>
#include <unordered_map>
#include <vector>

#include "eredu/core/error.hpp"
#include "json.hpp"

namespace eredu::io::safetensors {
namespace {

constexpr std::uint64_t prefix_size = 8;

std::uint64_t read_le64(const std::byte* p) noexcept {
  std::uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | std::to_integer<std::uint64_t>(p[i]);
  return v;
}

// What the schema pass keeps of one tensor entry, before offsets are validated.
struct Entry {
  std::string_view name;
  DType dtype{};
  Shape shape;
  std::uint64_t begin = 0;
  std::uint64_t end = 0;
  std::uint64_t header_offset = 0;  // absolute file offset of the entry's value
};

std::string describe(const json::Value& v) {
  std::string text = v.to_json();
  constexpr std::size_t limit = 40;
  if (text.size() > limit) text = text.substr(0, limit) + "...";
  return fmt::format("{} {}", json::kind_name(v.kind()), text);
}

// Checks the header's JSON schema and the offsets; the header text is already valid JSON.
class HeaderChecker {
 public:
  HeaderChecker(const std::string& path, std::uint64_t header_size, std::uint64_t file_size)
      : path_(path), header_size_(header_size), file_size_(file_size) {}

  FileLayout check(const json::Document& doc) {
    const json::Value root = doc.root();
    if (root.kind() != json::Kind::object) {
      throw Error(errc::header_not_object, {.file = path_, .offset = at(root)},
                  fmt::format("header is a JSON {}, not an object", json::kind_name(root.kind())));
    }
    FileLayout layout;
    layout.format = "safetensors";
    layout.data_offset = prefix_size + header_size_;
    // serde deserializes __metadata__ as it meets it and the (flattened) tensors only
    // after the whole map, so metadata errors come first wherever the key sits.
    std::optional<std::uint64_t> metadata_at;
    for (const auto& m : root.members()) {
      if (m.key.as_string() != "__metadata__") continue;
      if (metadata_at) {
        throw Error(errc::duplicate_field, {.file = path_, .offset = at(m.key)},
                    fmt::format("`__metadata__` given twice (first at offset {})", *metadata_at));
      }
      metadata_at = at(m.key);
      layout.metadata = check_metadata(m.value);
    }
    std::vector<Entry> entries;
    entries.reserve(root.size());
    std::unordered_map<std::string_view, std::uint64_t> seen;
    seen.reserve(root.size());
    for (const auto& m : root.members()) {
      const std::string_view name = m.key.as_string();
      if (name == "__metadata__") continue;
      entries.push_back(check_entry(name, m.value));
      auto [it, inserted] = seen.try_emplace(name, at(m.key));
      if (!inserted) {
        throw Error(errc::duplicate_tensor, {.file = path_, .tensor = std::string(name), .offset = at(m.key)},
                    fmt::format("tensor name given twice in the header (first at offset {}); the "
                                "reference parser would silently keep the last one",
                                it->second));
      }
    }
    validate_offsets(entries, layout);
    return layout;
  }

 private:
  std::uint64_t at(const json::Value& v) const noexcept { return prefix_size + v.offset(); }

  Metadata check_metadata(const json::Value& value) {
    Metadata out;
    if (value.kind() == json::Kind::null) return out;
    if (value.kind() != json::Kind::object) {
      throw Error(errc::invalid_metadata, {.file = path_, .offset = at(value)},
                  fmt::format("`__metadata__` must be null or an object of strings, not a {}", describe(value)));
    }
    for (const auto& m : value.members()) {
      if (m.value.kind() != json::Kind::string) {
        throw Error(errc::invalid_metadata, {.file = path_, .offset = at(m.value)},
                    fmt::format("`__metadata__` value of key \"{}\" must be a string, not a {}", m.key.as_string(),
                                describe(m.value)));
      }
      // serde's map insert: a repeated key keeps its last value.
      out.insert_or_assign(std::string(m.key.as_string()), std::string(m.value.as_string()));
    }
    return out;
  }

  Entry check_entry(std::string_view name, const json::Value& value) {
    // Built only when an error is thrown: a million-tensor header must not pay for it.
    auto ctx = [&](const json::Value& at_value) {
      return ErrorContext{.file = path_, .tensor = std::string(name), .offset = at(at_value)};
    };
    if (value.kind() != json::Kind::object) {
      throw Error(errc::invalid_tensor_entry, ctx(value),
                  fmt::format("tensor entry must be an object with dtype, shape and data_offsets, "
                              "not a {}",
                              describe(value)));
    }
    Entry e;
    e.name = name;
    e.header_offset = at(value);
    bool has_dtype = false, has_shape = false, has_offsets = false;
    auto once = [&](bool& seen, const json::Value& key) {
      if (seen) {
        throw Error(errc::duplicate_field, ctx(key), fmt::format("field `{}` given twice", key.as_string()));
      }
      seen = true;
    };
    for (const auto& m : value.members()) {
      const std::string_view field = m.key.as_string();
      const json::Value& v = m.value;
      if (field == "dtype") {
        once(has_dtype, m.key);
        std::optional<DType> dt;
        if (v.kind() == json::Kind::string) dt = dtype_from_name(v.as_string());
        if (!dt) {
          throw Error(errc::unknown_dtype, ctx(v),
                      fmt::format("unknown dtype {}; expected one of the 22 case-sensitive "
                                  "safetensors names (BOOL, U8, F16, BF16, F32, ...)",
                                  describe(v)));
        }
        e.dtype = *dt;
      } else if (field == "shape") {
        once(has_shape, m.key);
        if (v.kind() != json::Kind::array) {
          throw Error(errc::invalid_shape, ctx(v),
                      fmt::format("shape must be an array of non-negative integers, not a {}", describe(v)));
        }
        e.shape.reserve(v.size());
        std::size_t i = 0;
        for (const auto& d : v.items()) {
          auto dim = d.as_u64();
          if (!dim) {
            throw Error(errc::invalid_shape, ctx(d),
                        fmt::format("shape dimension {} is {}; dimensions are integer literals "
                                    "from 0 to 18446744073709551615",
                                    i, describe(d)));
          }
          e.shape.push_back(*dim);
          ++i;
        }
      } else if (field == "data_offsets") {
        once(has_offsets, m.key);
        if (v.kind() != json::Kind::array || v.size() != 2) {
          throw Error(
              errc::invalid_data_offsets, ctx(v),
              fmt::format("data_offsets must be an array of exactly two integers "
                          "[begin, end], not a {}{}",
                          describe(v),
                          v.kind() == json::Kind::array ? fmt::format(" of {} elements", v.size()) : std::string{}));
        }
        std::uint64_t pair[2] = {0, 0};
        int k = 0;
        for (const auto& x : v.items()) {
          auto n = x.as_u64();
          if (!n) {
            throw Error(errc::invalid_data_offsets, ctx(x),
                        fmt::format("data_offsets[{}] is {}; offsets are integer literals from 0 "
                                    "to 18446744073709551615",
                                    k, describe(x)));
          }
          pair[k++] = *n;
        }
        e.begin = pair[0];
        e.end = pair[1];
      }
      // Any other field is ignored, as the reference does (no deny_unknown_fields).
    }
    const char* missing = !has_dtype ? "dtype" : !has_shape ? "shape" : !has_offsets ? "data_offsets" : nullptr;
    if (missing) {
      throw Error(errc::missing_field, ctx(value), fmt::format("tensor entry lacks the required field `{}`", missing));
    }
    return e;
  }

  void validate_offsets(std::vector<Entry>& entries, FileLayout& layout) {
    // Metadata::validate walks tensors by (begin, end); JSON key order does not matter.
    auto by_range = [](const Entry& a, const Entry& b) {
      return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
    };
    // Writers emit offset order almost always; skip the sort (and its buffer) then.
    if (!std::is_sorted(entries.begin(), entries.end(), by_range)) {
      std::stable_sort(entries.begin(), entries.end(), by_range);
    }
    std::uint64_t start = 0;
    for (const auto& e : entries) {
      auto where = [&] {
        return ErrorContext{.file = path_, .tensor = std::string(e.name), .offset = e.header_offset};
      };
      if (e.end < e.begin) {
        throw Error(errc::invalid_offset, where(),
                    fmt::format("data_offsets [{}, {}] end before they begin", e.begin, e.end));
      }
      if (e.begin != start) {
        throw Error(errc::invalid_offset, where(),
                    fmt::format("data_offsets [{}, {}] begin at {} but the previous tensor ends at "
                                "{} ({})",
                                e.begin, e.end, e.begin, start, e.begin > start ? "a gap" : "an overlap"));
      }
      start = e.end;
      const auto elements = checked_element_count(e.shape);
      if (!elements) {
        throw Error(errc::size_overflow, where(),
                    fmt::format("the element count of shape {} overflows 64 bits", format_shape(e.shape)));
      }
      std::uint64_t bits = 0;
      if (__builtin_mul_overflow(*elements, std::uint64_t{dtype_bits(e.dtype)}, &bits)) {
        throw Error(errc::size_overflow, where(),
                    fmt::format("{} {}: {} elements x {} bits overflows 64 bits", dtype_name(e.dtype),
                                format_shape(e.shape), *elements, dtype_bits(e.dtype)));
      }
      if (bits % 8 != 0) {
        throw Error(errc::misaligned_slice, where(),
                    fmt::format("{} {}: {} elements x {} bits = {} bits is not a whole number of "
                                "bytes",
                                dtype_name(e.dtype), format_shape(e.shape), *elements, dtype_bits(e.dtype), bits));
      }
      if (e.end - e.begin != bits / 8) {
        throw Error(errc::tensor_size_mismatch, where(),
                    fmt::format("data_offsets [{}, {}] hold {} bytes but {} {} needs {}", e.begin, e.end,
                                e.end - e.begin, dtype_name(e.dtype), format_shape(e.shape), bits / 8));
      }
    }
    std::uint64_t data_end = 0;
    const std::uint64_t data_offset = layout.data_offset;
    if (__builtin_add_overflow(data_offset, start, &data_end) || data_end != file_size_) {
      const bool overflow = data_end < data_offset;
      throw Error(errc::incomplete_data, {.file = path_, .offset = overflow ? std::nullopt : std::optional(data_end)},
                  overflow ? fmt::format("tensors end at data offset {}, which overflows the file "
                                         "offset range; the file has {} bytes",
                                         start, file_size_)
                  : data_end < file_size_
                      ? fmt::format("tensors end at data offset {} (file offset {}) but the file has "
                                    "{} bytes: {} bytes after the data are not covered by any tensor",
                                    start, data_end, file_size_, file_size_ - data_end)
                      : fmt::format("tensors end at data offset {} (file offset {}) but the file has "
                                    "only {} bytes: {} bytes are missing (truncated file?)",
                                    start, data_end, file_size_, data_end - file_size_));
    }
    layout.tensors.reserve(entries.size());
    for (auto& e : entries) {
      TensorInfo t;
      t.name = std::string(e.name);
      t.dtype = e.dtype;
      t.shape = std::move(e.shape);
      // Cannot overflow: every end is <= start and data_offset + start == file_size.
      t.offset = data_offset + e.begin;
      t.nbytes = e.end - e.begin;
      layout.tensors.push_back(std::move(t));
    }
  }

  const std::string& path_;
  std::uint64_t header_size_;
  std::uint64_t file_size_;
};

// The 8 bytes "version " that start every Git LFS pointer file.
bool is_lfs_pointer(std::span<const std::byte> bytes) noexcept {
  constexpr std::string_view magic = "version ";
  return bytes.size() >= magic.size() && std::memcmp(bytes.data(), magic.data(), magic.size()) == 0;
}

// "GGUF", the magic that starts every GGUF file (llama.cpp's format).
bool is_gguf(std::span<const std::byte> bytes) noexcept {
  constexpr std::string_view magic = "GGUF";
  return bytes.size() >= magic.size() && std::memcmp(bytes.data(), magic.data(), magic.size()) == 0;
}

}  // namespace

FileLayout parse_file_prefix(std::span<const std::byte> bytes, std::uint64_t file_size, const std::string& path) {
  if (file_size < prefix_size) {
    throw Error(errc::header_too_small, {.file = path},
                fmt::format("the file is {} bytes, shorter than the 8-byte header length that "
                            "starts a safetensors file",
                            file_size));
  }
  if (bytes.size() < prefix_size) {
    throw Error(errc::invalid_argument, {.file = path},
                fmt::format("parse_file_prefix was given {} bytes of a {}-byte file; it needs the "
                            "8-byte prefix at least",
                            bytes.size(), file_size));
  }
  const std::uint64_t n = read_le64(bytes.data());
  if (n > max_header_size) {
    std::string detail = fmt::format("header length {} exceeds the {}-byte limit", n, max_header_size);
    if (is_lfs_pointer(bytes)) {
      detail += "; this is a Git LFS pointer, not the checkpoint: run git lfs pull";
    } else if (is_gguf(bytes)) {
      detail += "; the file starts with the GGUF magic: it looks like a GGUF file, not safetensors";
    }
    throw Error(errc::header_too_large, {.file = path, .offset = 0}, detail);
  }
  std::uint64_t header_end = 0;
  if (__builtin_add_overflow(prefix_size, n, &header_end) || header_end > file_size) {
    throw Error(errc::invalid_header_length, {.file = path, .offset = 0},
                fmt::format("header length {} needs {} bytes but the file has {}", n, prefix_size + n, file_size));
  }
  if (bytes.size() < header_end) {
    throw Error(errc::invalid_argument, {.file = path},
                fmt::format("parse_file_prefix was given {} bytes; the header needs {}", bytes.size(), header_end));
  }
  const std::string_view header(reinterpret_cast<const char*>(bytes.data()) + prefix_size, static_cast<std::size_t>(n));
  if (auto bad = json::find_invalid_utf8(header)) {
    throw Error(errc::invalid_header_utf8, {.file = path, .offset = prefix_size + *bad},
                fmt::format("header byte 0x{:02X} at header offset {} is not valid UTF-8 (overlong "
                            "forms and encoded surrogates are invalid too)",
                            static_cast<unsigned char>(header[*bad]), *bad));
  }
  std::optional<json::Document> doc;
  try {
    doc = json::Document::parse(header);
  } catch (const json::SyntaxError& e) {
    throw Error(errc::invalid_header_json, {.file = path, .offset = prefix_size + e.offset()},
                fmt::format("invalid JSON in header at header offset {}: {}", e.offset(), e.what()));
  }
  return HeaderChecker(path, n, file_size).check(*doc);
}

FileLayout read_layout(HeaderReader& reader, std::uint64_t file_size, const std::string& path) {
  std::byte prefix[prefix_size] = {};
  if (file_size < prefix_size) return parse_file_prefix({}, file_size, path);
  reader.read(0, prefix, "safetensors header");
  const std::uint64_t n = read_le64(prefix);
  // Let the parser report a bad length before anything is allocated for it.
  if (n > max_header_size || n > file_size - prefix_size) {
    return parse_file_prefix(std::span<const std::byte>(prefix, prefix_size), file_size, path);
  }
  std::vector<std::byte> buffer(static_cast<std::size_t>(prefix_size + n));
  std::memcpy(buffer.data(), prefix, prefix_size);
  reader.read(prefix_size, std::span(buffer).subspan(prefix_size), "safetensors header");
  return parse_file_prefix(buffer, file_size, path);
}

FileLayout read_layout(int fd, std::uint64_t file_size, const std::string& path) {
  FileHeaderReader reader(fd, file_size, path);
  return read_layout(reader, file_size, path);
}

bool SafetensorsFormat::probe(std::span<const std::byte> head, std::string_view path) const noexcept {
  if (path.ends_with(".safetensors")) return true;
  if (head.size() < prefix_size + 1) return false;
  if (read_le64(head.data()) > max_header_size) return false;
  const auto c = static_cast<char>(head[prefix_size]);
  return c == '{' || c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

FileLayout SafetensorsFormat::parse(HeaderReader& reader, std::uint64_t file_size, const std::string& path) const {
  return read_layout(reader, file_size, path);
}

}  // namespace eredu::io::safetensors
