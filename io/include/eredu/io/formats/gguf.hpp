#pragma once
/// \file
/// The GGUF format (llama.cpp / ggml), validated exactly as ggml's `gguf_init_from_file_impl`
/// (ggml/src/gguf.cpp) does, plus a few stricter rules noted below.
///
/// On-disk layout (little-endian; strings are a u64 byte count followed by the bytes):
///
/// ```
/// "GGUF"                 magic
/// u32 version            2 or 3 (v1 had 32-bit counts and is refused, as ggml does)
/// i64 n_tensors, n_kv    counts, >= 0
/// n_kv x  { string key; u32 type; value }
///          type 0-12: u8 i8 u16 i16 u32 i32 f32 bool string array u64 i64 f64;
///          an array is { u32 element type; u64 count; count values } (no arrays of arrays)
/// n_tensors x { string name; u32 n_dims; i64 ne[n_dims]; u32 ggml type; u64 offset }
///          ne[0] is the innermost (contiguous) dimension
/// padding to `general.alignment` (a u32 power of two, default 32)
/// data: tensor i at data_start + offset_i; offsets are the running sum of the tensors before
///       it, each padded to the alignment
/// ```
///
/// The catalog sees every tensor with a row-major shape (ggml's `ne` reversed: ne = [512, 4]
/// is shape [4, 512]) and its ggml type as an eredu::DType (quantized types as block dtypes).
/// The checks, in ggml's order, each an eredu::Error naming the file, key or tensor and the
/// offending numbers: bad_magic, unsupported_version, invalid_count (negative, or more KV
/// pairs or tensors than the file could hold); per KV pair truncated_header, invalid_key
/// (empty), duplicate_key, invalid_value_type (type > 12, or an array of arrays); then
/// invalid_alignment (general.alignment not a UINT32 non-zero power of two); per tensor
/// truncated_header, invalid_tensor_name (64 bytes or more, or holding a NUL: stricter than
/// ggml, which would cut the name there), duplicate_tensor, invalid_shape (more than 4
/// dimensions, a negative dimension), size_overflow (elements, bytes, or running offsets past
/// 2^63 / 2^64), unknown_dtype (not a ggml type), partial_block (ne[0] not a whole number of
/// blocks); then invalid_offset (an offset not the running aligned sum) and incomplete_data
/// (tensor bytes past the end of the file). Bytes after the last tensor are allowed, as ggml
/// allows them (writers pad the last tensor too). All arithmetic on file values is
/// overflow-checked and every count is checked against the bytes left before anything is
/// allocated for it.

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "eredu/core/dtype.hpp"
#include "eredu/io/formats/checkpoint_format.hpp"
#include "eredu/io/formats/tensor_info.hpp"

namespace eredu::io::gguf {

/// The magic bytes that start every GGUF file.
inline constexpr std::string_view magic = "GGUF";

/// ggml's default data alignment when `general.alignment` is absent.
inline constexpr std::uint32_t default_alignment = 32;

/// ggml's GGML_MAX_NAME: tensor names must be shorter.
inline constexpr std::size_t max_name_bytes = 64;

/// ggml's GGML_MAX_DIMS.
inline constexpr std::uint32_t max_dims = 4;

/// GGUF value types (gguf_type); values are those of the file.
enum class ValueType : std::uint32_t {
  u8 = 0,       ///< UINT8
  i8 = 1,       ///< INT8
  u16 = 2,      ///< UINT16
  i16 = 3,      ///< INT16
  u32 = 4,      ///< UINT32
  i32 = 5,      ///< INT32
  f32 = 6,      ///< FLOAT32
  boolean = 7,  ///< BOOL (one byte, non-zero is true)
  string = 8,   ///< STRING
  array = 9,    ///< ARRAY
  u64 = 10,     ///< UINT64
  i64 = 11,     ///< INT64
  f64 = 12,     ///< FLOAT64
};

/// GGUF's name of a value type ("UINT32", "STRING", ...).
std::string_view value_type_name(ValueType t) noexcept;

/// Bytes of one value of a non-string, non-array type (1 for u8, 8 for f64); 0 otherwise.
std::size_t value_type_size(ValueType t) noexcept;

/// One KV value: a scalar (one element) or an array of `element_type`. Numbers and bools keep
/// their little-endian file bytes; strings are held as they are (GGUF does not require UTF-8).
struct Value {
  ValueType type{};                  ///< the value's type (array for arrays)
  ValueType element_type{};          ///< the element type (== type for a scalar)
  std::uint64_t count = 1;           ///< elements (1 for a scalar)
  std::vector<std::uint8_t> bytes;   ///< count x value_type_size(element_type) bytes, numbers only
  std::vector<std::string> strings;  ///< count strings, strings only

