#pragma once
/// \file
/// eredu::engine placement: how one owner's bytes (a weight, or a source a recipe reads) land
/// in a backend's memory, decided once, above the backends, from what the byte source
/// declares (io::SourceCapabilities) and what the backend's buffer type declares
/// (BufferTraits). A backend executes the decided Placement; it owns memory, kernels and
/// ordering, not the choice of I/O.
///
/// The decision has two halves. plan_placement() is the table: from the declarations alone it
/// lists the landings worth trying, best first, the last one always possible. place() then
/// asks the source, in that order, whether it can serve each now (a page may be cold, a file
/// may place a tensor where its elements are misaligned) and settles on the first that it
/// can. Capabilities say what a source can ever do; place() asks only what they allow.

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>

#include "eredu/core/dtype.hpp"
#include "eredu/io/reading/byte_source.hpp"

namespace eredu::engine {

/// How an owner's bytes reach the backend's memory.
enum class Landing : std::uint8_t {
  mapped,             ///< the source's pages adopted as the weight's storage: no copy, read-only
  direct_window,      ///< the page-aligned window around the bytes read straight into storage laid out like it
  read_into,          ///< the source writes the bytes into the weight's storage: one copy, no lease
  copy_from_mapping,  ///< the backend's kernels copy or convert from a mapping of resident pages: no lease
  chunk_stream,       ///< bounded chunk leases, each copied or converted by the backend as it arrives
  staged_lease,       ///< one bounded lease holding all the owner's bytes, copied by the backend
};

/// The landing's name ("mapped", "direct window", ...), for logs and test names.
std::string_view landing_name(Landing landing) noexcept;

/// What a backend's buffer type declares about the memory its weights land in.
struct BufferTraits {
  bool host = true;               ///< memory the CPU addresses (false: device memory)
  std::size_t alignment = 1;      ///< alignment of a fresh allocation
  bool adopts_mappings = false;   ///< can hold a read-only mapping of the source's pages as a weight's storage
  bool reads_into = false;        ///< a source may write into it directly (host memory at a stable address)
  bool lays_out_windows = false;  ///< can allocate storage shaped like a direct window (bytes before the weight)
  /// Takes an owner's bytes whole, in one lease (a backend that copies or checks them in one
  /// piece), not as a stream of chunks; the owner must then fit the source's staging budget.
  bool whole_leases = false;
};

/// How the backend's context asks weights to be placed (its switches; defaults: copied
/// weights, cold windows on, resident copies left to the source).
struct PlacementPolicy {
  /// Hold dtype-kept weights as mappings of the source's pages where it can map them.
  bool map_weights = false;
  /// Read dtype-kept weights the source would read directly, at unaligned offsets, as their
  /// direct window.
  bool read_cold_windows = true;
  /// Copy dtype-kept weights that are resident into recycled storage from a mapping, on the
  /// backend's own workers, instead of leaving the copy to the source.
  bool copy_resident = false;
  /// Weights smaller than this are never read as a window: a block of whole pages for a few
  /// KiB costs more memory than the copy it saves.
  std::uint64_t min_window_bytes = std::uint64_t{64} << 10;
  /// Dtype-kept weights smaller than this are never copied from a mapping: mapping, populating
  /// and unmapping a few pages costs three system calls that each take the process's mmap
  /// lock, on which the page faults of reads into fresh storage wait (docs/performance.md,
  /// first loads), for a copy the source makes as cheaply.
  std::uint64_t min_resident_copy_bytes = std::uint64_t{64} << 10;
};

/// What the planner knows of one owner's bytes.
struct OwnerBytes {
  std::uint64_t bytes = 0;         ///< selected bytes
  std::size_t unit_alignment = 1;  ///< alignment its storage units need to be used where they lie
  bool converted = false;          ///< its dtype changes on the way (a cast): never landed byte for byte
};

/// The alignment a dtype's storage units need to be used where they lie: the largest power
/// of two dividing a unit's bytes, at most 8 (a quantized block holds f16 scales: 2).
std::size_t unit_alignment(DType dtype) noexcept;

/// The landings to try for one owner, best first. The last, the fallback, is read_into,
/// chunk_stream or staged_lease: landings that need nothing of the source but reads.
class PlacementPlan {
 public:
  /// A plan of the fallback alone; throws std::invalid_argument for another landing.
  explicit PlacementPlan(Landing fallback);
  /// Adds `landing` after those added before and ahead of the fallback (once only).
  void add(Landing landing) noexcept;
  /// The landings, best first.
  std::span<const Landing> landings() const noexcept { return {landings_.data(), size_}; }
  /// Whether `landing` is among them.
  bool offers(Landing landing) const noexcept;
  /// The plan without `landing` (the fallback is always kept).
  PlacementPlan without(Landing landing) const;

