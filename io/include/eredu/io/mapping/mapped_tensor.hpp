#pragma once
/// \file
/// eredu::io::MappedTensor: one tensor's stored bytes mapped read-only from its checkpoint
/// file, to be held as weight storage (the CPU backend's opt-in mapped weights).
///
/// Unlike a MappedView, which a conversion reads once inside guarded_read and drops, a
/// MappedTensor lives as long as the weight: its pages are the page cache's pages, shared
/// with every process mapping the file, and a load costs page-table entries instead of a
/// copy into fresh memory. What that trades away, each of which this type lets a caller see:
///  * the bytes are the file's *now*: a file rewritten in place changes the weights under a
///    serving model (check_file() refuses such a file: file_changed); a file replaced by
///    renaming a new one over its path leaves these bytes, the old inode's, intact
///    (check_file() reports FileState::replaced);
///  * reading a page the kernel cannot supply (the file truncated under the mapping, a
///    failed page-in) raises SIGBUS in whoever reads it: eredu reads mapped weights only
///    inside guarded_read, an application's forward pass does not;
///  * clean page-cache pages may be evicted under memory pressure and faulted back in from
///    the file later (a latency spike, not wrong bytes) unless lock() pinned them.

#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "eredu/core/error.hpp"
#include "eredu/io/integrity/file_stamp.hpp"
#include "eredu/io/mapping/guarded_read.hpp"
#include "eredu/io/mapping/mapped_view.hpp"
#include "eredu/io/reading/unique_fd.hpp"

namespace eredu::io {

struct OpenFile;

/// A checkpoint file as it was when its tensors were first mapped: its own descriptor (so
/// mapped weights outlive the CheckpointSource) and the identity the weights came from.
/// Shared by every MappedTensor of the file.
class MappedFile {
 public:
  /// Duplicates `file`'s descriptor and records its identity (device, inode) and the size and
  /// stamp (FileStamp) it had when the source opened it. Throws Error(io_error).
  explicit MappedFile(const OpenFile& file);

  /// The path the file was opened by, for messages.
  const std::string& path() const noexcept { return path_; }
  /// The owned descriptor (mappings are made from it).
  int fd() const noexcept { return fd_.get(); }
  /// The file's size when the source opened it.
  std::uint64_t size() const noexcept { return size_; }

  /// What became of the file since it was opened.
  enum class State {
    unchanged,  ///< the path still names this inode, of the same size and stamp (not rewritten)
    replaced,   ///< the path names another file now (or none): these bytes are the old ones
  };
  /// Throws Error(file_changed) naming `tensor` and `offset` when the inode itself was
  /// rewritten or truncated since it was opened (its mapped bytes may have changed);
  /// otherwise says whether the path still names it. Two syscalls (fstat, stat).
  State check(const std::string& tensor, std::uint64_t offset) const;
  /// True the first time it is called for this file: one warning per replaced file.
  bool first_replacement_notice() const noexcept { return !replacement_noticed_.exchange(true); }

 private:
  std::string path_;
  UniqueFd fd_;
  std::uint64_t device_ = 0;
  std::uint64_t inode_ = 0;
  std::uint64_t size_ = 0;
  FileStamp stamp_{};
  mutable std::atomic<bool> replacement_noticed_{false};
};

/// A tensor's bytes mapped read-only (MAP_SHARED) as weight storage (see file comment).
/// Move-only; unmapping also unlocks.
class MappedTensor {
 public:
  /// Maps [offset, offset + length) of `file` for tensor `tensor`. Throws Error(io_error) when
  /// mmap fails.
  MappedTensor(std::shared_ptr<const MappedFile> file, std::string tensor, std::uint64_t offset, std::uint64_t length);

  /// The tensor's bytes (unguarded reads may raise SIGBUS: see file comment).
  std::span<const std::byte> bytes() const noexcept { return view_.bytes(); }
  /// The tensor's bytes, writable once make_private() made them a private copy-on-write
  /// mapping (empty before: the shared mapping is read-only).
  std::span<std::byte> writable_bytes() const noexcept {
    const std::span<const std::byte> b = view_.bytes();
    return view_.copy_on_write() ? std::span<std::byte>(const_cast<std::byte*>(b.data()), b.size())
                                 : std::span<std::byte>{};
  }
  /// Makes the mapping private and copy-on-write (MappedView::make_private): writes land in
  /// the process's own copies of the pages written, never in the file; pages never written
  /// stay the page cache's. Call before handing the bytes out. Throws Error(io_error).
  void make_private() { view_.make_private(); }
  /// True after make_private().
  bool copy_on_write() const noexcept { return view_.copy_on_write(); }
  /// The whole page-aligned mapping: the region to pass to guarded_read.
  std::span<const std::byte> region() const noexcept { return view_.region(); }
  /// The file the bytes are mapped from.
  const MappedFile& file() const noexcept { return *file_; }
  /// The tensor's name, for messages.
  const std::string& tensor() const noexcept { return tensor_; }
  /// File offset of the first byte.
  std::uint64_t offset() const noexcept { return offset_; }

  /// Maps the page-cache pages of `part` (a subrange of bytes()) into the page table, reading
  /// from the file what is not cached, so that later reads do not fault. Throws
  /// Error(file_changed) when the file shrank, Error(io_error) when a page cannot be read in,
  /// naming file, tensor and offset.
  void populate(std::span<const std::byte> part) const;
  /// Pins the pages in memory (mlock): they are faulted in now and never evicted. Refused
  /// with Error(out_of_memory) naming the bytes, RLIMIT_MEMLOCK and what is locked already
  /// when the limit does not allow it (checked first, as mlock's ENOMEM alone does not say
  /// why). Idempotent.
  void lock();
  /// True once lock() succeeded.
  bool locked() const noexcept { return locked_; }
  /// Bytes of the tensor's pages that are in memory now (mincore).
  std::uint64_t resident_bytes() const noexcept;
  /// MappedFile::check for this tensor.
  MappedFile::State check_file() const { return file_->check(tensor_, offset_); }
  /// The typed error for a fault inside region(): file_changed when the file shrank,
  /// io_error otherwise, naming file, tensor and offset.
  Error fault_error(MappingFault fault) const { return view_.fault_error(fault); }

 private:
  std::shared_ptr<const MappedFile> file_;
  std::string tensor_;
  std::uint64_t offset_ = 0;
  MappedView view_;
  bool locked_ = false;
};

/// The locked-memory facts a refused or reported lock names.
struct MemoryLockLimit {
  std::uint64_t limit = 0;   ///< RLIMIT_MEMLOCK's soft limit in bytes (UINT64_MAX: unlimited)
  std::uint64_t locked = 0;  ///< bytes this process has locked now (VmLck)
  bool exempt = false;       ///< CAP_IPC_LOCK: the limit does not apply
};
/// This process's locked-memory limit, what it has locked, and whether the limit applies.
MemoryLockLimit memory_lock_limit() noexcept;

}  // namespace eredu::io
