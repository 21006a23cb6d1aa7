#pragma once
/// \file
/// The io::DeltaSource concept: a ByteSource whose version was sent as a delta against a base
/// the reader declared it holds (mpi::PublishedSource after use_base). Such a source knows
/// which parts of a selection can differ from that base, and streams only those. A reader that
/// holds the base where the new bytes go (InPlaceModelSlot::async_patch) then reads and
/// compares only them, and takes every other byte from its own memory.
///
/// The ranges are the sender's word. A reader that trusts them must still check the whole
/// result against the full version's digest: a wrong base, or a range the sender left out,
/// is then checksum_mismatch, never a served model.

#include <concepts>
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "eredu/io/reading/byte_source.hpp"
#include "eredu/io/reading/tensor_read_request.hpp"

namespace eredu::io {

/// Bytes [offset, offset + length) of a selection's contiguous output.
struct SelectionRange {
  std::uint64_t offset = 0;  ///< the first byte, from the selection's start
  std::uint64_t length = 0;  ///< how many
  friend bool operator==(const SelectionRange&, const SelectionRange&) = default;
};

/// A byte source that can stream only what changed against a declared base (see file comment).
template <class S>
concept DeltaSource = ByteSource<S> &&
    requires(S& source, const S& const_source, const TensorReadRequest& request, std::vector<SelectionRange> ranges) {
  // The ranges of the selection, ascending and disjoint, outside which this version's bytes
  // are the declared base's; std::nullopt when any byte may differ (no base declared, or a
  // tensor not sent against it).
  { const_source.changed_ranges(request) } -> std::same_as<std::optional<std::vector<SelectionRange>>>;
  // This version's bytes of those ranges (ascending and disjoint, inside the selection) as
  // bounded chunk leases, in order; each lease's offset() is its place in the selection.
  { source.stream_ranges(request, std::move(ranges)) } -> std::same_as<decltype(source.stream(request))>;
};

}  // namespace eredu::io
