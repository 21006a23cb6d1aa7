#pragma once
/// \file
/// io::RangeChunks: ranges of a selection handed out in chunks of bounded size, in order — the
/// cursor of a chunk stream over some ranges of a selection (io::DeltaSource::stream_ranges),
/// or over all of it (one range).

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "eredu/io/reading/delta_source.hpp"

namespace eredu::io {

/// Chunks of at most `chunk` bytes of `ranges`, in their order.
class RangeChunks {
 public:
  /// `ranges` in chunks of at most `chunk` (> 0) bytes.
  RangeChunks(std::vector<SelectionRange> ranges, std::size_t chunk) : ranges_(std::move(ranges)), chunk_(chunk) {
    for (const SelectionRange& r : ranges_) remaining_ += r.length;
  }
  /// Bytes not yet handed out.
  std::uint64_t remaining() const noexcept { return remaining_; }
  /// The next chunk, or std::nullopt after the last.
  std::optional<SelectionRange> next() {
    while (range_ < ranges_.size() && into_ == ranges_[range_].length) {
      ++range_;
      into_ = 0;
    }
    if (range_ == ranges_.size()) return std::nullopt;
    const SelectionRange out{.offset = ranges_[range_].offset + into_,
                             .length = std::min<std::uint64_t>(chunk_, ranges_[range_].length - into_)};
    into_ += out.length;
    remaining_ -= out.length;
    return out;
  }

 private:
  std::vector<SelectionRange> ranges_;
  std::size_t chunk_;
  std::size_t range_ = 0;   // the range being handed out
  std::uint64_t into_ = 0;  // bytes of it handed out
  std::uint64_t remaining_ = 0;
};

}  // namespace eredu::io
