#pragma once
/// \file
/// eredu::io::Catalog: name -> dtype, shape, file, byte range of every tensor of a
/// checkpoint, plus its metadata. Built by the format parsers, read by everything else.

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "eredu/io/formats/tensor_info.hpp"

namespace eredu::io {

/// Immutable-after-build index of a checkpoint's tensors, iterated in file order
/// (file index, then offset).
class Catalog {
 public:
  /// Appends a file; returns its index for TensorInfo::file.
  std::uint32_t add_file(CheckpointFile file);
  /// Appends a tensor of an added file. Tensors of one file must come in offset order.
  /// Throws eredu::Error(duplicate_tensor) naming both places if the name is taken.
  void add_tensor(TensorInfo tensor);
  /// Sets the checkpoint-level metadata.
  void set_metadata(Metadata metadata) { metadata_ = std::move(metadata); }

  /// Every tensor, in file order.
  std::span<const TensorInfo> tensors() const noexcept { return tensors_; }
  /// Every file of the checkpoint.
  std::span<const CheckpointFile> files() const noexcept { return files_; }
  /// The tensor called `name`, or nullptr.
  const TensorInfo* find(std::string_view name) const noexcept;
  /// The tensor called `name`; throws eredu::Error(tensor_not_found).
  const TensorInfo& at(std::string_view name) const;
  /// The file a tensor lives in.
  const CheckpointFile& file_of(const TensorInfo& t) const { return files_.at(t.file); }
  /// Checkpoint-level metadata (a single file's `__metadata__`, or the index's).
  const Metadata& metadata() const noexcept { return metadata_; }
  /// Sum of all tensors' stored bytes.
  std::uint64_t total_bytes() const noexcept { return total_bytes_; }
  /// Number of tensors.
  std::size_t size() const noexcept { return tensors_.size(); }

 private:
  struct Hash {
    using is_transparent = void;
    std::size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
  };
  std::vector<CheckpointFile> files_;
  std::vector<TensorInfo> tensors_;
  std::unordered_map<std::string, std::size_t, Hash, std::equal_to<>> index_;
  Metadata metadata_;
  std::uint64_t total_bytes_ = 0;
};

}  // namespace eredu::io
