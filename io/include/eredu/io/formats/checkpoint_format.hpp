#pragma once
/// \file
/// eredu::io::CheckpointFormat: the plug-in point for checkpoint file formats.
///
/// A format turns one file's header into a FileLayout (tensors with absolute byte
/// ranges). Readers and the lease pool only ever see byte ranges, so adding a format
/// (GGUF) means adding one implementation here and nothing else.

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "eredu/io/formats/header_reader.hpp"
#include "eredu/io/formats/tensor_info.hpp"

namespace eredu::io {

/// What a format parser found in one file: its metadata and its tensors, in offset order,
/// with absolute offsets (TensorInfo::file is left 0; the catalog assigns it).
struct FileLayout {
  std::string format{};               ///< format name, as CheckpointFormat::name()
  std::uint64_t data_offset = 0;      ///< absolute offset of the data region
  Metadata metadata{};                ///< file-level metadata
  std::vector<TensorInfo> tensors{};  ///< in ascending offset order
};

/// One checkpoint file format.
class CheckpointFormat {
 public:
  virtual ~CheckpointFormat() = default;
  /// Short lowercase name ("safetensors").
  virtual std::string_view name() const noexcept = 0;
  /// True when a file starting with `head` (up to 64 bytes) named `path` is of this format.
  virtual bool probe(std::span<const std::byte> head, std::string_view path) const noexcept = 0;
  /// Reads (through `reader`: a local file or a remote object) and validates the header of a
  /// file of `file_size` bytes; throws eredu::Error naming `path`, the tensor and the offending
  /// numbers.
  virtual FileLayout parse(HeaderReader& reader, std::uint64_t file_size, const std::string& path) const = 0;
};

/// The formats eredu knows, most specific first; the last one (safetensors, which has no
/// magic number) is the fallback when none probes positive.
std::span<const CheckpointFormat* const> checkpoint_formats();

}  // namespace eredu::io
