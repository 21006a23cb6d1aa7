#include "eredu/io/formats/gguf.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <limits>
#include <unordered_map>
#include <unordered_set>

#include "eredu/core/error.hpp"
#include "eredu/io/formats/json_text.hpp"

namespace eredu::io::gguf {
namespace {

constexpr std::uint32_t value_type_count = 13;

// ggml's type ids, in id order; nullopt marks removed ids.
constexpr std::array<std::optional<DType>, 40> ggml_types = {
    DType::F32,   DType::F16,   DType::Q4_0,    DType::Q4_1,   std::nullopt,   std::nullopt, DType::Q5_0,
    DType::Q5_1,  DType::Q8_0,  DType::Q8_1,    DType::Q2_K,   DType::Q3_K,    DType::Q4_K,  DType::Q5_K,
    DType::Q6_K,  DType::Q8_K,  DType::IQ2_XXS, DType::IQ2_XS, DType::IQ3_XXS, DType::IQ1_S, DType::IQ4_NL,
    DType::IQ3_S, DType::IQ2_S, DType::IQ4_XS,  DType::I8,     DType::I16,     DType::I32,   DType::I64,
    DType::F64,   DType::IQ1_M, DType::BF16,    std::nullopt,  std::nullopt,   std::nullopt, DType::TQ1_0,
    DType::TQ2_0, std::nullopt, std::nullopt,   std::nullopt,  DType::MXFP4,
};

constexpr std::array<std::string_view, 40> ggml_names = {
    "f32",
    "f16",
    "q4_0",
    "q4_1",
    "q4_2 (removed)",
    "q4_3 (removed)",
    "q5_0",
    "q5_1",
    "q8_0",
    "q8_1",
    "q2_K",
    "q3_K",
    "q4_K",
    "q5_K",
    "q6_K",
    "q8_K",
    "iq2_xxs",
    "iq2_xs",
    "iq3_xxs",
    "iq1_s",
    "iq4_nl",
    "iq3_s",
    "iq2_s",
    "iq4_xs",
    "i8",
    "i16",
    "i32",
    "i64",
    "f64",
    "iq1_m",
    "bf16",
    "q4_0_4_4 (removed)",
    "q4_0_4_8 (removed)",
    "q4_0_8_8 (removed)",
    "tq1_0",
    "tq2_0",
    "iq4_nl_4_4 (removed)",
    "iq4_nl_4_8 (removed)",
    "iq4_nl_8_8 (removed)",
    "mxfp4",
};

std::uint64_t align_up(std::uint64_t v, std::uint64_t a) { return (v + a - 1) / a * a; }

// Where the parser reads from: all of the header must come through need().
class Source {
 public:
  virtual ~Source() = default;
  // Bytes the source can deliver (the end of what may be read).
  virtual std::uint64_t limit() const noexcept = 0;
  // A pointer to bytes [offset, offset + n), valid until the next call; the caller has
  // checked offset + n <= limit().
  virtual const std::uint8_t* need(std::uint64_t offset, std::size_t n) = 0;
};

class MemorySource final : public Source {
 public:
  explicit MemorySource(std::span<const std::byte> bytes) : bytes_(bytes) {}
  std::uint64_t limit() const noexcept override { return bytes_.size(); }
  const std::uint8_t* need(std::uint64_t offset, std::size_t) override {
    return reinterpret_cast<const std::uint8_t*>(bytes_.data()) + offset;
  }

 private:
  std::span<const std::byte> bytes_;
};

// Reads the file in windows of at least 1 MiB; a longer field grows the window to its size
// (never past the file, which limit() checks first).
class FileSource final : public Source {
 public:
  FileSource(HeaderReader& reader, std::uint64_t file_size) : reader_(reader), size_(file_size) {}
  std::uint64_t limit() const noexcept override { return size_; }
  const std::uint8_t* need(std::uint64_t offset, std::size_t n) override {
    if (offset >= start_ && offset + n <= start_ + buffer_.size()) return buffer_.data() + (offset - start_);
    const std::size_t want = static_cast<std::size_t>(std::min<std::uint64_t>(size_ - offset, std::max(n, window)));
    buffer_.resize(want);
    reader_.read(offset, std::as_writable_bytes(std::span(buffer_)), "GGUF header");
    start_ = offset;
    return buffer_.data();
  }

