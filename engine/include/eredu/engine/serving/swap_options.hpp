#pragma once
/// \file
/// What a hot-swap takes and reports, for every model slot alike: per-swap options (origin,
/// checksums, canary, progress) and the report of a successful swap, with what a
/// DistributedModelSlot adds to both (its settings, and the vote in its report).

#include <asio/awaitable.hpp>
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>

#include "eredu/engine/orchestration/materialize_options.hpp"
#include "eredu/io/integrity/checksums.hpp"

namespace eredu::engine {

/// Per-swap options.
template <class Model>
struct SwapOptions {
  /// Label recorded in the version (a path, a revision).
  std::string origin{};
  /// Digests to verify before publishing (empty: none). They are checked inside the load,
  /// each tensor as it lands (engine::VerifyOptions); a mismatch fails the swap.
  io::Checksums checksums{};
  /// Checks the new model before it is published; throwing rejects it (canary_failed).
  std::function<asio::awaitable<void>(const Model&)> canary{};
  /// Load progress counters, if set; must outlive the swap.
  MaterializeProgress* progress = nullptr;
};

/// What a successful swap did and how long each step took.
struct SwapReport {
  std::uint64_t generation = 0;      ///< the version now serving
  std::uint64_t bytes = 0;           ///< bytes the new version's weights occupy
  std::uint64_t verified_bytes = 0;  ///< stored bytes whose digest was checked
  double load_s = 0;                 ///< step 1, which includes verifying the checksums
  /// Step 2, kept for reports: 0, because checksums are verified inside the load (load_s).
  double verify_s = 0;
  double canary_s = 0;  ///< step 3
  /// ModelSlot: the publication itself (readers never wait); InPlaceModelSlot: the
  /// drain of requests in flight plus the copy, during which new reads wait.
  std::chrono::nanoseconds publish_pause{0};
  /// InPlaceModelSlot only: the part of publish_pause spent waiting for requests in flight.
  std::chrono::nanoseconds readers_drained{0};
  /// InPlaceModelSlot::async_patch only: the bytes it wrote into the serving weights (the
  /// blocks that changed).
  std::uint64_t written_bytes = 0;
  /// InPlaceModelSlot::async_patch only: the bytes it hashed to check the new version's
  /// digests: every verified weight's, or with block digests kept from the patch before, only
  /// the 64 KiB blocks a delta changed.
  std::uint64_t hashed_bytes = 0;
};

/// Settings of InPlaceModelSlot::async_patch.
struct PatchOptions {
  /// The most memory a patch holds: the changed 64-byte blocks, 24 bytes for each run of them,
  /// a few dozen for each chunk read, and for a weight checked against block digests
  /// (io::BlockDigests) its new digests (1/4096 of its bytes) and one 64 KiB block; a patch that
  /// cannot hold those hashes the whole weight instead. A version that differs from the serving one by more
  /// fails with exceeds_budget before any weight is written.
  std::uint64_t budget = std::uint64_t{256} << 20;
};

/// Settings of a DistributedModelSlot.
struct DistributedSlotOptions {
  /// Keep the version a swap replaced, for async_rollback (memory: up to three versions exist
  /// during a swap — the kept one, the serving one and the one loading).
  bool keep_previous = true;
  /// How long a rank waits for the others' ballots. Ranks vote as their loads end, so the
  /// spread of the ranks' load times must fit in it; it also bounds how long the others wait
  /// for a rank that died while loading.
  std::chrono::milliseconds vote_timeout{std::chrono::minutes(5)};
};

/// What a successful distributed swap or rollback did.
struct DistributedSwapReport : SwapReport {
  /// The vote and the decision: from casting this rank's ballot to applying the outcome.
  double commit_s = 0;
  /// The first step the new version serves, on every rank.
  std::uint64_t activation_step = 0;
  /// Ranks that voted.
  int ranks = 0;
};

}  // namespace eredu::engine
