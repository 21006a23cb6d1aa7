#pragma once
/// \file
/// eredu::io::Reader: moves byte ranges of open checkpoint files into staging memory.
///
/// Two implementations share this interface and its tests: UringReader (io_uring, the
/// default) and PreadReader (a thread pool of pread calls, for kernels without io_uring).
/// A reader splits every segment into device-sized requests (up to max_request bytes),
/// keeps up to `depth` of them in flight, resubmits short reads, requeues EAGAIN and
/// turns the first failure of a batch into an eredu::Error naming the file, the offset and
/// the errno. It knows nothing of tensors or formats (CheckpointSource adds the tensor).

#include <asio/any_io_executor.hpp>
#include <asio/associated_cancellation_slot.hpp>
#include <asio/async_result.hpp>
#include <asio/cancellation_type.hpp>
#include <cstdint>
#include <exception>
#include <string>
#include <string_view>
#include <vector>

#include "eredu/core/detail/handler_delivery.hpp"
#include "eredu/core/unique_function.hpp"
#include "eredu/io/reading/open_file.hpp"
#include "eredu/io/reading/read_fault.hpp"

namespace eredu::io {

/// One contiguous range of a file to read into memory.
struct ReadSegment {
  std::uint32_t file = 0;     ///< index into the reader's files
  std::uint64_t offset = 0;   ///< absolute file offset
  std::byte* dest = nullptr;  ///< where the bytes go (inside the lease pool)
  std::uint64_t length = 0;   ///< bytes to read
  /// Bytes from the start that must be read; the rest may lie past end of file. Less
  /// than `length` only for page-aligned windows of direct reads.
  std::uint64_t required = 0;
};

/// Counters a reader keeps (for summaries and tests).
struct ReaderStats {
  std::uint64_t requests = 0;               ///< read requests issued (resubmissions included)
  std::uint64_t bytes = 0;                  ///< bytes delivered
  std::uint64_t short_reads = 0;            ///< requests that returned fewer bytes than asked
  std::uint64_t requeued = 0;               ///< EAGAIN requeues
  std::uint64_t direct_requests = 0;        ///< requests issued with O_DIRECT
  std::uint64_t fixed_buffer_requests = 0;  ///< io_uring requests into registered buffers
  std::uint64_t syscalls = 0;               ///< submit/read system calls made
  std::uint64_t cache_redone = 0;           ///< direct reads (in part) redone: the page cache may have served them
};

/// Which of the two reader implementations to use.
enum class ReaderKind { automatic, uring, pread };

/// Whether to read with O_DIRECT.
enum class DirectMode {
  automatic,  ///< O_DIRECT for ranges not in the page cache, where the file system allows it
  on,         ///< always O_DIRECT; a file system without it is an error
  off,        ///< buffered reads only
};

/// Which files the io_uring reader may read; CheckpointSource reads the others with pread.
enum class UringPolicy {
  /// Files on local file systems (ext4, xfs, btrfs, tmpfs, overlayfs, ...; see
  /// file_system.hpp). Files on FUSE (and virtiofs), NFS, SMB, 9p, ceph and unknown file
  /// systems go to the pread reader: io_uring can report a failed read there as complete.
  by_file_system,
  /// Every file: the caller vouches for its file systems (a log line warns for each file on
  /// one eredu does not trust).
  every_file,
};

/// Options shared by both readers. CheckpointSource::open validates them
/// (eredu::Error(invalid_argument) naming the option and its accepted range).
struct ReaderOptions {
  /// Largest accepted `depth`.
  static constexpr unsigned max_depth = 4096;
  /// Most worker threads a PreadReader starts (it starts min(depth, this)).
  static constexpr unsigned max_pread_threads = 64;
  /// Largest accepted `max_request` (io_uring's limit for one read).
  static constexpr std::size_t max_request_limit = std::size_t{1} << 30;