 private:
  static constexpr std::size_t window = std::size_t{1} << 20;
  HeaderReader& reader_;
  std::uint64_t size_;
  std::vector<std::uint8_t> buffer_;
  std::uint64_t start_ = 0;
};

std::uint64_t le(const std::uint8_t* p, std::size_t n) noexcept {
  std::uint64_t v = 0;
  for (std::size_t i = n; i-- > 0;) v = (v << 8) | p[i];
  return v;
}

class Parser {
 public:
  Parser(Source& source, std::uint64_t file_size, const std::string& path)
      : src_(source), file_size_(file_size), path_(path) {}

  Header parse() {
    Header h;
    read_preamble(h);
    read_kv(h);
    read_alignment(h);
    read_tensor_infos(h);
    place_data(h);
    return h;
  }

 private:
  std::uint64_t left() const noexcept { return src_.limit() - pos_; }

  [[noreturn]] void truncated(std::uint64_t need, const std::string& what, ErrorContext ctx) const {
    ctx.file = path_;
    if (!ctx.offset) ctx.offset = pos_;
    throw Error(errc::truncated_header, std::move(ctx),
                fmt::format("{} needs {} bytes at offset {} but the {} ends at {} ({} bytes left)", what, need, pos_,
                            src_.limit() == file_size_ ? "file" : "given header", src_.limit(), left()));
  }

  const std::uint8_t* take(std::uint64_t n, const std::string& what, const ErrorContext& ctx) {
    if (n > left()) truncated(n, what, ctx);
    const std::uint8_t* p = src_.need(pos_, static_cast<std::size_t>(n));
    pos_ += n;
    return p;
  }

  std::uint64_t number(std::size_t n, const char* what, const ErrorContext& ctx = {}) {
    return le(take(n, what, ctx), n);
  }

  std::string string(const std::string& what, const ErrorContext& ctx) {
    const std::uint64_t at = pos_;
    const std::uint64_t n = number(8, "a string length", ctx);
    if (n > left()) {
      throw Error(errc::truncated_header, {.file = path_, .tensor = ctx.tensor, .offset = at},
                  fmt::format("{} declares {} bytes at offset {} but only {} bytes follow in the {}", what, n, at + 8,
                              left(), src_.limit() == file_size_ ? "file" : "given header"));
    }
    const std::uint8_t* p = take(n, what, ctx);
    return std::string(reinterpret_cast<const char*>(p), static_cast<std::size_t>(n));
  }

