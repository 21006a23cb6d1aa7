#pragma once
/// \file
/// eredu::cpu::MaterializationContext: what the CPU backend uses while realizing weights.

#include "eredu/cpu/executor.hpp"
#include "eredu/cpu/storage_pool.hpp"
#include "eredu/cpu/weight_storage.hpp"

namespace eredu::cpu {

/// The arena that populates memory and runs conversions and recipes, and the pool tensor
/// storage comes from. Both must outlive every materialization started with the context.
struct MaterializationContext {
  Executor& executor;    ///< runs populate, conversion and layout work
  StoragePool& storage;  ///< tensor storage (recycled across loads)
  /// Copy dtype-kept tensors that are resident in the page cache on `executor`, from a file
  /// mapping with streaming stores, instead of leaving the copy to the reader (io_uring's
  /// kernel workers, outside the arena). Faster for a load that has the machine to itself
  /// (`eredu load` sets it); off by default because it takes the arena's threads, which a
  /// PrefetchPipeline computing while it loads needs (docs/performance.md has both figures).
  /// Casts of resident tensors always convert from the mapping: they need the arena anyway.
  bool copy_resident_on_executor = false;
  /// Where dtype-kept tensors' bytes live: copied (the default), or mapped read-only from the
  /// checkpoint file (opt-in; weight_storage.hpp says what that trades).
  WeightStorage weights = WeightStorage::copied;
  /// Read a dtype-kept tensor that is not in the page cache, at a file offset that is not
  /// page-aligned, as the file's page-aligned window around it, O_DIRECT, into storage laid
  /// out like the file (its bytes then start at the file's offset within a page, aligned
  /// for its elements, not to 64 bytes). Off: such tensors go through the page cache, one
  /// more fresh page and one more copy per page (docs/performance.md has both).
  bool read_cold_windows = true;
};

}  // namespace eredu::cpu