  ReaderKind kind = ReaderKind::automatic;                 ///< implementation
  UringPolicy uring_policy = UringPolicy::by_file_system;  ///< which files io_uring may read
  unsigned depth = 4;                                      ///< requests in flight, 1..max_depth
  std::size_t max_request = std::size_t{4} << 20;          ///< largest single request, 1..max_request_limit bytes
  DirectMode direct = DirectMode::automatic;               ///< O_DIRECT policy
  bool register_buffers = true;                            ///< register the lease pool with io_uring (fixed buffers)
  /// Cap on registered bytes (0 = the whole pool); the fallback for small memlock limits
  /// also lands here.
  std::size_t max_registered_bytes = 0;
  /// io_uring: run buffered (page-cache) reads on the kernel's io-wq workers (IOSQE_ASYNC),
  /// so that the copies of the requests in flight use several cores instead of the thread
  /// that submits; measured 2.5 -> 4 GB/s for hot loads on a 2-core VM (docs/performance.md).
  bool parallel_buffered_copies = true;
  FaultInjector* faults = nullptr;  ///< test hook; must outlive the reader
};

/// Throws eredu::Error(invalid_argument) naming the first field of `options` out of its range
/// (depth 1..ReaderOptions::max_depth, max_request 1..ReaderOptions::max_request_limit, an
/// enumerator that is not one of its values).
void validate(const ReaderOptions& options);

/// Called exactly once per batch, on the reader's own context, when every request of the
/// batch has completed (so no kernel write into its memory is still pending): with null, or
/// with an eredu::Error whose kind is io_error, unexpected_eof, direct_io_unsupported or
/// cancelled and whose context names the file, the absolute offset of the failed request
/// and the errno (os_error) of an io_error.
using ReadCallback = UniqueFunction<void(std::exception_ptr)>;

/// Names one batch handed to Reader::read(), for Reader::cancel(); unique in the process.
using BatchId = std::uint64_t;

/// A reader of byte ranges (see file comment).
class Reader {
 public:
  virtual ~Reader() = default;
  /// A fresh BatchId (never 0). Thread-safe.
  static BatchId new_batch_id() noexcept;
  /// "io_uring" or "pread".
  virtual std::string_view name() const noexcept = 0;
  /// Starts reading every segment fully; `done` runs once, after the last byte landed or
  /// after the first failure once nothing of the batch is in flight any more. `id` (from
  /// new_batch_id(); 0: none) is what cancel() names the batch by.
  virtual void read(std::vector<ReadSegment> segments, ReadCallback done, BatchId id) = 0;
  /// Stops batch `id` if it has not completed: its requests not yet handed to the kernel (or
  /// to a worker) are dropped unread, those in flight are cancelled where the kernel can
  /// (io_uring) or left to finish, and the batch completes with errc::cancelled once none is
  /// in flight. Harmless for a completed or unknown batch. Thread-safe.
  virtual void cancel(BatchId id) = 0;
  /// Counters so far.
  virtual ReaderStats stats() const = 0;
  /// Alignment a direct read of `file` needs (0: the file is read buffered only).
  virtual std::size_t direct_alignment(std::uint32_t file) const noexcept = 0;
  /// Whether an aligned read of [offset, offset + length) of `file` would go O_DIRECT now:
  /// the mode, the file system and, under DirectMode::automatic, the page cache decide
  /// (sampled pages, as for every request). Callable from any thread.
  virtual bool reads_direct(std::uint32_t file, std::uint64_t offset, std::uint64_t length) const noexcept = 0;
  /// Describes the configuration in one line (for logs and summaries).
  virtual std::string describe() const = 0;

  /// Reads every segment (see read()).
  ///
  /// @par Completion Signature
  /// `void(std::exception_ptr)`: null once every byte landed, else the batch's first failure
  /// (see ReadCallback). The handler runs on its associated executor (or `fallback`, taken by
  /// value), never inline on the reaping thread.
  ///
  /// @par Per-Operation Cancellation
  /// terminal, partial and total, as cancel(): requests not yet issued are dropped, those in
  /// flight are cancelled where the kernel can or finish; then the operation fails with
  /// errc::cancelled (the memory behind the segments holds some of the bytes, or none). The
  /// slot's handler may be called from any thread.
  ///
  /// The reader and the memory behind the segments must outlive the operation.
  template <asio::completion_token_for<void(std::exception_ptr)> Token>
  auto async_read(std::vector<ReadSegment> segments, asio::any_io_executor fallback, Token&& token) {
    return asio::async_initiate<Token, void(std::exception_ptr)>(
        [](auto handler, Reader* self, std::vector<ReadSegment> segs, asio::any_io_executor ex) {
          const BatchId id = new_batch_id();
          // Installed before the read starts: a handler assigned after could outlive the batch.
          if (auto slot = asio::get_associated_cancellation_slot(handler); slot.is_connected()) {
            slot.assign([self, id](asio::cancellation_type type) {
              if (type != asio::cancellation_type::none) self->cancel(id);
            });
          }
          self->read(std::move(segs),
                     eredu::detail::deliver_on_handler_executor<std::exception_ptr>(std::move(handler), ex), id);
        },
        token, this, std::move(segments), std::move(fallback));
  }
};

}  // namespace eredu::io