  void read_preamble(Header& h) {
    if (src_.limit() < 4) {
      throw Error(errc::truncated_header, {.file = path_, .offset = 0},
                  fmt::format("the file has {} bytes, too few for the 4-byte GGUF magic", src_.limit()));
    }
    const std::uint8_t* m = take(4, "the magic", {});
    if (std::memcmp(m, magic.data(), 4) != 0) {
      std::string shown;
      for (int i = 0; i < 4; ++i) shown += (m[i] >= 0x20 && m[i] < 0x7F) ? static_cast<char>(m[i]) : '?';
      const bool reversed = std::memcmp(m, "FUGG", 4) == 0;
      throw Error(
          errc::bad_magic, {.file = path_, .offset = 0},
          fmt::format("the file starts with '{}' (bytes {:02X} {:02X} {:02X} {:02X}), not the GGUF magic "
                      "'GGUF'{}",
                      shown, m[0], m[1], m[2], m[3],
                      reversed ? ": it is byte-reversed, a pre-release GGUF draft that ggml no longer reads" : ""));
    }
    const std::uint64_t version = number(4, "the version");
    h.version = static_cast<std::uint32_t>(version);
    if (h.version == 0 || (h.version & 0xFFFF) == 0 || h.version == 1 || h.version > 3) {
      const char* why = h.version == 0 ? "version 0 is invalid"
                        : (h.version & 0xFFFF) == 0
                            ? "the version is extremely large: the file was probably written on a host of the other "
                              "endianness"
                        : h.version == 1 ? "GGUF v1 (32-bit counts) is no longer supported, as in ggml"
                                         : "this reader supports versions 2 and 3";
      throw Error(errc::unsupported_version, {.file = path_, .offset = 4},
                  fmt::format("GGUF version {}: {}", h.version, why));
    }
    n_tensors_ = static_cast<std::int64_t>(number(8, "the tensor count"));
    n_kv_ = static_cast<std::int64_t>(number(8, "the key-value count"));
    // The smallest KV pair is a 1-byte key, its type and a 1-byte value (8 + 1 + 4 + 1); the
    // smallest tensor info an empty name, n_dims 0, a type and an offset (8 + 4 + 4 + 8).
    constexpr std::uint64_t min_kv = 14, min_tensor = 24;
    const std::uint64_t room = left();
    if (n_tensors_ < 0 || n_kv_ < 0 || static_cast<std::uint64_t>(n_kv_) > room / min_kv ||
        static_cast<std::uint64_t>(n_tensors_) > (room - static_cast<std::uint64_t>(n_kv_) * min_kv) / min_tensor) {
      throw Error(errc::invalid_count, {.file = path_, .offset = 8},
                  fmt::format("the header declares {} tensors and {} key-value pairs, but {}", n_tensors_, n_kv_,
                              n_tensors_ < 0 || n_kv_ < 0
                                  ? std::string("counts must not be negative")
                                  : fmt::format("the {} bytes after the counts hold at most {} key-value pairs of "
                                                "{} bytes and then tensor infos of {} bytes",
                                                room, room / min_kv, min_kv, min_tensor)));
    }
  }

  Value read_value(ValueType type, const std::string& key, const ErrorContext& ctx) {
    Value v;
    v.type = type;
    v.element_type = type;
    if (type == ValueType::array) {
      const std::uint64_t et = number(4, "an array's element type", ctx);
      if (et >= value_type_count || et == static_cast<std::uint64_t>(ValueType::array)) {
        throw Error(errc::invalid_value_type, ErrorContext{.file = path_, .offset = pos_ - 4},
                    et == static_cast<std::uint64_t>(ValueType::array)
                        ? fmt::format("key '{}' is an array of arrays, which ggml refuses", key)
                        : fmt::format("key '{}' is an array of invalid GGUF value type {} (types are 0-12)", key, et));
      }
      v.element_type = static_cast<ValueType>(et);
      v.count = number(8, "an array's element count", ctx);
    }
    if (v.element_type == ValueType::string) {
      if (v.count > left() / 8) {
        throw Error(errc::truncated_header, {.file = path_, .offset = pos_},
                    fmt::format("key '{}' declares an array of {} strings, but each needs at least 8 bytes and only "
                                "{} bytes follow",
                                key, v.count, left()));
      }
      v.strings.reserve(static_cast<std::size_t>(v.count));
      for (std::uint64_t i = 0; i < v.count; ++i)
        v.strings.push_back(string(fmt::format("string {} of key '{}'", i, key), ctx));
      return v;
    }
    const std::size_t size = value_type_size(v.element_type);
    if (v.count > left() / size) {
      throw Error(errc::truncated_header, {.file = path_, .offset = pos_},
                  fmt::format("key '{}' declares {} {} values ({} bytes each) but only {} bytes follow", key, v.count,
                              value_type_name(v.element_type), size, left()));
    }
    const std::uint64_t n = v.count * size;
    const std::uint8_t* p = take(n, fmt::format("the value of key '{}'", key), ctx);
    v.bytes.assign(p, p + n);
    return v;
  }

