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
/// interpreted, so that tests exercise the real short-read and error paths.
class FaultInjector {
 public:
  virtual ~FaultInjector() = default;
  /// The fault to apply to a read of `length` bytes at `offset` of file number `file`.
  virtual ReadFault on_complete(std::uint32_t file, std::uint64_t offset, std::uint64_t length) = 0;
};

}  // namespace eredu::io
