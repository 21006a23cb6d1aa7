#pragma once
/// \file
/// eredu::io::DigestKind and eredu::io::Hasher: the digests a checkpoint's tensors may be
/// checked against, and one incremental hasher for either.
///
///  * SHA-256 (the default): cryptographic and interoperable — Hugging Face and most
///    manifests record it. libcrypto with the CPU's SHA extensions: ~2 GB/s per core here.
///  * XXH3-128: a fast non-cryptographic check (libxxhash, ~19 GB/s per core here), for
///    catching corruption in transit or at rest where nobody forges checkpoints. Its hex
///    form is the canonical (big-endian) one `xxhsum -H2` prints.
///  * XXH3-128 over 64 KiB blocks (block_digests.hpp): XXH3-128 of the bytes' blocks'
///    XXH3-128 digests. As fast, and a holder of the blocks' digests digests a changed
///    version by hashing only the changed blocks: what live updates publish.

#include <cstddef>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "eredu/io/integrity/block_digests.hpp"

namespace eredu::io {

/// Which digest a check uses.
enum class DigestKind {
  sha256,    ///< SHA-256, 64 hex digits
  xxh3_128,  ///< XXH3 128-bit, 32 hex digits
  /// XXH3 128-bit of the XXH3 128-bit digests of the bytes' 64 KiB blocks
  /// (io::BlockDigests), 32 hex digits
  xxh3_128_blocks,
};

/// Every kind, in the order sidecars list them.
inline constexpr DigestKind digest_kinds[] = {DigestKind::sha256, DigestKind::xxh3_128, DigestKind::xxh3_128_blocks};

/// "sha256", "xxh3-128" or "xxh3-128-blocks": the digest's name in sidecars, metadata keys
/// and messages.
std::string_view digest_name(DigestKind kind) noexcept;
/// The kind named `name` ("sha256", "xxh3-128", "xxh3-128-blocks"), or nullopt.
std::optional<DigestKind> digest_kind_named(std::string_view name) noexcept;
/// Hex digits of a digest of `kind` (64 or 32).
std::size_t digest_hex_digits(DigestKind kind) noexcept;
/// True when `hex` is a digest of `kind` spelled in hex (either case).
bool is_digest_hex(DigestKind kind, std::string_view hex) noexcept;

/// Incremental hash of either kind. Move-only.
class Hasher {
 public:
  /// A fresh hash of `kind`. Throws eredu::Error(out_of_memory) when no state can be made.
  explicit Hasher(DigestKind kind);
  ~Hasher();
  Hasher(Hasher&&) noexcept;
  Hasher& operator=(Hasher&&) noexcept;
  Hasher(const Hasher&) = delete;
  Hasher& operator=(const Hasher&) = delete;

  /// The kind it computes.
  DigestKind kind() const noexcept { return kind_; }
  /// Feeds more bytes.
  void update(std::span<const std::byte> data) noexcept;
  /// Finishes and returns the lowercase hex digest. Call once.
  std::string hex_digest();
  /// After hex_digest(), of an xxh3_128_blocks hash: the blocks' digests it combined (moved
  /// out); empty for the other kinds, or when memory for their list ran out.
  BlockDigests take_blocks();

 private:
  struct State;
  DigestKind kind_;
  std::unique_ptr<State> state_;
};

/// The hex digest of `kind` of `data`.
std::string digest_hex(DigestKind kind, std::span<const std::byte> data);

}  // namespace eredu::io
