#pragma once
/// \file
/// eredu::io::BlockDigests: the XXH3-128 digests of a byte string's 64 KiB blocks, in order,
/// and the digest they make (DigestKind::xxh3_128_blocks): XXH3-128 of the blocks' canonical
/// digests, concatenated. A change to some blocks changes only their digests, so whoever holds
/// a string's block digests digests a new version of it by hashing only the blocks that
/// changed, not the whole string (engine::InPlaceModelSlot::async_patch of a delta).
///
/// \code
///   io::BlockDigests kept = io::BlockDigests::of(serving);   // once, when the bytes are checked
///   kept.set(3, new_block_3);                                  // block 3 changed
///   check.compare(kept.hex_digest(), serving.size());          // the whole new version's digest
/// \endcode

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace eredu::io {

/// The digests of a byte string's blocks of block_bytes (the last may be shorter).
class BlockDigests {
 public:
  /// Bytes per block: small enough that a sparse change rehashes little, large enough that
  /// the digests take 1/4096 of the bytes.
  static constexpr std::size_t block_bytes = std::size_t{64} << 10;
  /// One block's XXH3-128, canonical (big-endian).
  using Digest = std::array<std::byte, 16>;

  /// No blocks: the digests of an empty string.
  BlockDigests() = default;
  /// The digests of `data`'s blocks.
  static BlockDigests of(std::span<const std::byte> data);
  /// The digest of one block's bytes.
  static Digest digest_of(std::span<const std::byte> block) noexcept;

  /// Blocks of the string.
  std::size_t size() const noexcept { return digests_.size(); }
  /// Bytes of the string.
  std::uint64_t bytes() const noexcept { return bytes_; }
  /// Bytes the digests take (what a holder counts against its budget).
  std::uint64_t memory_bytes() const noexcept { return digests_.size() * sizeof(Digest); }
  /// Block `i`'s bytes in the string: [first, first + length).
  std::uint64_t block_first(std::size_t i) const noexcept { return std::uint64_t{i} * block_bytes; }
  /// Block `i`'s length: block_bytes, or the rest for the last block.
  std::size_t block_length(std::size_t i) const noexcept;

  /// Appends the digest of the next block, of `length` bytes. Throws Error(invalid_argument)
  /// after a shorter last block, or for a length of 0 or past block_bytes.
  void append(const Digest& digest, std::size_t length);
  /// Replaces block `i`'s digest by that of its new bytes `block`. Throws
  /// Error(invalid_argument) when `i` is no block or `block` is not its length.
  void set(std::size_t i, std::span<const std::byte> block);
  /// The string's digest (DigestKind::xxh3_128_blocks), 32 lowercase hex digits.
  std::string hex_digest() const;

  /// Same string length, same digests.
  bool operator==(const BlockDigests&) const = default;

 private:
  std::vector<Digest> digests_;
  std::uint64_t bytes_ = 0;
};

}  // namespace eredu::io