 private:
  std::array<Landing, 6> landings_{};
  std::size_t size_ = 0;
};

/// The decision table (see file comment). For bytes kept as stored:
///  - mapped: the buffer adopts mappings, the policy asks for mapped weights, and the source
///    maps pages and its errors are trusted (a mapping bypasses the reads that check them);
///  - direct_window: the buffer is read into and lays out windows, the policy reads cold
///    windows, the source serves direct windows, and the owner is at least min_window_bytes;
///  - then, into host storage the source reads into: copy_from_mapping (only with
///    copy_resident, a source that maps pages and an owner of at least
///    min_resident_copy_bytes; see plan_storage_fill), then read_into;
///  - into any other memory (a device's): staged_lease for a buffer that takes whole leases,
///    else chunk_stream.
/// For converted bytes: copy_from_mapping into host memory from a source that maps pages,
/// then staged_lease for a buffer that takes whole leases, else chunk_stream.
PlacementPlan plan_placement(const io::SourceCapabilities& source, const BufferTraits& buffer,
                             const PlacementPolicy& policy, const OwnerBytes& owner) noexcept;

/// The part of a dtype-kept owner's plan that fills storage just allocated: `plan` without
/// mapped and direct_window, and without copy_from_mapping when the storage is fresh (the
/// source's read faults fresh pages in as it writes them, which measured faster than
/// faulting them on the backend's workers: docs/performance.md, 2026-12-02).
PlacementPlan plan_storage_fill(const PlacementPlan& plan, bool fresh_storage);

/// Whether a mapping whose first byte is at `address` can hold the owner: its storage units
/// must be aligned where the file places them, for kernels read them as typed values.
bool accepts_mapping(const void* address, const OwnerBytes& owner) noexcept;

/// Whether `window` is worth reading for the owner: not when it is the owner's bytes exactly
/// (aligned already: the plain read goes direct itself), nor when the file misaligns the
/// owner's storage units within it.
bool accepts_window(const io::DirectWindow& window, const OwnerBytes& owner) noexcept;

/// The landing settled for one owner, with what the source handed over for it.
struct Placement {
  Landing landing = Landing::read_into;       ///< how the bytes land
  std::optional<io::MappedTensor> mapping{};  ///< Landing::mapped: the pages to adopt
  io::DirectWindow window{};                  ///< Landing::direct_window: the window to allocate and read
  std::optional<io::MappedView> resident{};   ///< Landing::copy_from_mapping: the resident pages
};

/// The first landing of `plan` that `source` can serve for `request` now (see file comment).
/// Asks the source only for the landings the plan lists; throws what the source throws for
/// an invalid request.
template <io::ByteSource S>
Placement place(const S& source, const io::TensorReadRequest& request, const PlacementPlan& plan,
                const OwnerBytes& owner) {
  for (const Landing landing : plan.landings()) {
    switch (landing) {
      case Landing::mapped:
        if (std::optional<io::MappedTensor> m = source.map_tensor(request);
            m && accepts_mapping(m->bytes().data(), owner))
          return Placement{.landing = landing, .mapping = std::move(m)};
        break;
      case Landing::direct_window:
        if (std::optional<io::DirectWindow> w = source.direct_window(request); w && accepts_window(*w, owner))
          return Placement{.landing = landing, .window = *w};
        break;
      case Landing::copy_from_mapping:
        if (std::optional<io::MappedView> v = source.map_resident(request))
          return Placement{.landing = landing, .resident = std::move(v)};
        break;
      case Landing::read_into:
      case Landing::chunk_stream:
      case Landing::staged_lease:
        return Placement{.landing = landing};
    }
  }
  return Placement{.landing = plan.landings().back()};  // unreachable: the fallback returns
}

}  // namespace eredu::engine
