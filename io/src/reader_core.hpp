#pragma once
// ReaderCore: the state and decisions both readers share — queued pieces, batch
// completion, the O_DIRECT choice per request, interpretation of each result, counters.
// A reader adds only how requests reach the kernel (io_uring SQEs, or pread on workers).
// Not thread-safe: each reader calls it from one context at a time (the io_uring reader's
// strand, the pread reader's mutex); only stats() may be called from anywhere.

#include <deque>
#include <exception>
#include <list>
#include <mutex>
#include <span>
#include <vector>

#include "eredu/io/open_file.hpp"
#include "eredu/io/reader.hpp"
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
  void add(const std::vector<ReadSegment>& segments, ReadCallback done);
  /// Whether the next read of `p` ([pos, pos+len) into dst) should use O_DIRECT.
  bool want_direct(const Piece& p, std::uint64_t pos, const std::byte* dst, std::uint64_t len);
  /// Interprets one completed read of `p` (bytes, or -errno): finishes the piece, queues
  /// it again at the front (short read, EAGAIN, O_DIRECT refused), or fails its batch.
  void on_result(Piece& p, long res);
  /// Fails `b` with `failure` unless it failed already, dropping its queued pieces.
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
  mutable std::mutex stats_mutex_;
  ReaderStats stats_;
};

}  // namespace eredu::io::detail
