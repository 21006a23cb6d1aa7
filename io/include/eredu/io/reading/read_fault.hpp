#pragma once
/// \file
/// eredu::io::FaultInjector: deterministic I/O faults for tests (short reads, errors).

#include <cstdint>

namespace eredu::io {

/// What an injected fault does to one completed read request.
struct ReadFault {
  std::int64_t truncate_to = -1;  ///< >= 0: pretend the read returned at most this many bytes
  int error = 0;                  ///< > 0: the read fails with this errno instead
};

/// Consulted by both readers for every completed read request, before its result is
/// interpreted, so that tests exercise the real short-read and error paths. The pread
/// reader's workers call it concurrently and without any reader lock held (so an injector
/// may block one read without stalling the others): implementations must be thread-safe.
class FaultInjector {
 public:
  virtual ~FaultInjector() = default;
  /// The fault to apply to a read of `length` bytes at `offset` of file number `file`.
  virtual ReadFault on_complete(std::uint32_t file, std::uint64_t offset, std::uint64_t length) = 0;
  /// Whether CheckpointSource::map_resident() may hand out mappings while this injector is
  /// set. False by default: mapped reads would bypass the faults injected into reads.
  virtual bool allow_mapping() const { return false; }
  /// Called when map_resident() has mapped a resident range of file number `file` and is
  /// about to hand it out: a test may shrink the file here, so the mapped read faults.
  virtual void on_map(std::uint32_t /*file*/, std::uint64_t /*offset*/, std::uint64_t /*length*/) {}
};

}  // namespace eredu::io
