#pragma once
/// \file
/// eredu::io::CheckpointSource: an open checkpoint that serves TensorReadRequests as leases.
///
/// It owns the catalog, the open files, the lease pool and a reader. Every read is an
/// Asio asynchronous operation, so a caller may `co_await` it with asio::use_awaitable,
/// pass a callback, or take a std::future with asio::use_future:
///
/// \code
///   std::filesystem::path path = "model/";
///   auto source = co_await io::async_open_checkpoint(ex, path, asio::use_awaitable);  // default options
///   io::TensorReadRequest request{"model.embed_tokens.weight"};
///   io::Lease w = co_await source->async_read(request, asio::use_awaitable);
///   consume(w.bytes());   // drop `w` to return its staging memory
/// \endcode
///
/// Failures arrive as an eredu::Error (in the std::exception_ptr of the completion, thrown
/// by co_await) whose code() is the errc kind and whose message names file, tensor and
/// offset. Leases must be dropped before the source is destroyed.
///
/// g++ 12 note: inside a coroutine, name the request (`TensorReadRequest r{key};
/// co_await source->async_read(r, ...)`) and the options, or call async_open_checkpoint without
/// them, rather than writing a temporary in the co_await expression: that compiler relocates
/// such temporaries bitwise, corrupting std::string (`io::SourceOptions{}` there aborts).

#include <asio/any_io_executor.hpp>
#include <asio/async_result.hpp>
#include <asio/awaitable.hpp>
#include <atomic>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <vector>

#include "eredu/core/detail/handler_delivery.hpp"
#include "eredu/core/detail/spawn_operation.hpp"
#include "eredu/core/unique_function.hpp"
#include "eredu/io/formats/catalog.hpp"
#include "eredu/io/mapping/mapped_tensor.hpp"
#include "eredu/io/mapping/mapped_view.hpp"
#include "eredu/io/reading/byte_source.hpp"
#include "eredu/io/reading/lease.hpp"
#include "eredu/io/reading/lease_pool.hpp"
#include "eredu/io/reading/open_file.hpp"
#include "eredu/io/reading/reader.hpp"
#include "eredu/io/reading/tensor_read_request.hpp"
#include "eredu/io/remote/remote_options.hpp"

namespace eredu::io {

/// Everything configurable about a CheckpointSource.
struct SourceOptions {
  LeasePoolOptions pool{};  ///< staging budget (default 256 MiB)
  ReaderOptions reader{};   ///< reader kind, depth, request size, O_DIRECT policy
  /// Largest chunk of a chunked read (clamped so a chunk's window fits the budget).
  std::size_t chunk_bytes = std::size_t{64} << 20;
  /// Let map_resident() hand out mappings of page-cache-resident tensors, which a backend
  /// converts with no staging copy. While reader.faults is set it does so only if the
  /// injector allows it, so tests that inject read errors keep exercising the readers.
  bool map_resident = true;
  /// When not empty, every checkpoint file must resolve (symbolic links followed) inside
  /// this directory (CatalogOptions::confine_to); else errc::outside_root.
  std::filesystem::path confine_to{};
  /// Transport, S3, read sizes and cache for a checkpoint behind a URL (docs/remote.md).
  RemoteOptions remote{};
};

/// Throws eredu::Error(invalid_argument) naming the first option of `options` out of its
/// accepted range (the pool's, the reader's, chunk_bytes >= 1). CheckpointSource::open calls it.
void validate(const SourceOptions& options);

class ChunkStream;
namespace detail {
struct RemoteSession;
}

/// An open checkpoint (see file comment); an io::ByteSource. Not movable: readers and leases
/// point into it.
class CheckpointSource {
 public:
  /// Opens the checkpoint at `path` (file, directory or index; or a URL: `https://`, `http://`,
  /// `s3://`, read with ranged GETs, see docs/remote.md) and its files, creates the pool and the
  /// reader: io_uring for files on local file systems, pread for files on
  /// FUSE, NFS, SMB and other file systems where io_uring can hide a failed read
  /// (ReaderOptions::uring_policy), pread everywhere when io_uring is unavailable; one log
  /// line per file says which reader it got and why. Blocking; throws eredu::Error
  /// (invalid_argument for options out of range, see validate()). Prefer
  /// async_open_checkpoint on an event loop.
  static std::unique_ptr<CheckpointSource> open(asio::any_io_executor executor, const std::filesystem::path& path,
                                                const SourceOptions& options = {});
  ~CheckpointSource();
  CheckpointSource(const CheckpointSource&) = delete;
  CheckpointSource& operator=(CheckpointSource&&) = delete;
  CheckpointSource& operator=(const CheckpointSource&) = delete;

