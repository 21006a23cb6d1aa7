#pragma once
/// \file
/// eredu::cpu::StoragePool: where CPU tensor storage comes from, and goes back to.
///
/// On these machines a load into fresh memory is bound by populating that memory (the VM
/// hands freed pages back to its host, and faulting them in again costs 0.5 GB/s per core),
/// while a load into memory that is already resident runs at memcpy speed. So tensor
/// storage is pooled: a block freed by a dropped tensor is kept, populated, and handed to
/// the next allocation of the same size class — a repeated load, a hot-swap reusing the
/// retired version's storage, or a pipeline reusing the released unit's. Fresh blocks are
/// populated on all cores (StoragePool::populate), in parallel with reads of other tensors.
/// Blocks of 2 MiB and more start 2 MiB-aligned and are advised for transparent huge pages;
/// their size is rounded to 4 KiB pages only, so the resident size follows the tensor's.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

namespace eredu::io {
class MappedTensor;
}

namespace eredu::cpu {

namespace detail {
struct PoolState;
}

/// Which pages back large (2 MiB and up) blocks.
enum class StoragePages {
  /// 4 KiB pages (MADV_NOHUGEPAGE, whatever THP's mode): the faster first touch on the VMs
  /// measured, 1.14 s against 1.58 s for a 2 GiB first load (docs/performance.md).
  small,
  /// Transparent huge pages (MADV_HUGEPAGE): fewer TLB misses in later copies (recycled loads
  /// 0.31-0.41 s against 0.33-0.50), but a first touch that waits for compaction.
  huge,
};

/// Sizing of a StoragePool.
struct StoragePoolOptions {
  /// Freed bytes kept for reuse; beyond this, freed blocks are returned to the system.
  std::uint64_t max_retained_bytes = UINT64_MAX;
  /// Pages of large blocks, which start 2 MiB-aligned either way.
  StoragePages pages = StoragePages::small;
};

/// Counters of a pool, for reports and tests.
struct StoragePoolStats {
  std::uint64_t live_bytes = 0;            ///< bytes of blocks currently handed out
  std::uint64_t retained_bytes = 0;        ///< bytes of freed blocks kept for reuse
  std::uint64_t fresh_allocations = 0;     ///< blocks that came from the system
  std::uint64_t recycled_allocations = 0;  ///< blocks that came from the retained set
  std::uint64_t reserved_allocations = 0;  ///< fresh blocks carved from a reservation (reserve())
  std::uint64_t reserved_bytes = 0;        ///< address space reserved and not yet carved
};

/// One allocation of a pool, which returns itself to the pool when destroyed: its bytes start
/// 64-byte aligned, or `lead` bytes into a page-aligned allocation laid out like the file
/// (StoragePool::allocate_window: a cold tensor read O_DIRECT with its page's neighbours);
/// or a tensor's bytes mapped read-only from its checkpoint file (adopt(): mapped weights,
/// never pooled, aligned as the file places them). Move-only.
class StorageBlock {
 public:
  StorageBlock() noexcept = default;
  StorageBlock(StorageBlock&& other) noexcept;
  StorageBlock& operator=(StorageBlock&& other) noexcept;
  StorageBlock(const StorageBlock&) = delete;
  StorageBlock& operator=(const StorageBlock&) = delete;
  ~StorageBlock();

  /// A read-only block over `mapping`'s bytes, which it keeps mapped until destroyed.
  static StorageBlock adopt(std::shared_ptr<const io::MappedTensor> mapping) noexcept;

  /// The usable bytes (exactly the requested size).
  std::span<std::byte> bytes() const noexcept { return {data_, size_}; }
  /// First byte (64-byte aligned, 2 MiB aligned for large blocks; `lead` bytes after that
  /// for a block of allocate_window).
  std::byte* data() const noexcept { return data_; }
  /// The whole allocation the bytes lie in: from `lead` bytes before data() to the end of
  /// its size class (what a window read fills). Empty for a mapped block.
  std::span<std::byte> allocation() const noexcept {
    return mapping_ ? std::span<std::byte>{} : std::span<std::byte>{data_ - lead_, capacity_};
  }
  /// Requested size in bytes.
  std::size_t size() const noexcept { return size_; }
  /// True when the memory came from the system and has not been populated yet.
  bool fresh() const noexcept { return fresh_; }
  /// Marks the block populated (StoragePool::populate does this).
  void mark_populated() noexcept { fresh_ = false; }
  /// True when the block holds memory.
  explicit operator bool() const noexcept { return data_ != nullptr; }
  /// The file mapping a read-only block holds the bytes of, or nullptr for pool memory.
  const io::MappedTensor* mapping() const noexcept { return mapping_.get(); }
  /// True for a mapped block whose bytes() must not be written (the pages are the file's);
  /// false for pool memory and for a private copy-on-write mapping (WeightStorage::mapped_private).
  bool read_only() const noexcept;

 private:
  friend class StoragePool;
  std::shared_ptr<detail::PoolState> pool_;
  std::byte* data_ = nullptr;
  std::size_t size_ = 0;
  std::size_t capacity_ = 0;  // size class actually mapped
  std::size_t lead_ = 0;      // data_ minus the allocation's start (allocate_window)
  bool fresh_ = false;
  bool mapped_ = false;                              // mmap'd (large) or operator new'd (small)
  std::shared_ptr<const io::MappedTensor> mapping_;  // set by adopt(): no pool, nothing to give back
};

/// Thread-safe source of tensor storage (see file comment). Copies are handles to the
/// same pool; blocks keep the pool's state alive, so a block may outlive every handle.
class StoragePool {
 public:
  /// A new, empty pool.
  explicit StoragePool(StoragePoolOptions options = {});

  /// A block of `bytes` bytes: a retained block of the same size class if there is one
  /// (already populated), else fresh memory (fresh() is true: call populate). Throws
  /// eredu::BackendError(out_of_memory) naming the size when the system refuses.
  StorageBlock allocate(std::size_t bytes);

  /// A page-aligned block of at least `window` bytes whose data() is `lead` bytes into it and
  /// holds `bytes` (lead + bytes <= window): memory laid out like a page-aligned window of a
  /// file, for reading a tensor at an unaligned file offset O_DIRECT into its final place.
  /// Recycled or fresh as allocate(). Throws as allocate(), and invalid_argument when the
  /// sizes do not fit.
  StorageBlock allocate_window(std::size_t window, std::size_t lead, std::size_t bytes);

  /// Faults a fresh block's pages in, on every thread of the calling TBB arena, 2 MiB per
  /// task (MADV_POPULATE_WRITE, or a write per page where that is unsupported). Blocking;
  /// call it from a TBB task. No-op for a block that is not fresh.
  static void populate(StorageBlock& block);

  /// Maps the address space for the next `bytes` of fresh blocks (beyond what the retained
  /// blocks hold) in one call, from which allocate() carves them with no system call: an mmap
  /// or munmap during a load's reads takes the mmap lock that their page faults into fresh
  /// storage wait on. Replaces an earlier reservation's unused rest. Address space only: no
  /// page is touched. Does nothing with StoragePages::huge (blocks must then start 2 MiB-
  /// aligned, which carving would pad) or when the system refuses the mapping.
  void reserve(std::uint64_t bytes) noexcept;

  /// Returns retained blocks to the system until at most `keep_bytes` remain, and the unused
  /// rest of a reservation.
  void trim(std::uint64_t keep_bytes = 0);

  /// Current counters.
  StoragePoolStats stats() const;

 private:
  std::shared_ptr<detail::PoolState> state_;
};

}  // namespace eredu::cpu
