#pragma once
// The bookkeeping both readers share: splitting segments into device-sized pieces, and
// interpreting one completed read (short read, EOF, EAGAIN, EINVAL on O_DIRECT, errors)
// the same way whichever system call produced it.

#include <cerrno>
#include <cstdint>
#include <optional>
#include <string>
#include <system_error>
#include <vector>

#include <fmt/format.h>

#include "eredu/core/errc.hpp"
#include "eredu/io/reading/read_fault.hpp"
#include "eredu/io/reading/reader.hpp"

namespace eredu::io::detail {

/// Why a batch of segments failed: the first failure seen. ReaderCore turns it into the
/// eredu::Error the batch completes with (to_exception).
struct ReadFailure {
  std::error_code code;      ///< eredu::errc::io_error, unexpected_eof, cancelled, direct_io_unsupported
  std::error_code os_error;  ///< errno of an io_error
  std::uint32_t file = 0;    ///< file of the failed request
  std::uint64_t offset = 0;  ///< absolute offset of the failed request
  std::string detail;        ///< what went wrong, with the numbers
};

/// A batch of segments handed to Reader::read(), completed once.
struct Batch {
  BatchId id = 0;                      ///< as given to Reader::read (0: none)
  std::size_t remaining = 0;           ///< pieces not yet finished (queued or in flight)
  std::optional<ReadFailure> failure;  ///< the first failure
  ReadCallback done;                   ///< run once remaining reaches 0
};

/// One request-sized part of a segment.
struct Piece {
  Batch* batch = nullptr;
  std::uint32_t file = 0;
  std::uint64_t offset = 0;  ///< absolute file offset of the piece's first byte
  std::byte* dest = nullptr;
  std::uint64_t length = 0;         ///< bytes asked for
  std::uint64_t required = 0;       ///< bytes that must arrive (the rest may be past EOF)
  std::uint64_t done = 0;           ///< bytes already read
  std::uint64_t submitted = 0;      ///< length of the read in flight
  bool direct = false;              ///< the read in flight was issued with O_DIRECT
  bool buffered_only = false;       ///< O_DIRECT failed or was cut short for this piece
  unsigned requeues = 0;            ///< EAGAIN / EINTR results in a row
  std::uint64_t request_limit = 0;  ///< longest next read (0: none); see ReaderCore's page-cache guard
  unsigned cache_retries = 0;       ///< guarded reads in a row that delivered nothing trusted
  std::uint64_t issued_ns = 0;      ///< when the read in flight was issued, while tracing (trace::now_ns)
  bool in_flight = false;           ///< the io_uring reader handed a read of it to the kernel
};

/// EAGAIN or EINTR results in a row after which a piece fails: a blocking read does not
/// return EAGAIN for long, and a server that answers nothing else must not spin forever.
inline constexpr unsigned max_requeues = 1000;

/// Guarded direct reads in a row that may each have been served from the page cache, after
/// which a piece fails: halving the request from the largest one down to one byte takes 23,
/// and a concurrent buffered reader of the same file may repopulate the cache meanwhile.
inline constexpr unsigned max_cache_retries = 256;

/// Splits segments into pieces of at most `max_request` bytes. Pieces lying wholly in
/// the optional tail of a direct window (past `required`) are dropped.
inline std::vector<Piece> split_segments(const std::vector<ReadSegment>& segments, Batch* batch,
                                         std::uint64_t max_request) {
  std::vector<Piece> pieces;
  for (const auto& s : segments) {
    const std::uint64_t required = s.required ? s.required : s.length;
    for (std::uint64_t off = 0; off < s.length; off += max_request) {
      if (off >= required) break;
      const std::uint64_t len = std::min<std::uint64_t>(max_request, s.length - off);
      pieces.push_back(
          {batch, s.file, s.offset + off, s.dest + off, len, std::min<std::uint64_t>(len, required - off)});
    }
  }
  return pieces;
}

/// What to do with a piece after one of its reads completed.
enum class Next {
  finished,        ///< every required byte is in
  resubmit,        ///< short read: read the rest
  requeue,         ///< EAGAIN: try the same read again
  retry_buffered,  ///< O_DIRECT refused (EINVAL) or cut short: redo the rest buffered
  failed,          ///< `failure` says why
};

/// Applies an injected fault to a raw result (bytes or -errno).
inline long apply_fault(FaultInjector* faults, const Piece& p, long res) {
  if (!faults) return res;
  ReadFault f = faults->on_complete(p.file, p.offset + p.done, p.length - p.done);
  if (f.error > 0) return -f.error;
  if (f.truncate_to >= 0 && res > f.truncate_to) return static_cast<long>(f.truncate_to);
  return res;
}

/// Interprets `res` (bytes read, or -errno) for piece `p`, advancing p.done.
inline Next classify(Piece& p, long res, const std::string& path, ReadFailure& failure, ReaderStats& stats) {
  const std::uint64_t at = p.offset + p.done;
  if (res == -EAGAIN || res == -EINTR) {
    ++stats.requeued;
    if (++p.requeues <= max_requeues) return Next::requeue;
    failure = {make_error_code(errc::io_error), std::error_code(static_cast<int>(-res), std::system_category()), p.file,
               at,
               fmt::format("read of {} bytes at offset {} of {} failed {} times in a row with a transient error",
                           p.length - p.done, at, path, max_requeues + 1)};
    return Next::failed;
  }
  p.requeues = 0;
  if (res == -EINVAL && p.direct) return Next::retry_buffered;
  if (res < 0) {
    failure = {make_error_code(errc::io_error), std::error_code(static_cast<int>(-res), std::system_category()), p.file,
               at, fmt::format("read of {} bytes at offset {} of {} failed", p.length - p.done, at, path)};
    return Next::failed;
  }
  p.done += static_cast<std::uint64_t>(res);
  stats.bytes += static_cast<std::uint64_t>(res);
  if (p.done >= p.required) return Next::finished;
  if (res == 0) {
    failure = {make_error_code(errc::unexpected_eof),
               {},
               p.file,
               at,
               fmt::format("{} ends at offset {}, {} bytes short of the {} bytes needed there "
                           "(truncated after it was opened?)",
                           path, at, p.required - p.done, p.required)};
    return Next::failed;
  }
  ++stats.short_reads;
  // A short O_DIRECT read leaves the rest unaligned: finish it buffered.
  return p.direct ? Next::retry_buffered : Next::resubmit;
}

}  // namespace eredu::io::detail
