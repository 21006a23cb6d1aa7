#pragma once
/// \file
/// Split GGUF checkpoints, as llama.cpp's `gguf-split` writes them: files
/// `<prefix>-00001-of-0000N.gguf` ... `<prefix>-0000N-of-0000N.gguf`, each a complete GGUF
/// file, which open as one checkpoint. Every file carries
///
/// ```
/// split.no             u16  its 0-based position (file i has split.no = i - 1)
/// split.count          u16  N, the number of files
/// split.tensors.count  i32  the tensors of all files together
/// ```
///
/// and the first file also carries the model's metadata. open_catalog cross-checks the set as
/// it does a sharded safetensors index: a missing file is shard_missing, keys that disagree
/// with the file names or with the tensors found are split_mismatch, and a tensor in two
/// files is tensor_in_two_shards.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace eredu::io::gguf {

/// The key holding a split file's 0-based position.
inline constexpr std::string_view split_no_key = "split.no";
/// The key holding the number of split files.
inline constexpr std::string_view split_count_key = "split.count";
/// The key holding the tensor count of all split files together.
inline constexpr std::string_view split_tensors_count_key = "split.tensors.count";

/// What a split file's name says.
struct SplitName {
  std::string prefix;        ///< the name before "-00001-of-00003.gguf"
  std::uint32_t number = 0;  ///< 1-based position in the name
  std::uint32_t count = 0;   ///< number of files in the name
};

/// Parses `<prefix>-NNNNN-of-MMMMM.gguf` (five digits each, 1 <= NNNNN <= MMMMM, a non-empty
/// prefix); nullopt for any other name.
std::optional<SplitName> parse_split_name(std::string_view file_name);

/// The name of file `number` (1-based) of `count`: `<prefix>-00001-of-00003.gguf`.
std::string split_file_name(std::string_view prefix, std::uint32_t number, std::uint32_t count);

}  // namespace eredu::io::gguf
