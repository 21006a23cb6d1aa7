#pragma once
/// \file
/// What a load checks its bytes against: engine::VerifyOptions (off, on, require; the digests;
/// the preferred digest kind), part of MaterializeOptions, PrefetchOptions and, through
/// SwapOptions::checksums, both model slots.
///
/// Where a tensor is read whole with its dtype kept, on a backend that can hash its weights
/// (VerifyingBackend: the CPU backend), the bytes are hashed where they landed, on the
/// backend's executor, as soon as that tensor is in — while the others are still being read —
/// so what is checked is exactly what the load delivers. Tensors that feed a recipe (a cast,
/// a concat), and every tensor on a backend that cannot hash its weights, are checked by
/// hashing the file's bytes again (io::async_verify_checksums, from the page cache where
/// they are resident), concurrently with the load. A partial selection (a tensor-parallel
/// shard) is checked against the digest of that shard (io::Checksums, "__shards__" in the
/// sidecar) the same ways; without one it counts as unverified, since the digest of the whole
/// tensor cannot check part of it.
/// Verification failing fails the load like any read error: nothing is bound or published.

#include "eredu/io/integrity/checksums.hpp"
#include "eredu/io/integrity/digest.hpp"

namespace eredu::engine {

/// Whether a load verifies digests.
enum class VerifyMode {
  off,      ///< verify nothing
  on,       ///< verify every tensor that has a digest; log one line when none has
  require,  ///< like on, but fail (invalid_argument, before any read) unless every tensor read is verifiable
};

/// Per-load verification (see file comment).
struct VerifyOptions {
  VerifyMode mode = VerifyMode::off;  ///< off, on or require
  /// The digests; when empty, those the checkpoint's metadata records ("sha256:<tensor>",
  /// "xxh3-128:<tensor>"). A sidecar is the caller's to find: io::Checksums::discover.
  io::Checksums checksums{};
  /// The digest checked where a tensor has both (SHA-256 by default; XXH3-128 is ~10x
  /// cheaper to compute and not cryptographic).
  io::DigestKind preferred = io::DigestKind::sha256;
};

/// Throws eredu::Error(invalid_argument) naming the field when `options.mode` or
/// `options.preferred` is not one of its enumerators (a value cast from an integer). Every
/// load that takes VerifyOptions calls it before reading anything.
void validate(const VerifyOptions& options);

}  // namespace eredu::engine