  /// Executor completions run on when a handler has none of its own.
  const asio::any_io_executor& get_executor() const noexcept { return executor_; }
  /// The checkpoint's tensors.
  const Catalog& catalog() const noexcept { return catalog_; }
  /// The staging pool (budget, high-water mark).
  LeasePool& pool() noexcept { return *pool_; }
  /// The reader in use.
  Reader& reader() noexcept { return *reader_; }
  /// The options the source was opened with.
  const SourceOptions& options() const noexcept { return options_; }
  /// Bytes the reader read only because a direct-read window (a chunk's, or one of
  /// async_read_window_into) rounds a selection out to the file's alignment: bytes of
  /// neighbouring tensors, never delivered. The reader's byte count minus this is what the
  /// source's callers asked for.
  std::uint64_t alignment_bytes() const noexcept { return alignment_bytes_.load(std::memory_order_relaxed); }

  /// What the source can do (io::ByteSource): map pages when some file's page cache is
  /// trusted (map_tensor and map_resident still refuse a file it does not trust), direct
  /// windows when some file is read O_DIRECT, requests of the reader's size and depth. Its
  /// errors are trusted: files where io_uring could hide a failed read are read with pread.
  SourceCapabilities capabilities() const;

  /// Reads the request's bytes into one lease; waits while the pool is full.
  ///
  /// @par Completion Signature
  /// `void(std::exception_ptr, Lease)`. Errors: tensor_not_found, invalid_selection,
  /// exceeds_budget (the selection is larger than the pool: use stream()), io_error,
  /// unexpected_eof, file_changed, direct_io_unsupported, cancelled — each an eredu::Error
  /// naming file, tensor and offset.
  ///
  /// @par Per-Operation Cancellation
  /// terminal: a wait for staging memory ends at once; the read's requests not yet issued are
  /// dropped, and those in flight cancelled where the kernel can or let finish (the kernel
  /// writes into the lease's memory: Reader::cancel). Then the lease is back in the pool and
  /// the operation fails with errc::cancelled.
  ///
  /// The request is copied; the source must outlive the operation and the lease.
  template <asio::completion_token_for<void(std::exception_ptr, Lease)> Token>
  auto async_read(const TensorReadRequest& request, Token&& token) {
    return eredu::detail::spawn_operation(executor_, read_lease(std::make_unique<TensorReadRequest>(request)),
                                          std::forward<Token>(token));
  }

  /// Reads the request's bytes straight into `destination` (exactly the selected size),
  /// bypassing the pool: for callers that own the final memory (one copy from the page
  /// cache, or none with O_DIRECT when everything is page-aligned).
  ///
  /// @par Completion Signature
  /// `void(std::exception_ptr)`. Errors: those of async_read but exceeds_budget, and
  /// invalid_argument when `destination` is not the selection's size.
  ///
  /// @par Per-Operation Cancellation
  /// terminal: the read's requests not yet issued are dropped, those in flight cancelled
  /// where the kernel can or let finish (Reader::cancel); then the operation fails with
  /// errc::cancelled, `destination` holding some of the bytes or none.
  ///
  /// The request is copied; the source and the memory of `destination` must outlive the
  /// operation.
  template <asio::completion_token_for<void(std::exception_ptr)> Token>
  auto async_read_into(const TensorReadRequest& request, std::span<std::byte> destination, Token&& token) {
    return eredu::detail::spawn_operation(
        executor_, read_into(std::make_unique<TensorReadRequest>(request), destination), std::forward<Token>(token));
  }

  /// The window a direct read of the request covers, when its bytes are one non-empty run of
  /// a file the reader would read O_DIRECT now (a trusted local file system, direct reads
  /// allowed and, under DirectMode::automatic, the window not in the page cache); std::nullopt
  /// otherwise. For a caller that owns the final memory of a cold tensor whose file offset
  /// is not aligned: reading the whole window into memory laid out like the file lets the
  /// disk write it there (no page-cache copy, no page-cache pages to populate). Validates
  /// the request (throws eredu::Error); callable from any thread.
  std::optional<DirectWindow> direct_window(const TensorReadRequest& request) const;