  void read_kv(Header& h) {
    std::unordered_map<std::string, std::uint64_t> seen;
    for (std::int64_t i = 0; i < n_kv_; ++i) {
      const std::uint64_t at = pos_;
      const ErrorContext ctx{.offset = at};
      std::string key = string(fmt::format("the key of key-value pair {}", i), ctx);
      if (key.empty()) {
        throw Error(errc::invalid_key, {.file = path_, .offset = at},
                    fmt::format("key-value pair {} of {} has an empty key", i, n_kv_));
      }
      auto [it, inserted] = seen.try_emplace(key, at);
      if (!inserted) {
        throw Error(errc::duplicate_key, {.file = path_, .offset = at},
                    fmt::format("key '{}' (pair {}) was already given at offset {}", key, i, it->second));
      }
      const std::uint64_t type = number(4, "a value type", ctx);
      if (type >= value_type_count) {
        throw Error(errc::invalid_value_type, {.file = path_, .offset = pos_ - 4},
                    fmt::format("key '{}' has invalid GGUF value type {} (types are 0-12)", key, type));
      }
      Value value = read_value(static_cast<ValueType>(type), key, ctx);
      h.kv.push_back({std::move(key), std::move(value), at});
    }
  }

  void read_alignment(Header& h) {
    const Value* a = h.find("general.alignment");
    if (!a) return;
    if (a->is_array() || a->type != ValueType::u32) {
      throw Error(errc::invalid_alignment, {.file = path_},
                  fmt::format("general.alignment is a{} {}, but ggml requires a UINT32",
                              a->is_array() ? "n array of" : "", value_type_name(a->element_type)));
    }
    const auto value = static_cast<std::uint32_t>(*a->as_u64());
    if (value == 0 || (value & (value - 1)) != 0) {
      throw Error(errc::invalid_alignment, {.file = path_},
                  fmt::format("general.alignment is {}, not a non-zero power of two", value));
    }
    h.alignment = value;
  }

