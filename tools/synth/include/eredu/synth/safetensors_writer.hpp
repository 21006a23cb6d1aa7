#pragma once
/// \file
/// A safetensors writer that produces the same bytes as the reference writer for a given
/// tensor order, streaming tensor data so that files of any size need constant memory.
///
/// On-disk layout written:
/// ```
/// [0..8)        N, u64 little-endian
/// [8..8+N)      compact JSON: {"__metadata__":{...},"name":{"dtype":..,"shape":[..],
///               "data_offsets":[b,e]},...}, space-padded to a multiple of 8
/// [8+N..EOF)    tensor data, contiguous, in the order given
/// ```
/// Sharded checkpoints follow the transformers convention: `model-0000i-of-0000n.safetensors`
/// shards plus `model.safetensors.index.json`.

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "eredu/core/dtype.hpp"
#include "eredu/core/shape.hpp"
#include "eredu/io/formats/tensor_info.hpp"
#include "eredu/io/reading/unique_fd.hpp"

namespace eredu::synth {

/// What the writer needs to know of one tensor: its name, element type and shape.
struct TensorSpec {
  std::string name{};  ///< checkpoint key (any string; escaped as JSON)
  DType dtype{};       ///< element type
  Shape shape{};       ///< row-major dimensions
  friend bool operator==(const TensorSpec&, const TensorSpec&) = default;
};

/// Stored bytes of `tensor`; throws eredu::Error(size_overflow) when the size overflows u64
/// or is not a whole number of bytes.
std::uint64_t tensor_nbytes(const TensorSpec& tensor);

/// Sum of tensor_nbytes over `tensors`; throws eredu::Error(size_overflow) on overflow.
std::uint64_t total_nbytes(std::span<const TensorSpec> tensors);

/// The header JSON (without the 8-byte length prefix) the reference writer emits for these
/// tensors laid out contiguously in the given order: compact, `__metadata__` first when
/// non-empty, padded with spaces to a multiple of 8. Throws eredu::Error(invalid_argument)
/// for a name or metadata string that is not valid UTF-8, (size_overflow) for sizes.
std::string safetensors_header(std::span<const TensorSpec> tensors_in_file_order, const io::Metadata& metadata);

/// Streams one safetensors file: the constructor writes the length prefix and header, write()
/// appends tensor data in file order, finish() checks that exactly the declared data was
/// written and closes. Destroying an unfinished writer closes the file and leaves it (short)
/// on disk. Every operating-system failure throws eredu::Error(io_error) naming the file.
class SafetensorsFileWriter {
 public:
  /// Creates (or truncates) `path` and writes the prefix and header for `tensors_in_file_order`.
  SafetensorsFileWriter(const std::filesystem::path& path, std::span<const TensorSpec> tensors_in_file_order,
                        const io::Metadata& metadata = {});
  SafetensorsFileWriter(SafetensorsFileWriter&&) noexcept = default;
  SafetensorsFileWriter& operator=(SafetensorsFileWriter&&) noexcept = default;
  SafetensorsFileWriter(const SafetensorsFileWriter&) = delete;
  SafetensorsFileWriter& operator=(const SafetensorsFileWriter&) = delete;
  ~SafetensorsFileWriter() = default;

  /// Appends the next `bytes` of the data region; throws eredu::Error(invalid_argument) if
  /// that would pass the declared data size, (io_error) if the write fails.
  void write(std::span<const std::byte> bytes);
  /// Checks that the whole data region was written (else invalid_argument), optionally
  /// fsyncs, and closes the file (close errors are io_error too).
  void finish(bool sync = false);

  /// The file being written.
  const std::filesystem::path& path() const noexcept { return path_; }
  /// Bytes of the header, without the 8-byte prefix.
  std::uint64_t header_size() const noexcept { return header_size_; }
  /// Bytes the data region must hold.
  std::uint64_t data_size() const noexcept { return data_size_; }
  /// Data bytes written so far.
  std::uint64_t data_written() const noexcept { return data_written_; }
  /// Size the finished file has: 8 + header_size() + data_size().
  std::uint64_t file_size() const noexcept { return 8 + header_size_ + data_size_; }

 private:
  void write_all(std::span<const std::byte> bytes);

  std::filesystem::path path_;
  io::UniqueFd fd_;
  std::uint64_t header_size_ = 0;
  std::uint64_t data_size_ = 0;
  std::uint64_t data_written_ = 0;
};

/// Writes a whole safetensors file: `data[i]` holds the bytes of `tensors[i]`, and must have
/// exactly its size (else eredu::Error(invalid_argument)).
void write_safetensors(const std::filesystem::path& path, std::span<const TensorSpec> tensors,
                       std::span<const std::span<const std::byte>> data, const io::Metadata& metadata = {});

/// Creates (or truncates) `path` holding exactly `contents`; throws eredu::Error(io_error).
void write_text_file(const std::filesystem::path& path, std::string_view contents);

/// Splits tensors, in order, into shards whose data is at most `max_shard_bytes` (a tensor
/// larger than that gets a shard of its own); returns the index of each shard's first tensor.
std::vector<std::size_t> split_by_max_bytes(std::span<const TensorSpec> tensors, std::uint64_t max_shard_bytes);

/// Splits tensors, in order, into exactly `count` non-empty shards of nearly equal bytes;
/// returns the index of each shard's first tensor. Throws eredu::Error(invalid_argument) when
/// `count` is 0 or exceeds the number of tensors.
std::vector<std::size_t> split_evenly(std::span<const TensorSpec> tensors, std::uint32_t count);

/// "model-00002-of-00005.safetensors" for `index` 1 (0-based) of `count` shards.
std::string shard_file_name(std::size_t index, std::size_t count);

/// The contents of `model.safetensors.index.json` for `tensors` split at `shard_starts` (as
/// returned by split_by_max_bytes): total_size is the sum of tensor bytes, weight_map names
/// each tensor's shard. Indented like transformers writes it.
std::string sharded_index_json(std::span<const TensorSpec> tensors, std::span<const std::size_t> shard_starts);

/// Writes a sharded checkpoint into `dir` (created if missing): the shards from
/// split_by_max_bytes, each with `__metadata__` {"format":"pt"}, and the index. `data[i]`
/// holds the bytes of `tensors[i]`.
void write_sharded(const std::filesystem::path& dir, std::span<const TensorSpec> tensors,
                   std::span<const std::span<const std::byte>> data, std::uint64_t max_shard_bytes);

}  // namespace eredu::synth