  /// Reads the window of the request's bytes (see direct_window) into `window`, which must be
  /// the window's size and aligned to the file's direct-read alignment (a page): the selection
  /// lands at `window.data() + lead`, the bytes around it are its neighbours' in the file and
  /// count in alignment_bytes(). A failed window read (a bad sector of a neighbour, say) is
  /// retried as the selection's bytes alone, so an error names this tensor only when its own
  /// bytes fail.
  ///
  /// @par Completion Signature
  /// `void(std::exception_ptr)`. Errors: those of async_read_into, and invalid_argument when
  /// `window` has the wrong size or alignment or the request has no window.
  ///
  /// @par Per-Operation Cancellation
  /// terminal, as async_read_into (a cancelled window read is not retried as the selection's
  /// bytes alone).
  ///
  /// The request is copied; the source and the memory of `window` must outlive the operation.
  template <asio::completion_token_for<void(std::exception_ptr)> Token>
  auto async_read_window_into(const TensorReadRequest& request, std::span<std::byte> window, Token&& token) {
    return eredu::detail::spawn_operation(
        executor_, read_window_into(std::make_unique<TensorReadRequest>(request), window), std::forward<Token>(token));
  }

  /// A stream of bounded chunk leases covering the request, in order; for tensors larger
  /// than the pool. Validates the request at once (throws eredu::Error).
  ChunkStream stream(TensorReadRequest request);

  /// A mapping of the request's selected bytes when they are one contiguous run of a file
  /// that looks resident in the page cache and options().map_resident allows it;
  /// std::nullopt otherwise, also when mmap fails (read through the pool then). A backend that converts dtypes
  /// reads the mapping instead of a staged copy: one pass over the bytes instead of two, then
  /// calls MappedView::check_unchanged(), as the source's own reads check their file.
  /// Validates the request (throws eredu::Error); callable from any thread.
  std::optional<MappedView> map_resident(const TensorReadRequest& request) const;

  /// The request's selected bytes mapped read-only to be held as weight storage (see
  /// MappedTensor for what that trades), when they are one non-empty contiguous run of a file
  /// whose page cache the source trusts (never FUSE, NFS and the like: see map_resident) and
  /// injected faults allow mapping; std::nullopt otherwise, also when mmap fails (the caller
  /// copies the bytes then). The mappings of one file share one duplicated descriptor, so
  /// they outlive the source. Validates the request (throws eredu::Error); callable from any
  /// thread.
  std::optional<MappedTensor> map_tensor(const TensorReadRequest& request) const;

  /// Selected bytes of a request, validated: throws tensor_not_found / invalid_selection.
  std::uint64_t selected_bytes(const TensorReadRequest& request) const;

 private:
  friend class ChunkStream;
  struct Plan;
  // Only open() constructs (and then fills the catalog, files, pool and reader).
  CheckpointSource(asio::any_io_executor executor, const SourceOptions& options);
  Plan make_plan(const TensorReadRequest& request) const;
  // open() of a URL: the remote catalog, then the cache's local copies or the remote reader.
  void open_remote(const std::string& location);
  asio::awaitable<Lease> read_lease(std::unique_ptr<TensorReadRequest> request);
  asio::awaitable<void> read_into(std::unique_ptr<TensorReadRequest> request, std::span<std::byte> destination);
  asio::awaitable<Lease> read_chunk(const Plan& plan, std::uint64_t offset, std::uint64_t length);
  asio::awaitable<void> read_window_into(std::unique_ptr<TensorReadRequest> request, std::span<std::byte> window);
  // Reads the aligned window [window_start, window_start + window_bytes) holding `length`
  // bytes of `t` at `file_off` into `window`; on an io_error, those bytes alone.
  asio::awaitable<void> read_window(const TensorInfo& t, std::uint64_t file_off, std::uint64_t length,
                                    std::uint64_t window_start, std::byte* window, std::uint64_t window_bytes);
  // The reader for `files` under `options` (marks each file's read_with_pread), logging
  // one line per file. An io_uring reader registers `pool`'s memory and hooks its release.
  static std::unique_ptr<Reader> make_reader(const asio::any_io_executor& executor, std::span<OpenFile> files,
                                             LeasePool& pool, const ReaderOptions& options);
  // Fails with file_changed when the tensor's file changed size since open or was rewritten
  // (FileStamp: modification or status-change time): bytes just read may then not be the file's.
  void check_unchanged(const TensorInfo& tensor) const;

