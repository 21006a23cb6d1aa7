#pragma once
/// \file
/// A GGUF writer (version 3, as ggml's gguf_write_to_file lays files out): the header, then
/// each tensor's data padded to the alignment, so that io::gguf parses what it writes. Data
/// is streamed, so files of any size need constant memory. Also the deterministic quantized
/// data of synthetic GGUF checkpoints (valid blocks with sane scales, not a real quantizer).
///
/// On-disk layout written (see io/gguf.hpp):
/// ```
/// "GGUF" u32 3, i64 n_tensors, i64 n_kv, KV pairs in the order given, tensor infos (ne =
/// the row-major shape reversed, offsets the running aligned sum), zero padding to the
/// alignment, tensor data each zero-padded to the alignment
/// ```

#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "eredu/io/formats/gguf.hpp"
#include "eredu/io/reading/unique_fd.hpp"
#include "eredu/synth/safetensors_writer.hpp"

namespace eredu::synth {

/// One KV pair to write.
struct GgufKeyValue {
  std::string key;        ///< the key (non-empty, unique)
  io::gguf::Value value;  ///< its typed value
};

/// A UINT8 value.
io::gguf::Value gguf_u8(std::uint8_t v);
/// A UINT16 value.
io::gguf::Value gguf_u16(std::uint16_t v);
/// A UINT32 value.
io::gguf::Value gguf_u32(std::uint32_t v);
/// An INT32 value.
io::gguf::Value gguf_i32(std::int32_t v);
/// A UINT64 value.
io::gguf::Value gguf_u64(std::uint64_t v);
/// An INT64 value.
io::gguf::Value gguf_i64(std::int64_t v);
/// A FLOAT32 value.
io::gguf::Value gguf_f32(float v);
/// A FLOAT64 value.
io::gguf::Value gguf_f64(double v);
/// A BOOL value.
io::gguf::Value gguf_bool(bool v);
/// A STRING value.
io::gguf::Value gguf_string(std::string v);
/// An ARRAY of STRING.
io::gguf::Value gguf_string_array(std::vector<std::string> v);
/// An ARRAY of INT32.
io::gguf::Value gguf_i32_array(std::span<const std::int32_t> v);

/// The alignment `kv` declares (general.alignment, a UINT32), else 32.
std::uint32_t gguf_alignment(std::span<const GgufKeyValue> kv);

/// The header bytes (magic through the padding before the data) for `tensors` in file order
/// (row-major shapes; each dtype one GGUF can hold, each quantized shape whole blocks) and
/// `kv`. Throws eredu::Error(invalid_argument) for a dtype without a ggml type, a shape that
/// cuts blocks, more than 4 dimensions or a bad alignment; (size_overflow) for sizes.
std::vector<std::byte> gguf_header(std::span<const TensorSpec> tensors, std::span<const GgufKeyValue> kv);

/// Streams one GGUF file: the constructor writes the header, write() appends tensor data in
/// file order (the padding after each tensor is inserted for the caller), finish() checks
/// that every tensor was written and closes. Operating-system failures throw
/// eredu::Error(io_error) naming the file.
class GgufFileWriter {
 public:
  /// Creates (or truncates) `path` and writes the header for `tensors` and `kv`.
  GgufFileWriter(const std::filesystem::path& path, std::span<const TensorSpec> tensors,
                 std::span<const GgufKeyValue> kv);
  GgufFileWriter(GgufFileWriter&&) noexcept = default;
  GgufFileWriter& operator=(GgufFileWriter&&) noexcept = default;
  GgufFileWriter(const GgufFileWriter&) = delete;
  GgufFileWriter& operator=(const GgufFileWriter&) = delete;
  ~GgufFileWriter() = default;

  /// Appends the next `bytes` of tensor data; throws eredu::Error(invalid_argument) past the
  /// last tensor's end.
  void write(std::span<const std::byte> bytes);
  /// Checks that every tensor was written (else invalid_argument), optionally fsyncs, closes.
  void finish(bool sync = false);

  /// The file being written.
  const std::filesystem::path& path() const noexcept { return path_; }
  /// Bytes of the header, padding included (the data section's offset).
  std::uint64_t header_size() const noexcept { return header_size_; }
  /// Unpadded tensor bytes the file holds.
  std::uint64_t data_size() const noexcept { return data_size_; }

 private:
  void write_all(std::span<const std::byte> bytes);
  void pad_to(std::uint64_t boundary);

  std::filesystem::path path_;
  io::UniqueFd fd_;
  std::vector<std::uint64_t> sizes_;  // each tensor's bytes
  std::uint32_t alignment_ = io::gguf::default_alignment;
  std::uint64_t header_size_ = 0;
  std::uint64_t data_size_ = 0;
  std::size_t tensor_ = 0;       // the tensor being written
  std::uint64_t in_tensor_ = 0;  // its bytes written so far
  std::uint64_t position_ = 0;   // data section bytes written, padding included
};

/// Writes a whole GGUF file; `data[i]` holds exactly the bytes of `tensors[i]`.
void write_gguf(const std::filesystem::path& path, std::span<const TensorSpec> tensors,
                std::span<const std::span<const std::byte>> data, std::span<const GgufKeyValue> kv = {});

/// Fills `out` with bytes [byte_offset, byte_offset + out.size()) of quantized `tensor`'s
/// synthetic data from `seed`: deterministic random blocks whose scale fields hold small
/// positive finite values, so every block dequantizes to finite numbers. Throws
/// eredu::Error(invalid_argument) for a dtype that is not quantized or a range past the end.
void fill_quantized_bytes(std::uint64_t seed, const TensorSpec& tensor, std::uint64_t byte_offset,
                          std::span<std::byte> out);

}  // namespace eredu::synth
