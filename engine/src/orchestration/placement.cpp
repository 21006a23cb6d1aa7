#include "eredu/engine/orchestration/placement.hpp"

#include <algorithm>
#include <stdexcept>

namespace eredu::engine {

std::string_view landing_name(Landing landing) noexcept {
  switch (landing) {
    case Landing::mapped:
      return "mapped";
    case Landing::direct_window:
      return "direct window";
    case Landing::read_into:
      return "read into";
    case Landing::copy_from_mapping:
      return "copy from mapping";
    case Landing::chunk_stream:
      return "chunk stream";
    case Landing::staged_lease:
      return "staged lease";
  }
  return "unknown";
}

std::size_t unit_alignment(DType dtype) noexcept {
  const std::size_t unit = dtype_block(dtype).bytes;
  return std::min<std::size_t>(unit & (~unit + 1), 8);
}

PlacementPlan::PlacementPlan(Landing fallback) {
  if (fallback != Landing::read_into && fallback != Landing::chunk_stream && fallback != Landing::staged_lease)
    throw std::invalid_argument("a placement plan falls back on read_into, chunk_stream or staged_lease");
  landings_[size_++] = fallback;
}

void PlacementPlan::add(Landing landing) noexcept {
  if (offers(landing)) return;
  // Ahead of the fallback, after the landings added before.
  landings_[size_] = landings_[size_ - 1];
  landings_[size_ - 1] = landing;
  ++size_;
}

bool PlacementPlan::offers(Landing landing) const noexcept {
  const std::span<const Landing> all = landings();
  return std::find(all.begin(), all.end(), landing) != all.end();
}

PlacementPlan PlacementPlan::without(Landing landing) const {
  PlacementPlan out(landings().back());
  for (const Landing l : landings().first(size_ - 1))
    if (l != landing) out.add(l);
  return out;
}

PlacementPlan plan_placement(const io::SourceCapabilities& source, const BufferTraits& buffer,
                             const PlacementPolicy& policy, const OwnerBytes& owner) noexcept {
  // The source's pages may be held, or read by the backend's kernels, only where a failure to
  // supply one cannot pass for bytes.
  const bool pages = source.maps_pages && source.trusted_errors;
  const bool host_reads = buffer.host && buffer.reads_into;
  const Landing staged = buffer.whole_leases ? Landing::staged_lease : Landing::chunk_stream;
  if (owner.converted) {
    PlacementPlan plan(staged);
    if (buffer.host && pages) plan.add(Landing::copy_from_mapping);
    return plan;
  }
  if (!host_reads) return PlacementPlan(staged);
  PlacementPlan plan(Landing::read_into);
  if (buffer.adopts_mappings && policy.map_weights && pages) plan.add(Landing::mapped);
  if (buffer.lays_out_windows && policy.read_cold_windows && source.direct_windows &&
      owner.bytes >= policy.min_window_bytes)
    plan.add(Landing::direct_window);
  if (policy.copy_resident && pages && owner.bytes >= policy.min_resident_copy_bytes)
    plan.add(Landing::copy_from_mapping);
  return plan;
}

PlacementPlan plan_storage_fill(const PlacementPlan& plan, bool fresh_storage) {
  PlacementPlan fill = plan.without(Landing::mapped).without(Landing::direct_window);
  return fresh_storage ? fill.without(Landing::copy_from_mapping) : fill;
}

bool accepts_mapping(const void* address, const OwnerBytes& owner) noexcept {
  return reinterpret_cast<std::uintptr_t>(address) % owner.unit_alignment == 0;
}

bool accepts_window(const io::DirectWindow& window, const OwnerBytes& owner) noexcept {
  return window.bytes != owner.bytes && window.lead % owner.unit_alignment == 0;
}

}  // namespace eredu::engine