  asio::any_io_executor executor_;
  SourceOptions options_;
  Catalog catalog_;
  std::vector<OpenFile> files_;
  // A remote checkpoint's client, signers and cache: destroyed after the reader, which uses them.
  std::unique_ptr<detail::RemoteSession> remote_;
  std::unique_ptr<LeasePool> pool_;  // destroyed after the reader, which may write into it
  std::unique_ptr<Reader> reader_;
  std::atomic<std::uint64_t> alignment_bytes_{0};
  // map_tensor's per-file descriptors and identities, made at a file's first mapping.
  mutable std::mutex mapped_files_mutex_;
  mutable std::vector<std::shared_ptr<const MappedFile>> mapped_files_;
};

/// Sequence of chunk leases of one request (CheckpointSource::stream). Move-only; the
/// source must outlive it. One async_next at a time.
class ChunkStream {
 public:
  ChunkStream(ChunkStream&&) noexcept;
  ChunkStream& operator=(ChunkStream&&) noexcept;
  ~ChunkStream();

  /// Bytes the request selects in all.
  std::uint64_t total() const noexcept;
  /// Bytes not yet handed out.
  std::uint64_t remaining() const noexcept;

  /// The next chunk, or an empty optional after the last one.
  ///
  /// @par Completion Signature
  /// `void(std::exception_ptr, std::optional<Lease>)`. Errors: those of
  /// CheckpointSource::async_read but exceeds_budget.
  ///
  /// @par Per-Operation Cancellation
  /// terminal, as CheckpointSource::async_read; the stream stays at the chunk it was at.
  ///
  /// The stream's state (the stream, or the stream it was moved into) and its source must
  /// outlive the operation; one async_next at a time.
  template <asio::completion_token_for<void(std::exception_ptr, std::optional<Lease>)> Token>
  auto async_next(Token&& token) {
    return eredu::detail::spawn_operation(source_->executor_, next(source_, state_.get()), std::forward<Token>(token));
  }

 private:
  friend class CheckpointSource;
  struct State;
  ChunkStream(CheckpointSource* source, std::unique_ptr<State> state);
  // Takes the state, not the stream: the state stays put when the stream is moved, so a
  // deferred async_next may be launched after a move.
  static asio::awaitable<std::optional<Lease>> next(CheckpointSource* source, State* state);
  CheckpointSource* source_;
  std::unique_ptr<State> state_;
};

namespace detail {
/// Implementation of async_open_checkpoint: opens on a short-lived thread.
void start_open_thread(asio::any_io_executor executor, std::filesystem::path path, SourceOptions options,
                       UniqueFunction<void(std::exception_ptr, std::unique_ptr<CheckpointSource>)> done);

}  // namespace detail

/// Opens a checkpoint without blocking the caller's event loop: headers are parsed on a
/// helper thread.
///
/// @par Completion Signature
/// `void(std::exception_ptr, std::unique_ptr<CheckpointSource>)`. Errors: those of
/// CheckpointSource::open.
///
/// @par Per-Operation Cancellation
/// none: parsing runs to its end.
///
/// Every argument is taken by value: nothing needs to outlive the operation but the
/// executor's context.
template <asio::completion_token_for<void(std::exception_ptr, std::unique_ptr<CheckpointSource>)> Token>
auto async_open_checkpoint(asio::any_io_executor executor, std::filesystem::path path, SourceOptions options,
                           Token&& token) {
  using Sig = void(std::exception_ptr, std::unique_ptr<CheckpointSource>);
  return asio::async_initiate<Token, Sig>(
      [](auto handler, asio::any_io_executor ex, std::filesystem::path p, SourceOptions o) {
        auto done = eredu::detail::deliver_on_handler_executor<std::exception_ptr, std::unique_ptr<CheckpointSource>>(
            std::move(handler), ex);
        detail::start_open_thread(std::move(ex), std::move(p), std::move(o), std::move(done));
      },
      token, std::move(executor), std::move(path), std::move(options));
}

/// async_open_checkpoint with default options.
template <asio::completion_token_for<void(std::exception_ptr, std::unique_ptr<CheckpointSource>)> Token>
auto async_open_checkpoint(asio::any_io_executor executor, std::filesystem::path path, Token&& token) {
  return async_open_checkpoint(std::move(executor), std::move(path), SourceOptions{}, std::forward<Token>(token));
}

}  // namespace eredu::io
