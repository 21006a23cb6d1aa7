#pragma once
/// \file
/// eredu::io::Checksums: expected digests of checkpoint tensors (of their bytes as stored),
/// DigestCheck, one tensor's check, and async_verify_checksums, which reads every listed
/// tensor through a source and compares — what a swap or a load falls back to when it could
/// not hash the bytes it delivered.
///
/// Where digests come from:
///  * the checkpoint's metadata: a key "sha256:<tensor name>" (or "xxh3-128:<tensor name>")
///    whose value is the hex digest;
///  * a sidecar file next to the checkpoint (Checksums::sidecar_path): a JSON object whose
///    members are tensors, each either a SHA-256 string — {"<tensor>": "<64 hex digits>"} —
///    or an object of digests by name — {"<tensor>": {"sha256": "...", "xxh3-128": "..."}};
///  * digests the caller adds.
///
/// A tensor-parallel rank reads only its part of a split tensor, which a digest of the whole
/// tensor cannot check. Shard digests can: the digest of one selection of a tensor, over its
/// bytes in the order a load delivers them (row-major within the selection, as stored),
/// recorded in the sidecar under the reserved member "__shards__" — {"__shards__":
/// {"<tensor>": {"[0:1024, 0:4096]": "<digest>" or {"sha256": ..., "xxh3-128": ...}}}}, keyed
/// by Selection::to_string(). `eredu checksum PATH --tensor-parallel N` records those of every
/// rank of an N-rank group, after checking the whole tensors against the digests they have.
/// `eredu gen --checksums` writes the sidecar; tools that produce MANIFEST.json-style
/// records can write the same object. SHA-256 is the interoperable default; XXH3-128
/// (digest.hpp) is a fast non-cryptographic alternative.
///
/// async_verify_checksums hashes several tensors at once on a hashing executor, each read
/// from a guarded mapping when it is resident in the page cache (no staging copy) and
/// otherwise in bounded chunk leases, so the event loop that runs the reads (and, in a
/// server, the requests) never spends its time hashing. It checks the file as it is when
/// verified: bytes a load delivered are checked only by hashing them where they landed
/// (engine::VerifyOptions does that for backends that can).

#include <asio/any_io_executor.hpp>
#include <asio/async_result.hpp>
#include <asio/awaitable.hpp>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <span>
#include <string>

#include "eredu/core/detail/spawn_operation.hpp"
#include "eredu/core/selection.hpp"
#include "eredu/io/formats/catalog.hpp"
#include "eredu/io/integrity/digest.hpp"
#include "eredu/io/reading/checkpoint_source.hpp"

namespace eredu::io {

/// The digests recorded for one tensor (any may be missing).
struct TensorDigests {
  std::string sha256{};           ///< 64 lowercase hex digits, or empty
  std::string xxh3_128{};         ///< 32 lowercase hex digits, or empty
  std::string xxh3_128_blocks{};  ///< 32 lowercase hex digits, or empty
  /// The digest of `kind`, or nullptr when none is recorded.
  const std::string* get(DigestKind kind) const noexcept;
  /// Every digest equal.
  bool operator==(const TensorDigests&) const = default;
};

/// One tensor's expected digest and what an error about it names.
struct DigestCheck {
  DigestKind kind = DigestKind::sha256;  ///< the digest to compute
  std::string expected{};                ///< lowercase hex
  std::string file{};                    ///< the tensor's file, for messages
  std::string tensor{};                  ///< the tensor's name
  std::uint64_t offset = 0;              ///< absolute file offset of its (first) bytes
  std::uint64_t bytes = 0;               ///< its stored size (of the selection, for a shard)
  Selection selection{};                 ///< the part hashed: all, or a shard
  /// Throws Error(checksum_mismatch) naming file, tensor, offset, the shard, both digests
  /// and the number of bytes hashed when `actual` differs from `expected`.
  void compare(const std::string& actual, std::uint64_t hashed) const;
  /// Hashes `data` (the tensor's or the shard's bytes as stored) and compares.
  void verify(std::span<const std::byte> data) const;
};

/// The digests recorded for one shard of a tensor.
struct ShardDigests {
  Selection selection{};    ///< the shard
  TensorDigests digests{};  ///< its digests
  /// Same shard, same digests.
  bool operator==(const ShardDigests&) const = default;
};

/// Tensor name → expected digests.
class Checksums {
 public:
  /// The digests recorded in `catalog`'s metadata ("sha256:<tensor>", "xxh3-128:<tensor>"
  /// keys). Throws Error(invalid_metadata) for a malformed digest.
  static Checksums from_metadata(const Catalog& catalog);
  /// The digests of a sidecar JSON file. Throws Error(io_error) with the errno when it cannot
  /// be opened or read (or is no regular file: never blocks on a FIFO),
  /// Error(invalid_metadata) when it is not an object of tensor → digest string or object.
  static Checksums from_sidecar(const std::filesystem::path& path);
  /// Where the sidecar of `checkpoint` lives: "<file>.sha256.json" next to a file,
  /// "<dir>/checksums.sha256.json" inside a directory (sharded checkpoints).
  static std::filesystem::path sidecar_path(const std::filesystem::path& checkpoint);
  /// Metadata digests, plus the sidecar's when it exists (a digest in both must agree).
  /// A sidecar whose status cannot be read (a symbolic-link loop, a directory it cannot
  /// search) is from_sidecar's io_error, not taken for none.
  static Checksums discover(const std::filesystem::path& checkpoint, const Catalog& catalog);