  void read_tensor_infos(Header& h) {
    std::unordered_map<std::string, std::uint64_t> seen;
    for (std::int64_t i = 0; i < n_tensors_; ++i) {
      const std::uint64_t at = pos_;
      std::string name = string(fmt::format("the name of tensor {}", i), {.offset = at});
      auto ctx = [&] { return ErrorContext{.file = path_, .tensor = name, .offset = at}; };
      if (name.size() >= max_name_bytes) {
        throw Error(errc::invalid_tensor_name, ctx(),
                    fmt::format("tensor {} has a {}-byte name; ggml's limit is {} bytes (GGML_MAX_NAME, terminator "
                                "included)",
                                i, name.size(), max_name_bytes - 1));
      }
      if (name.find('\0') != std::string::npos) {
        // Named with the NUL spelled out: a message is a C string.
        std::string shown;
        for (char c : name) shown += c == '\0' ? std::string("\\0") : std::string(1, c);
        throw Error(errc::invalid_tensor_name, {.file = path_, .tensor = shown, .offset = at},
                    fmt::format("tensor {}'s name holds a NUL byte at {}; ggml would silently cut it there", i,
                                name.find('\0')));
      }
      if (auto [it, inserted] = seen.try_emplace(name, at); !inserted) {
        throw Error(
            errc::duplicate_tensor, ctx(),
            fmt::format("tensor {} repeats the name of the tensor whose info starts at offset {}", i, it->second));
      }
      const std::uint64_t n_dims = number(4, "n_dims", ctx());
      if (n_dims > max_dims) {
        throw Error(errc::invalid_shape, ctx(),
                    fmt::format("the tensor has {} dimensions; ggml allows at most {}", n_dims, max_dims));
      }
      std::array<std::int64_t, max_dims> ne = {1, 1, 1, 1};
      for (std::uint64_t j = 0; j < n_dims; ++j) {
        ne[j] = static_cast<std::int64_t>(number(8, "a dimension", ctx()));
        if (ne[j] < 0) {
          throw Error(errc::invalid_shape, ctx(), fmt::format("dimension ne[{}] is {}, negative", j, ne[j]));
        }
      }
      // ggml's check: the element count must stay below INT64_MAX (zero dimensions, which
      // ggml would divide by, make the count 0).
      std::int64_t product = ne[0];
      for (std::size_t j = 1; j < max_dims; ++j) {
        if (ne[j] != 0 && std::numeric_limits<std::int64_t>::max() / ne[j] <= product) {
          throw Error(errc::size_overflow, ctx(),
                      fmt::format("ne = [{}, {}, {}, {}] has {} or more elements, past ggml's limit of 2^63 - 1", ne[0],
                                  ne[1], ne[2], ne[3], std::numeric_limits<std::int64_t>::max()));
        }
        product *= ne[j];
      }
      const std::uint64_t type = number(4, "a ggml type", ctx());
      const std::optional<DType> dtype = type < ggml_types.size() ? ggml_types[type] : std::nullopt;
      if (!dtype) {
        throw Error(
            errc::unknown_dtype, ctx(),
            fmt::format("ggml type {} is {}", type,
                        type < ggml_names.size() ? fmt::format("{}, no longer supported by ggml", ggml_names[type])
                                                 : std::string("not a ggml type (ids are 0-39)")));
      }
      const DTypeBlock block = dtype_block(*dtype);
      if (static_cast<std::uint64_t>(ne[0]) % block.elements != 0) {
        throw Error(errc::partial_block, ctx(),
                    fmt::format("ne[0] = {} is not a multiple of the {} values of a {} block, so its rows are not "
                                "whole blocks",
                                ne[0], block.elements, ggml_names[type]));
      }
      const std::uint64_t elements = static_cast<std::uint64_t>(product);
      std::uint64_t nbytes = 0;
      if (__builtin_mul_overflow(elements / block.elements, std::uint64_t{block.bytes}, &nbytes)) {
        throw Error(errc::size_overflow, ctx(),
                    fmt::format("{} elements of {} overflow a 64-bit byte count", elements, ggml_names[type]));
      }
      const std::uint64_t offset = number(8, "a tensor offset", ctx());
      TensorInfo t;
      t.name = std::move(name);
      t.dtype = *dtype;
      for (std::uint64_t j = n_dims; j-- > 0;) t.shape.push_back(static_cast<std::uint64_t>(ne[j]));
      // eredu's rule too: every layer counts a shape outermost dimension first
      // (checked_element_count), which must not overflow either; ggml's innermost-first count
      // is 0 as soon as a dimension is 0, whatever the dimensions after it (found by the fuzzer).
      if (!checked_element_count(t.shape)) {
        throw Error(errc::size_overflow, ctx(),
                    fmt::format("ne = [{}, {}, {}, {}]: counted outermost first, its elements overflow 64 bits", ne[0],
                                ne[1], ne[2], ne[3]));
      }
      t.offset = offset;  // relative until place_data
      t.nbytes = nbytes;
      h.tensors.push_back(std::move(t));
      h.ggml_types.push_back(static_cast<std::uint32_t>(type));
      info_offsets_.push_back(at);
    }
  }

