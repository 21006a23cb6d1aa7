#pragma once
/// \file
/// The safetensors format, validated exactly as the reference parser (huggingface/safetensors
/// `Metadata::read_metadata`) does, plus one stricter rule: duplicate tensor names.
///
/// On-disk layout:
///
/// ```
/// [0 .. 8)          N: u64, little-endian: length of the header in bytes (N <= 100,000,000)
/// [8 .. 8+N)        header: UTF-8 JSON object
///                     {"__metadata__"?: null | {string: string},
///                      "<name>": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]},
///                      ...}
/// [8+N .. EOF)      data: tensors' bytes, little-endian, row-major; data_offsets are relative
///                   to 8+N, tile [0, size) with no gap or overlap, and end exactly at EOF
/// ```
///
/// Neither N nor the data needs to be aligned. Checks run in the reference's order, so the
/// error kind of a file that breaks several rules is the first rule it breaks:
///  1. header_too_small, header_too_large (a Git LFS pointer is named as such),
///     invalid_header_length, invalid_header_utf8, invalid_header_json, header_not_object;
///  2. the schema: `__metadata__` first wherever it sits (invalid_metadata, or duplicate_field
///     when given twice), then each tensor entry in header order: invalid_tensor_entry, its
///     fields as they appear (duplicate_field, unknown_dtype, invalid_shape,
///     invalid_data_offsets), missing_field, and duplicate_tensor for a name seen before
///     (the reference silently keeps the last one; eredu refuses); unknown fields are ignored;
///  3. per tensor in (begin, end) order: invalid_offset, size_overflow, misaligned_slice,
///     tensor_size_mismatch;
///  4. incomplete_data unless the last tensor ends exactly at end of file.
/// All arithmetic on file values is overflow-checked.

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "eredu/io/formats/checkpoint_format.hpp"

namespace eredu::io::safetensors {

/// Largest header length the reference accepts (MAX_HEADER_SIZE).
inline constexpr std::uint64_t max_header_size = 100'000'000;

/// Validates a safetensors file from its first bytes. `bytes` must hold at least
/// min(file_size, 8 + N) bytes (fewer only when the file itself is too short, which then
/// fails with the right kind). Returns tensors in ascending offset order with absolute
/// offsets; throws eredu::Error naming `path`, the tensor and the offending numbers.
FileLayout parse_file_prefix(std::span<const std::byte> bytes, std::uint64_t file_size, const std::string& path);

/// Reads the prefix and header of a file through `reader` (checking the length before
/// allocating, so at most 100,000,008 bytes) and validates them as parse_file_prefix does.
FileLayout read_layout(HeaderReader& reader, std::uint64_t file_size, const std::string& path);

/// read_layout of the open file `fd`.
FileLayout read_layout(int fd, std::uint64_t file_size, const std::string& path);

/// The safetensors CheckpointFormat (name "safetensors"): the fallback format, since
/// safetensors files have no magic number.
class SafetensorsFormat final : public CheckpointFormat {
 public:
  /// "safetensors".
  std::string_view name() const noexcept override { return "safetensors"; }
  /// True for a plausible length prefix followed by `{` or JSON whitespace, or a
  /// `.safetensors` name.
  bool probe(std::span<const std::byte> head, std::string_view path) const noexcept override;
  /// read_layout(reader, file_size, path).
  FileLayout parse(HeaderReader& reader, std::uint64_t file_size, const std::string& path) const override;
};

}  // namespace eredu::io::safetensors
