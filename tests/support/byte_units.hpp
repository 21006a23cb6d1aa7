#pragma once
// Byte counts for test sizes, shared so that test sources can be compiled together (unity).

#include <cstddef>

namespace eredu::test {

/// 1024 bytes.
inline constexpr std::size_t KiB = 1024;
/// 1024 KiB.
inline constexpr std::size_t MiB = KiB * KiB;

}  // namespace eredu::test
