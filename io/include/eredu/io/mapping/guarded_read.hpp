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
/// any guarded_read, goes to the handler that was installed before eredu's (the default one
/// kills, as it would have).
///
/// The process-wide SIGBUS handler: every call checks that eredu's handler is installed and
/// (re)installs it when not, remembering the handler it displaces. So an application handler
/// installed before eredu's keeps getting every fault that is not eredu's; one installed
/// after eredu's gets every fault until the next guarded_read puts eredu's handler back in
/// front of it (then it gets those that are not eredu's). An application that installs a
/// SIGBUS handler must therefore (1) install it before reading mappings through eredu, or
/// accept that eredu reinstalls its own in front, and (2) not treat a fault inside a region
/// eredu is reading as its own: if it chains to the handler it replaced, as it should, the
/// chain ends in eredu's, which resolves those faults (a fault bounced back to eredu from its
/// own chain takes the default action: the process dies, as without any handler).
std::optional<MappingFault> guarded_read(std::span<const std::byte> region, void (*access)(void*), void* context);

/// guarded_read() for a callable, called once by reference.
template <class F>
std::optional<MappingFault> guarded_read(std::span<const std::byte> region, F& access) {
  return guarded_read(
      region, [](void* f) { (*static_cast<F*>(f))(); }, &access);
}

}  // namespace eredu::io
