#pragma once
/// \file
/// The options of async_materialize and async_load: progress counters a long load updates,
/// and what the load verifies its bytes against.

#include <atomic>
#include <cstdint>

#include "eredu/engine/orchestration/verify_options.hpp"

namespace eredu::engine {

/// Counters a long load updates as owners complete, for progress displays (read them from
/// any thread).
struct MaterializeProgress {
  std::atomic<std::uint64_t> owners_total{0};  ///< owners in the plan (set at start)
  std::atomic<std::uint64_t> owners_done{0};   ///< owners realized so far
  std::atomic<std::uint64_t> bytes_total{0};   ///< bytes the owners produce (set at start)
  std::atomic<std::uint64_t> bytes_done{0};    ///< bytes of owners realized so far
  /// Tensors whose digest was checked and matched (VerifyOptions), and their stored bytes.
  std::atomic<std::uint64_t> tensors_verified{0};
  std::atomic<std::uint64_t> bytes_verified{0};  ///< stored bytes of tensors_verified
  /// Tensors read that could not be verified (no digest recorded, or a partial selection).
  std::atomic<std::uint64_t> tensors_unverified{0};
};

/// Per-call options of async_materialize / async_load.
struct MaterializeOptions {
  /// Updated as owners complete, if set; must outlive the operation.
  MaterializeProgress* progress = nullptr;
  /// Digest verification of the bytes read (off by default; see verify_options.hpp).
  VerifyOptions verify{};
};

}  // namespace eredu::engine