  void place_data(Header& h) {
    h.data_offset = align_up(pos_, h.alignment);
    std::uint64_t expected = 0;
    for (std::size_t i = 0; i < h.tensors.size(); ++i) {
      TensorInfo& t = h.tensors[i];
      const ErrorContext ctx{.file = path_, .tensor = t.name, .offset = info_offsets_[i]};
      if (t.offset != expected) {
        throw Error(errc::invalid_offset, ctx,
                    fmt::format("the tensor has offset {}, expected {}: offsets must be the running sum of the tensors "
                                "before it, each padded to the alignment of {}",
                                t.offset, expected, h.alignment));
      }
      const std::uint64_t padded = align_up(t.nbytes, h.alignment);
      if (padded < t.nbytes || __builtin_add_overflow(expected, padded, &expected)) {
        throw Error(errc::size_overflow, ctx,
                    fmt::format("the data offsets overflow 64 bits at this tensor ({} bytes at offset {})", t.nbytes,
                                t.offset));
      }
      std::uint64_t begin = 0, end = 0;
      if (__builtin_add_overflow(h.data_offset, t.offset, &begin) || __builtin_add_overflow(begin, t.nbytes, &end) ||
          end > file_size_) {
        throw Error(errc::incomplete_data, ctx,
                    fmt::format("the tensor's {} bytes at data offset {} (file offset {}) end past the file's {} bytes "
                                "(truncated file?)",
                                t.nbytes, t.offset, h.data_offset + t.offset, file_size_));
      }
      t.offset = begin;
    }
  }