  /// Records the SHA-256 of `tensor` (lowercased). Throws Error(invalid_argument) for a
  /// malformed digest.
  void add(const std::string& tensor, std::string digest);
  /// Records the digest of `kind` of `tensor` (lowercased). Throws Error(invalid_argument)
  /// for a malformed digest.
  void add(const std::string& tensor, DigestKind kind, std::string digest);
  /// Records the digest of `kind` of the shard `selection` of `tensor` (see file comment).
  /// Throws Error(invalid_argument) for a malformed digest or a selection of the whole tensor.
  void add_shard(const std::string& tensor, const Selection& selection, DigestKind kind, std::string digest);
  /// The expected SHA-256 of `tensor`, or nullptr.
  const std::string* find(const std::string& tensor) const;
  /// The expected digest of `kind` of `tensor`, or nullptr.
  const std::string* find(const std::string& tensor, DigestKind kind) const;
  /// The check of `tensor` in `catalog`: its `preferred` digest when recorded, else another
  /// one (in digest_kinds' order); nullopt when it has none. Throws Error(tensor_not_found) when the catalog
  /// lacks the tensor.
  std::optional<DigestCheck> check(const Catalog& catalog, const std::string& tensor,
                                   DigestKind preferred = DigestKind::sha256) const;
  /// The check of the part `selection` of `tensor`: check() for the whole tensor, else its
  /// shard digest (nullopt when none is recorded). Throws Error(tensor_not_found) as check(),
  /// Error(invalid_argument) when the selection does not fit the tensor.
  std::optional<DigestCheck> check(const Catalog& catalog, const std::string& tensor, const Selection& selection,
                                   DigestKind preferred = DigestKind::sha256) const;
  /// Number of tensors with a digest of the whole tensor.
  std::size_t size() const noexcept { return digests_.size(); }
  /// Number of shard digests (each shard with one or both digests counts once).
  std::size_t shard_count() const noexcept;
  /// True when no tensor and no shard has one.
  bool empty() const noexcept { return digests_.empty() && shards_.empty(); }
  /// Every tensor's digests, by tensor name.
  const std::map<std::string, TensorDigests>& digests() const noexcept { return digests_; }
  /// Every shard's digests: tensor name → Selection::to_string() → digests.
  const std::map<std::string, std::map<std::string, ShardDigests>>& shards() const noexcept { return shards_; }
  /// The sidecar JSON text of these digests: plain SHA-256 strings when that is all there is
  /// (the format older readers know), objects by digest name otherwise. Throws what
  /// check_recordable throws for a tensor's name.
  std::string to_json() const;
  /// Throws Error(invalid_argument) naming `tensor` when a sidecar cannot record its name:
  /// one that is not UTF-8 (a GGUF name may be any bytes), which JSON text cannot hold.
  static void check_recordable(const std::string& tensor);

 private:
  std::map<std::string, TensorDigests> digests_;
  std::map<std::string, std::map<std::string, ShardDigests>> shards_;
};

/// How async_verify_checksums works.
struct VerifyChecksumsOptions {
  /// Tensors hashed at once (at least 1; 0 means one per hardware thread).
  unsigned concurrency = 0;
  /// The digest preferred where a tensor has both.
  DigestKind preferred = DigestKind::sha256;
};

namespace detail {
/// The coroutine behind async_verify_checksums.
asio::awaitable<std::uint64_t> verify_checksums(CheckpointSource& source, Checksums checksums,
                                                asio::any_io_executor hasher, VerifyChecksumsOptions options);
}  // namespace detail

/// Reads every tensor `checksums` lists through `source` and compares its digest — and every
/// listed shard of a tensor that has no digest of its own (one that has is covered by it) —
/// hashing
/// `options.concurrency` tensors at once on `hasher` (a thread pool's executor, say; a
/// default-constructed one means a pool of that many threads of this operation's own).
///
/// @par Completion Signature
/// `void(std::exception_ptr, std::uint64_t bytes_verified)`. Errors: tensor_not_found for a
/// digest of a tensor the catalog lacks; checksum_mismatch naming file, tensor, offset,
/// expected and actual digest; any read error; cancelled. The first error in tensor order
/// is reported, after every tensor in flight has finished.
///
/// @par Per-Operation Cancellation
/// terminal, checked between chunks (never while a chunk is being hashed): the operation
/// fails with errc::cancelled and every lease is back.
///
/// `source` and the context of `hasher` must outlive the operation; `checksums` is copied.
template <asio::completion_token_for<void(std::exception_ptr, std::uint64_t)> Token>
auto async_verify_checksums(CheckpointSource& source, Checksums checksums, asio::any_io_executor hasher,
                            VerifyChecksumsOptions options, Token&& token) {
  return eredu::detail::spawn_operation(
      source.get_executor(), detail::verify_checksums(source, std::move(checksums), std::move(hasher), options),
      std::forward<Token>(token));
}

/// async_verify_checksums with default options.
template <asio::completion_token_for<void(std::exception_ptr, std::uint64_t)> Token>
auto async_verify_checksums(CheckpointSource& source, Checksums checksums, asio::any_io_executor hasher,
                            Token&& token) {
  return async_verify_checksums(source, std::move(checksums), std::move(hasher), VerifyChecksumsOptions{},
                                std::forward<Token>(token));
}

/// async_verify_checksums hashing on threads of the operation's own, with default options.
template <asio::completion_token_for<void(std::exception_ptr, std::uint64_t)> Token>
auto async_verify_checksums(CheckpointSource& source, Checksums checksums, Token&& token) {
  return async_verify_checksums(source, std::move(checksums), asio::any_io_executor(), VerifyChecksumsOptions{},
                                std::forward<Token>(token));
}

}  // namespace eredu::io
