#pragma once
/// \file
/// eredu::io::UringReader: the io_uring implementation of Reader.
///
/// One ring; the checkpoint's files registered as fixed files and the lease pool's memory
/// as fixed buffers (as much of it as the locked-memory limit allows), registered when the
/// first read into it is submitted and dropped when the idle pool returns its pages
/// (pool_release_hook); up to `depth`
/// requests in flight, submitted in batches with one system call. The completion queue
/// is reaped from the Asio event loop: the ring signals an eventfd that the loop waits
/// on, so no thread ever blocks waiting for I/O.

#include <asio/any_io_executor.hpp>
#include <memory>
#include <span>

#include "eredu/io/reading/lease_pool.hpp"
#include "eredu/io/reading/open_file.hpp"
#include "eredu/io/reading/reader.hpp"

namespace eredu::io {

/// io_uring reader (see file comment). All ring work runs on a strand of the executor.
class UringReader final : public Reader {
 public:
  /// Sets up the ring for `files` (which must outlive the reader); `pool_memory` is
  /// registered as fixed buffers on the first read into it. Throws eredu::Error(uring_unavailable) when
  /// io_uring_setup fails (old kernel, seccomp, kernel.io_uring_disabled).
  UringReader(asio::any_io_executor executor, std::span<OpenFile> files, std::span<std::byte> pool_memory,
              const ReaderOptions& options);
  /// Waits for the kernel to finish every request in flight (their memory may be freed
  /// right after), then completes every unfinished batch with errc::cancelled. Must not
  /// run concurrently with the executor running this reader's handlers.
  ~UringReader() override;

  std::string_view name() const noexcept override { return "io_uring"; }
  void read(std::vector<ReadSegment> segments, ReadCallback done, BatchId id) override;
  void cancel(BatchId id) override;
  ReaderStats stats() const override;
  std::size_t direct_alignment(std::uint32_t file) const noexcept override;
  bool reads_direct(std::uint32_t file, std::uint64_t offset, std::uint64_t length) const noexcept override;
  std::string describe() const override;
  /// Bytes of the pool registered as fixed buffers now (0 before the first staged read).
  std::size_t registered_bytes() const noexcept;
  /// The lease pool's release hook for this reader: drops the registration on the reader's
  /// strand, then lets the pool return its pages. It may outlive the reader.
  LeasePool::ReleaseHook pool_release_hook();

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;  // shared with the handlers queued on the event loop
};

}  // namespace eredu::io