  Source& src_;
  std::uint64_t file_size_;
  const std::string& path_;
  std::uint64_t pos_ = 0;
  std::int64_t n_tensors_ = 0;
  std::int64_t n_kv_ = 0;
  std::vector<std::uint64_t> info_offsets_;
};

template <class T>
T element(const Value& v, std::uint64_t i) {
  T out;
  std::memcpy(&out, v.bytes.data() + i * sizeof(T), sizeof(T));
  return out;
}

std::string float_json(double d, bool single) {
  if (std::isnan(d)) return "\"NaN\"";
  if (std::isinf(d)) return d > 0 ? "\"Infinity\"" : "\"-Infinity\"";
  return single ? fmt::format("{}", static_cast<float>(d)) : fmt::format("{}", d);
}

}  // namespace

std::string_view value_type_name(ValueType t) noexcept {
  static constexpr std::array<std::string_view, value_type_count> names = {
      "UINT8", "INT8",   "UINT16", "INT16",  "UINT32", "INT32",  "FLOAT32",
      "BOOL",  "STRING", "ARRAY",  "UINT64", "INT64",  "FLOAT64"};
  const auto i = static_cast<std::uint32_t>(t);
  return i < names.size() ? names[i] : std::string_view{"?"};
}

std::size_t value_type_size(ValueType t) noexcept {
  switch (t) {
    case ValueType::u8:
    case ValueType::i8:
    case ValueType::boolean:
      return 1;
    case ValueType::u16:
    case ValueType::i16:
      return 2;
    case ValueType::u32:
    case ValueType::i32:
    case ValueType::f32:
      return 4;
    case ValueType::u64:
    case ValueType::i64:
    case ValueType::f64:
      return 8;
    case ValueType::string:
    case ValueType::array:
      return 0;
  }
  return 0;
}

std::optional<std::int64_t> Value::as_i64() const noexcept {
  if (is_array() || count != 1) return std::nullopt;
  switch (element_type) {
    case ValueType::u8:
      return element<std::uint8_t>(*this, 0);
    case ValueType::i8:
      return element<std::int8_t>(*this, 0);
    case ValueType::u16:
      return element<std::uint16_t>(*this, 0);
    case ValueType::i16:
      return element<std::int16_t>(*this, 0);
    case ValueType::u32:
      return element<std::uint32_t>(*this, 0);
    case ValueType::i32:
      return element<std::int32_t>(*this, 0);
    case ValueType::i64:
      return element<std::int64_t>(*this, 0);
    case ValueType::u64: {
      const auto u = element<std::uint64_t>(*this, 0);
      if (u > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) return std::nullopt;
      return static_cast<std::int64_t>(u);
    }
    default:
      return std::nullopt;
  }
}

std::optional<std::uint64_t> Value::as_u64() const noexcept {
  if (!is_array() && count == 1 && element_type == ValueType::u64) return element<std::uint64_t>(*this, 0);
  const auto i = as_i64();
  if (!i || *i < 0) return std::nullopt;
  return static_cast<std::uint64_t>(*i);
}

std::optional<std::string_view> Value::as_string() const noexcept {
  if (is_array() || element_type != ValueType::string || strings.size() != 1) return std::nullopt;
  return strings.front();
}

std::string Value::element_json(std::uint64_t i) const {
  switch (element_type) {
    case ValueType::u8:
      return fmt::format("{}", element<std::uint8_t>(*this, i));
    case ValueType::i8:
      return fmt::format("{}", element<std::int8_t>(*this, i));
    case ValueType::u16:
      return fmt::format("{}", element<std::uint16_t>(*this, i));
    case ValueType::i16:
      return fmt::format("{}", element<std::int16_t>(*this, i));
    case ValueType::u32:
      return fmt::format("{}", element<std::uint32_t>(*this, i));
    case ValueType::i32:
      return fmt::format("{}", element<std::int32_t>(*this, i));
    case ValueType::u64:
      return fmt::format("{}", element<std::uint64_t>(*this, i));
    case ValueType::i64:
      return fmt::format("{}", element<std::int64_t>(*this, i));
    case ValueType::f32:
      return float_json(element<float>(*this, i), true);
    case ValueType::f64:
      return float_json(element<double>(*this, i), false);
    case ValueType::boolean:
      return bytes[i] != 0 ? "true" : "false";
    case ValueType::string:
      return json::quoted_bytes(strings[i]);
    case ValueType::array:
      break;
  }
  return "null";
}

std::string Value::to_json() const {
  if (!is_array()) return element_json(0);
  std::string out = "[";
  for (std::uint64_t i = 0; i < count; ++i) {
    if (i) out += ',';
    out += element_json(i);
  }
  return out + "]";
}

std::string Value::to_metadata_text() const {
  if (!is_array()) return element_type == ValueType::string ? strings.front() : element_json(0);
  if (count <= 64) return to_json();
  return fmt::format("[{} x {}]", count, value_type_name(element_type));
}

const Value* Header::find(std::string_view key) const noexcept {
  for (const auto& kv_pair : kv) {
    if (kv_pair.key == key) return &kv_pair.value;
  }
  return nullptr;
}

std::optional<DType> dtype_from_ggml_type(std::uint32_t type) noexcept {
  return type < ggml_types.size() ? ggml_types[type] : std::nullopt;
}

std::optional<std::uint32_t> ggml_type_of(DType t) noexcept {
  for (std::uint32_t i = 0; i < ggml_types.size(); ++i) {
    if (ggml_types[i] == t) return i;
  }
  return std::nullopt;
}

std::string_view ggml_type_name(std::uint32_t type) noexcept {
  return type < ggml_names.size() ? ggml_names[type] : std::string_view{"?"};
}

Header parse_header(std::span<const std::byte> bytes, std::uint64_t file_size, const std::string& path) {
  MemorySource source(bytes.size() > file_size ? bytes.first(static_cast<std::size_t>(file_size)) : bytes);
  return Parser(source, file_size, path).parse();
}

Header read_header(HeaderReader& reader, std::uint64_t file_size, const std::string& path) {
  FileSource source(reader, file_size);
  return Parser(source, file_size, path).parse();
}

Header read_header(int fd, std::uint64_t file_size, const std::string& path) {
  FileHeaderReader reader(fd, file_size, path);
  return read_header(reader, file_size, path);
}

bool GgufFormat::probe(std::span<const std::byte> head, std::string_view path) const noexcept {
  if (path.ends_with(".gguf")) return true;
  return head.size() >= 4 && std::memcmp(head.data(), magic.data(), 4) == 0;
}

FileLayout GgufFormat::parse(HeaderReader& reader, std::uint64_t file_size, const std::string& path) const {
  Header h = read_header(reader, file_size, path);
  FileLayout layout;
  layout.format = "gguf";
  layout.data_offset = h.data_offset;
  for (const auto& kv_pair : h.kv) layout.metadata.insert_or_assign(kv_pair.key, kv_pair.value.to_metadata_text());
  layout.tensors = std::move(h.tensors);
  return layout;
}

}  // namespace eredu::io::gguf
