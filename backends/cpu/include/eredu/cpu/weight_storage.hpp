#pragma once
/// \file
/// eredu::cpu::WeightStorage: where a dtype-kept weight's bytes live — copied into pooled
/// memory (the default), or mapped read-only from the checkpoint's page-cache pages.
///
/// Mapping skips the one cost a copying load cannot: zeroing and copying fresh memory (a
/// 2 GiB first load is bound by the kernel zeroing pages, docs/performance.md). It is never
/// the default, because the weights then stop being the process's own bytes:
///  * they are the page cache's pages, shared with other processes mapping the file, and a
///    file rewritten in place changes them under a serving model. eredu checks the file at
///    every bind (a load, a swap): rewritten or truncated since it was opened refuses the
///    bind with file_changed; replaced by a rename (a new inode at the path) warns once and
///    binds, since the mapped bytes are the old file's, intact. Between binds nothing checks:
///    replace checkpoints by renaming, never by writing into them;
///  * a page the kernel cannot supply later (the file truncated, a disk error) raises SIGBUS
///    in whatever reads it, the application's forward pass included; eredu's own reads of
///    mapped weights (verification, demote, copies) are guarded and fail with a typed error;
///  * without locking, clean pages may be evicted under memory pressure and read back from
///    the file on their next use (slow, not wrong); `mapped_locked` pins them with mlock,
///    which counts against RLIMIT_MEMLOCK (checked, and a refusal names it);
///  * they are read-only (mapped_private: copy-on-write, so written pages become the
///    process's own and the file never changes): an in-place swap (InPlaceModelSlot) refuses
///    a mapped slot either way.
/// Only tensors read whole or as one contiguous run, with their stored dtype, from a local
/// file system (not FUSE, NFS and the like) and whose elements the file aligns are mapped;
/// any other is copied as usual. Casts and other recipes always produce copied tensors.

namespace eredu::cpu {

/// Where dtype-kept weights live (see file comment).
enum class WeightStorage {
  copied,         ///< pooled memory the reader copies into (the default)
  mapped,         ///< the file's page-cache pages, mapped read-only and faulted in at load
  mapped_locked,  ///< as mapped, and pinned with mlock
  /// As mapped, but private and copy-on-write (MAP_PRIVATE, as torch.load(mmap=True) maps):
  /// writable, a write copies the page it lands in into the process's memory and never
  /// reaches the file; pages never written stay the page cache's, with mapped's trade-offs.
  mapped_private,
};

}  // namespace eredu::cpu
