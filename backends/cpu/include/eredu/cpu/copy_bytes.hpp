#pragma once
/// \file
/// eredu::cpu::copy_bytes: memcpy split across the calling TBB arena's threads.

#include <span>

namespace eredu::cpu {

/// Copies `in` into `out` (same size, no overlap) in 1 MiB blocks on every thread of the
/// calling arena; small copies run inline. Throws eredu::Error(invalid_argument) on a size
/// mismatch.
void copy_bytes(std::span<const std::byte> in, std::span<std::byte> out);

}  // namespace eredu::cpu
