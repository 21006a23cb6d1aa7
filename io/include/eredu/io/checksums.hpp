#pragma once
/// \file
/// eredu::io::Checksums: expected SHA-256 digests of checkpoint tensors (of their bytes as
/// stored), and async_verify_checksums, which reads every listed tensor through a source
/// and compares — what a hot-swap runs before it publishes a new version.
///
/// Where digests come from:
///  * the checkpoint's metadata: a key "sha256:<tensor name>" whose value is the digest;
///  * a sidecar file next to the checkpoint (Checksums::sidecar_path): a JSON object
///    {"<tensor name>": "<digest>", ...}.
/// `eredu gen --checksums` writes the sidecar; tools that produce MANIFEST.json-style
/// records can write the same object.
///
/// Verification re-reads the listed tensors (page-cache hot right after a load) in bounded
/// chunk leases and hashes each chunk on a hashing executor while the next one is read, so
/// the event loop that runs the reads (and, in a server, the requests) never spends its
/// time hashing. It costs one extra pass over the bytes and about one core. It checks the
/// file as it is when verified: a file rewritten between a load and its verification is
/// caught only if its size changed (file_changed) or the new bytes differ from the digests.

#include <asio/any_io_executor.hpp>
#include <asio/async_result.hpp>
#include <asio/awaitable.hpp>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <string>

#include "eredu/core/detail/spawn_operation.hpp"
#include "eredu/io/catalog.hpp"
#include "eredu/io/checkpoint_source.hpp"

namespace eredu::io {

/// Tensor name → expected SHA-256 (64 lowercase hex digits).
class Checksums {
 public:
  /// The digests recorded in `catalog`'s metadata ("sha256:<tensor>" keys). Throws
  /// Error(invalid_metadata) for a digest that is not 64 hex digits.
  static Checksums from_metadata(const Catalog& catalog);
  /// The digests of a sidecar JSON file. Throws Error(io_error) when it cannot be read,
  /// Error(invalid_metadata) when it is not an object of tensor → 64-hex-digit strings.
  static Checksums from_sidecar(const std::filesystem::path& path);
  /// Where the sidecar of `checkpoint` lives: "<file>.sha256.json" next to a file,
  /// "<dir>/checksums.sha256.json" inside a directory (sharded checkpoints).
  static std::filesystem::path sidecar_path(const std::filesystem::path& checkpoint);
  /// Metadata digests, plus the sidecar's when it exists (a tensor in both must agree).
  static Checksums discover(const std::filesystem::path& checkpoint, const Catalog& catalog);

  /// Records the digest of `tensor` (lowercased). Throws Error(invalid_argument) for a
  /// malformed digest.
  void add(const std::string& tensor, std::string digest);
  /// The expected digest of `tensor`, or nullptr.
  const std::string* find(const std::string& tensor) const;
  /// Number of tensors with a digest.
  std::size_t size() const noexcept { return digests_.size(); }
  /// True when no tensor has one.
  bool empty() const noexcept { return digests_.empty(); }
  /// Every digest, by tensor name.
  const std::map<std::string, std::string>& digests() const noexcept { return digests_; }
  /// The sidecar JSON text of these digests.
  std::string to_json() const;

 private:
  std::map<std::string, std::string> digests_;
};

namespace detail {
/// The coroutine behind async_verify_checksums.
asio::awaitable<std::uint64_t> verify_checksums(CheckpointSource& source, Checksums checksums,
                                                asio::any_io_executor hasher);
}  // namespace detail

/// Reads every tensor `checksums` lists through `source` and compares its SHA-256, hashing
/// on `hasher` (a thread pool's executor, say; a default-constructed one means a hashing
/// thread of this operation's own).
///
/// @par Completion Signature
/// `void(std::exception_ptr, std::uint64_t bytes_verified)`. Errors: tensor_not_found for a
/// digest of a tensor the catalog lacks; checksum_mismatch naming file, tensor, offset,
/// expected and actual digest; any read error; cancelled.
///
/// @par Per-Operation Cancellation
/// terminal, checked between chunks (never while a chunk is being hashed): the operation
/// fails with errc::cancelled and every lease is back.
///
/// `source` and the context of `hasher` must outlive the operation; `checksums` is copied.
template <asio::completion_token_for<void(std::exception_ptr, std::uint64_t)> Token>
auto async_verify_checksums(CheckpointSource& source, Checksums checksums, asio::any_io_executor hasher,
                            Token&& token) {
  return eredu::detail::spawn_operation(source.get_executor(),
                                        detail::verify_checksums(source, std::move(checksums), std::move(hasher)),
                                        std::forward<Token>(token));
}

/// async_verify_checksums hashing on a thread of the operation's own.
template <asio::completion_token_for<void(std::exception_ptr, std::uint64_t)> Token>
auto async_verify_checksums(CheckpointSource& source, Checksums checksums, Token&& token) {
  return async_verify_checksums(source, std::move(checksums), asio::any_io_executor(), std::forward<Token>(token));
}

}  // namespace eredu::io