  /// True for an array.
  bool is_array() const noexcept { return type == ValueType::array; }
  /// The integer value of an integer scalar (any width or sign), else nullopt; negative
  /// values are nullopt for as_u64 and kept for as_i64.
  std::optional<std::uint64_t> as_u64() const noexcept;
  /// The integer value of an integer scalar that fits int64, else nullopt.
  std::optional<std::int64_t> as_i64() const noexcept;
  /// The string of a string scalar, else nullopt.
  std::optional<std::string_view> as_string() const noexcept;
  /// Element `i` as JSON text (numbers in shortest round-trip form, strings quoted by
  /// json::append_quoted_bytes: a byte that is not UTF-8 reads `\xNN`).
  std::string element_json(std::uint64_t i) const;
  /// The whole value as compact JSON text (an array as a JSON array).
  std::string to_json() const;
  /// The value as catalog metadata text: a string as is, a number or bool as JSON, an array
  /// of at most 64 elements as JSON, a longer one summarised as "[32000 x STRING]".
  std::string to_metadata_text() const;
};

/// One key-value pair.
struct KeyValue {
  std::string key;           ///< the key
  Value value;               ///< its value
  std::uint64_t offset = 0;  ///< absolute file offset of the key
};

/// A validated GGUF header.
struct Header {
  std::uint32_t version = 0;                    ///< 2 or 3
  std::uint32_t alignment = default_alignment;  ///< data alignment
  std::uint64_t data_offset = 0;                ///< absolute offset of the data section
  std::vector<KeyValue> kv;                     ///< KV pairs in file order
  std::vector<TensorInfo> tensors;              ///< tensors in offset order, absolute offsets, row-major shapes
  std::vector<std::uint32_t> ggml_types;        ///< each tensor's ggml type id, parallel to tensors

  /// The value of `key`, or nullptr.
  const Value* find(std::string_view key) const noexcept;
};

/// The eredu dtype of ggml type id `type` (GGML_TYPE_*), or nullopt for an unknown or
/// removed id (4, 5, 31-33, 36-38, anything above 39).
std::optional<DType> dtype_from_ggml_type(std::uint32_t type) noexcept;

/// The ggml type id of `t`, or nullopt for a dtype GGUF cannot hold (BOOL, U8, F8_*, ...).
std::optional<std::uint32_t> ggml_type_of(DType t) noexcept;

/// ggml's name of type id `type` ("q4_K", "f16"), or "?".
std::string_view ggml_type_name(std::uint32_t type) noexcept;

/// Validates a GGUF file from `bytes`, its first bytes (all of it, or at least the whole
/// header: a header that runs past `bytes` fails with truncated_header). `file_size` is the
/// whole file's size, against which tensor data is checked. Throws eredu::Error.
Header parse_header(std::span<const std::byte> bytes, std::uint64_t file_size, const std::string& path);

/// Reads and validates the header of a file of `file_size` bytes through `reader`, reading
/// only the header (in growing windows, never more than the file holds).
Header read_header(HeaderReader& reader, std::uint64_t file_size, const std::string& path);

/// read_header of the open file `fd`.
Header read_header(int fd, std::uint64_t file_size, const std::string& path);

/// The GGUF CheckpointFormat (name "gguf"): probes the magic or a `.gguf` name.
class GgufFormat final : public CheckpointFormat {
 public:
  /// "gguf".
  std::string_view name() const noexcept override { return "gguf"; }
  /// True for a file starting with "GGUF", or named `*.gguf` (so that a damaged GGUF file gets
  /// GGUF's errors, not safetensors').
  bool probe(std::span<const std::byte> head, std::string_view path) const noexcept override;
  /// read_header, as a FileLayout whose metadata holds every KV pair as
  /// Value::to_metadata_text.
  FileLayout parse(HeaderReader& reader, std::uint64_t file_size, const std::string& path) const override;
};

}  // namespace eredu::io::gguf
