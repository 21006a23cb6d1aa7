#pragma once
/// \file
/// eredu::io::PreadReader: the portable Reader, for kernels where io_uring is missing or
/// disabled, and for files on file systems where io_uring's results cannot be trusted
/// (file_system.hpp). min(depth, ReaderOptions::max_pread_threads) worker threads each issue
/// one pread at a time; completions are
/// delivered to the awaiting handler's executor exactly as UringReader delivers them.

#include <memory>
#include <span>

#include "eredu/io/reading/open_file.hpp"
#include "eredu/io/reading/reader.hpp"

namespace eredu::io {

/// pread-based reader (see file comment).
class PreadReader final : public Reader {
 public:
  /// Starts min(`options.depth`, ReaderOptions::max_pread_threads) worker threads reading
  /// `files` (which must outlive the reader); fewer, with a log line, when the system
  /// refuses more threads. Throws eredu::Error: invalid_argument for options out of range
  /// (validate()), io_error when not one thread can be started.
  PreadReader(std::span<OpenFile> files, const ReaderOptions& options);
  /// Lets the workers finish the read each is doing, then completes every unfinished batch
  /// with errc::cancelled.
  ~PreadReader() override;

  std::string_view name() const noexcept override { return "pread"; }
  void read(std::vector<ReadSegment> segments, ReadCallback done, BatchId id) override;
  void cancel(BatchId id) override;
  ReaderStats stats() const override;
  std::size_t direct_alignment(std::uint32_t file) const noexcept override;
  bool reads_direct(std::uint32_t file, std::uint64_t offset, std::uint64_t length) const noexcept override;
  std::string describe() const override;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace eredu::io
