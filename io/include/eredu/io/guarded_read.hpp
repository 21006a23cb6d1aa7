#pragma once
/// \file
/// eredu::io::guarded_read: runs code that reads a file mapping and hands back a fault as a
/// value, where an unguarded read would kill the process with SIGBUS.
///
/// Reading a mapped file faults when the file shrank under the mapping (another process
/// truncated it) or when paging the bytes in failed (an I/O error). A loader that converts
/// page-cache-resident tensors straight out of a mapping (no staging copy) reads only
/// inside guarded_read, so either case becomes a typed error naming file, tensor and offset.

#include <cstddef>
#include <optional>
#include <span>

namespace eredu::io {

/// Where a guarded read faulted.
struct MappingFault {
  const std::byte* address = nullptr;  ///< the byte whose read raised SIGBUS
};

/// Runs `access(context)`, which may read `region` (part of a file mapping). Returns
/// std::nullopt when it ran to its end, or the fault when a read inside `region` raised
/// SIGBUS: `access` is then abandoned where it stood, so it must hold no lock, resource or
/// object whose destructor matters (a conversion loop over raw bytes qualifies). An
/// exception from `access` propagates. A SIGBUS outside `region`, or on a thread outside
/// any guarded_read, goes to the handler installed before (the default one kills, as it
/// would have). The process-wide SIGBUS handler is installed on the first call.
std::optional<MappingFault> guarded_read(std::span<const std::byte> region, void (*access)(void*), void* context);

/// guarded_read() for a callable, called once by reference.
template <class F>
std::optional<MappingFault> guarded_read(std::span<const std::byte> region, F& access) {
  return guarded_read(
      region, [](void* f) { (*static_cast<F*>(f))(); }, &access);
}

}  // namespace eredu::io
