#pragma once
// ReaderCore: the state and decisions both readers share — queued pieces, batch
// completion, the O_DIRECT choice per request, interpretation of each result, counters.
// A reader adds only how requests reach the kernel (io_uring SQEs, or pread on workers).
// Not thread-safe: each reader calls it from one context at a time (the io_uring reader's
// strand, the pread reader's mutex); only stats() may be called from anywhere.

#include <atomic>
#include <deque>
#include <exception>
#include <list>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

#include "eredu/io/reading/open_file.hpp"
#include "eredu/io/reading/reader.hpp"
#include "page_cache_probe.hpp"
#include "read_piece.hpp"

namespace eredu::io::detail {

/// See the file comment.
class ReaderCore {
 public:
  /// Alignment of O_DIRECT offsets, lengths and buffers.
  static constexpr std::size_t direct_align = 4096;

  /// Validates the options (eredu::Error(invalid_argument)) and prepares per-file state.
  ReaderCore(std::span<OpenFile> files, const ReaderOptions& options);

  std::span<OpenFile> files;   ///< the checkpoint's files (owned by the source)
  ReaderOptions options;       ///< as given
  std::deque<Piece*> pending;  ///< pieces waiting for a request slot, in order

  /// Queues a batch's pieces at the back of `pending`; a batch with nothing to read is
  /// completed at once.
  void add(const std::vector<ReadSegment>& segments, ReadCallback done, BatchId id);
  /// The unfinished batch `id`, or null (completed, unknown, or 0).
  Batch* find(BatchId id) noexcept;
  /// The pieces of unfinished batch `b`.
  std::span<Piece> pieces_of(Batch& b) noexcept;
  /// Fails `b` with errc::cancelled unless it failed already, dropping its queued pieces
  /// unread (Reader::cancel), and completes it when none of its pieces is in flight.
  void cancel(Batch& b);
  /// Whether the next read of `p` ([pos, pos+len) into dst) should use O_DIRECT.
  bool want_direct(const Piece& p, std::uint64_t pos, const std::byte* dst, std::uint64_t len);
  /// Interprets one completed read of `p` (bytes, or -errno): finishes the piece, queues
  /// it again at the front (short read, EAGAIN, O_DIRECT refused), or fails its batch.
  /// `res` has the injected fault (options.faults) applied here, unless `fault_applied`
  /// says the caller did it already (the pread workers do, outside their lock).
  void on_result(Piece& p, long res, bool fault_applied = false);
  /// Fails `b` with `failure` unless it failed already, dropping its queued pieces. The
  /// caller still holds one of its pieces (so the batch stays unfinished).
  void fail(Batch& b, ReadFailure failure);
  /// Fails every unfinished batch with `failure` (see fail()).
  void fail_all(const ReadFailure& failure);
  /// Completes every unfinished batch (with its failure, or cancelled) and drops all
  /// pieces. Only when nothing is in flight any more.
  void cancel_all();
  /// The eredu::Error a batch failing with `failure` completes with: its kind, the file's
  /// path, the offset, the errno and the detail.
  std::exception_ptr to_exception(const ReadFailure& failure) const;
  /// Direct-read alignment of `file`, 0 when it is read buffered only.
  std::size_t direct_alignment(std::uint32_t file) const noexcept;
  /// Whether an aligned request of `file` at [offset, offset + length) would be read O_DIRECT
  /// (want_direct's rule for a page-aligned destination).
  bool reads_direct(std::uint32_t file, std::uint64_t offset, std::uint64_t length) const noexcept;

  /// What the page-cache guard noted before a read (see guard_before()).
  struct CacheTicket {
    std::uint64_t generation = 0;  ///< the file's drop generation when the read began
    bool drops_running = false;    ///< a drop of the file's pages was running then
  };
  /// Whether the read of `p` about to be issued needs the page-cache guard: an O_DIRECT read
  /// of a file on a file system eredu does not trust, where a short direct read is completed
  /// inside the kernel from cached pages (FUSE in page-cache mode: `generic_file_read_iter`),
  /// pages that can hold zeros the kernel cached after a server's short reply.
  bool guarded(const Piece& p) const noexcept;
  /// Before a guarded read of [pos, pos + len): drops the range's cached pages if any is
  /// cached, then notes the file's drop generation. Thread-safe; no lock needed.
  CacheTicket guard_before(std::uint32_t file, std::uint64_t pos, std::uint64_t len);
  /// After a guarded read of [pos, pos + n), n > 0: how many leading bytes are known to come
  /// from the server. All n when no page of the range is cached (a kernel fallback leaves
  /// the pages it read cached) and no drop ran meanwhile; else the bytes before the first
  /// cached page, 0 when a drop ran. `cached` says whether a cached page was seen.
  /// Thread-safe; no lock needed.
  std::uint64_t guard_after(std::uint32_t file, const CacheTicket& ticket, std::uint64_t pos, std::uint64_t n,
                            bool& cached) const;
  /// Whether the size the kernel holds for `file` (statx without a server round trip) is
  /// below its size when opened: a server's short reply in page-cache mode shrinks it until
  /// the next attribute refresh. Thread-safe.
  bool size_shrunk(std::uint32_t file) const noexcept;
  /// After a guarded read of [pos, pos + n), n > 0, under the file's PageCacheGuardLock: the
  /// leading bytes known to come from the server (guard_after), none when the kernel's size
  /// shrank (size_shrunk: a fallback may have run and left no page to see). When either saw
  /// the server answer short (`cached` is then true), switches the file's guarded reads to one
  /// at a time for good (PageCacheGuardLock::go_serial), logging it once; a read of
  /// `requested` bytes answered in full counts toward letting them share the lock
  /// (PageCacheGuardLock::answered_in_full). Thread-safe.
  std::uint64_t trusted_after_guarded_read(std::uint32_t file, const CacheTicket& ticket, std::uint64_t pos,
                                           std::uint64_t n, std::uint64_t requested, bool& cached) const;
  /// A guarded read of `p` delivered nothing that can be trusted: reads it again, shorter
  /// when a cached page was seen (a read the server answers in full needs no fallback), or
  /// fails its batch after max_cache_retries in a row.
  void on_cache_suspect(Piece& p, bool cached);

  /// Counts one direct read whose result was (in part) not trusted by the page-cache guard.
  void count_cache_redo();
  /// Counts one request issued for `p` (its `direct` already decided) and, while tracing,
  /// stamps its issue time.
  void count_request(Piece& p, bool fixed_buffer);
  /// Counts one system call.
  void count_syscall();
  /// A copy of the counters.
  ReaderStats stats() const;

 private:
  struct BatchState {
    Batch batch;
    std::vector<Piece> pieces;
  };
  void finish_piece(Piece& p);
  void complete(Batch& b);

  std::list<BatchState> batches_;
  std::vector<bool> direct_enabled_;
  std::vector<PageCacheProbe> probes_;
  // Per file: drops of its cached pages started, and running (see guard_before()).
  struct DropState {
    std::atomic<std::uint64_t> generation{0};
    std::atomic<unsigned> running{0};
  };
  std::unique_ptr<DropState[]> drops_;
  mutable std::mutex stats_mutex_;
  ReaderStats stats_;
};

}  // namespace eredu::io::detail
