#pragma once
/// \file
/// The options of async_materialize and async_load: progress counters a long load updates.

#include <atomic>
#include <cstdint>

namespace eredu::engine {

/// Counters a long load updates as owners complete, for progress displays (read them from
/// any thread).
struct MaterializeProgress {
  std::atomic<std::uint64_t> owners_total{0};  ///< owners in the plan (set at start)
  std::atomic<std::uint64_t> owners_done{0};   ///< owners realized so far
  std::atomic<std::uint64_t> bytes_total{0};   ///< bytes the owners produce (set at start)
  std::atomic<std::uint64_t> bytes_done{0};    ///< bytes of owners realized so far
};

/// Per-call options of async_materialize / async_load.
struct MaterializeOptions {
  /// Updated as owners complete, if set; must outlive the operation.
  MaterializeProgress* progress = nullptr;
};

}  // namespace eredu::engine
