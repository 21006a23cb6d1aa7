#pragma once
// A delta of one tensor as the XOR of its bytes with its base's, split into byte planes and
// compressed with zstd (private to eredu::mpi). For the drift pattern of RL steps (most bf16
// values moved by a few units in the last place), the planes hold the XOR's high bytes, almost
// all zero, apart from its low bytes, and compress to a quarter of the tensor
// (docs/performance.md, "Which encoding, by pattern").
//
// The tensor is cut into chunks of `chunk_bytes` (a whole number of elements), each its own
// zstd frame, so that the publisher compresses them in parallel and a rank decompresses only
// the chunks its selection touches. Layout: u64 chunk_bytes, u64 count, count × u64 frame
// size, then the frames in order. Within a chunk of n elements of e bytes, plane j (byte j of
// every element, 0 ≤ j < e) comes after planes 0..j-1: byte j of element k is at j·n + k.

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace eredu::mpi::detail {

/// Bytes of tensor per chunk: a multiple of every element size up to 8.
inline constexpr std::size_t xor_chunk_bytes = std::size_t{1} << 20;

/// The encoded delta of `now` against `before` (same size), elements of `element` bytes.
/// Chunks are compressed in parallel (oneTBB). Throws std::bad_alloc.
std::vector<std::byte> encode_xor_planes(std::span<const std::byte> now, std::span<const std::byte> before,
                                         std::size_t element);

/// An encoded delta read back: where each chunk's frame lies. Its errors are
/// Error(checksum_mismatch) naming `file` (the source), `tensor` and the offset.
class XorPlanes {
 public:
  /// Checks the layout of `encoded` (which it does not copy) for a tensor of `nbytes` bytes.
  XorPlanes(std::span<const std::byte> encoded, std::uint64_t nbytes, std::size_t element, std::string file,
            std::string tensor);

  /// Number of chunks.
  std::size_t chunks() const noexcept { return frames_.size(); }
  /// Bytes of tensor per chunk (the last may be shorter).
  std::uint64_t chunk_bytes() const noexcept { return chunk_bytes_; }
  /// Decompresses chunk `c` into `planes` (at least chunk_bytes()); returns its byte count.
  /// Throws Error(checksum_mismatch) when the frame does not decompress to exactly that.
  std::size_t decompress(std::size_t c, std::span<std::byte> planes) const;
  /// XORs the delta's bytes [from, from + out.size()) of the tensor onto `out`, given chunk
  /// `c` decompressed in `planes` (the range lies within that chunk).
  void apply(std::size_t c, std::span<const std::byte> planes, std::uint64_t from, std::span<std::byte> out) const;

 private:
  std::span<const std::byte> encoded_;
  std::uint64_t nbytes_;
  std::size_t element_;
  std::string file_;
  std::string tensor_;
  std::uint64_t chunk_bytes_ = 0;
  std::vector<std::pair<std::uint64_t, std::uint64_t>> frames_;  ///< offset in encoded_, size
};

}  // namespace eredu::mpi::detail
