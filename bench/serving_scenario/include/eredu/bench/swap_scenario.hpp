#pragma once
/// \file
/// The hot-swap serving scenario (what `eredu swap A B` runs): serve synthetic requests from
/// checkpoint A on one event loop while engine::ModelSlot hot-swaps to B, back to A, ...,
/// then (with `corrupt`) to a corrupted copy of B, and record every response and every swap.
/// What the records mean — phases, latency figures, whether each response came from exactly
/// one version — is swap_analysis.hpp's business; this file only runs the scenario and
/// measures. It knows no command line: its caller parses options, shows progress and decides
/// when to stop through SwapScenarioHooks, and prints the result.

#include <cstdint>
#include <exception>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "eredu/cpu/storage_pool.hpp"
#include "eredu/cpu/weight_storage.hpp"
#include "eredu/engine/serving/model_slot.hpp"
#include "eredu/io/formats/catalog.hpp"
#include "eredu/io/integrity/checksums.hpp"

namespace eredu::bench {

/// The digests a swap to the checkpoint at `path` (with `catalog`) verifies before publishing.
using ChecksumSource = std::function<io::Checksums(const std::string& path, const io::Catalog& catalog)>;

/// What to run (the options of `eredu swap`, with their defaults).
struct SwapScenarioOptions {
  std::string a{};                                          ///< the first version's checkpoint
  std::string b{};                                          ///< the version swapped to and back from
  unsigned swaps = 2;                                       ///< successful swaps: A→B, B→A, ...
  std::uint64_t requests = 2000;                            ///< requests answered in each phase between swaps
  unsigned concurrency = 8;                                 ///< closed-loop clients on the event loop
  unsigned serve_threads = 0;                               ///< 0: compute requests on the loop; N: an N-thread arena
  unsigned swap_threads = 1;                                ///< the swaps' own arena
  std::uint64_t budget = std::uint64_t{32} << 20;           ///< staging budget of each source
  std::uint64_t work = std::uint64_t{256} << 10;            ///< multiply-adds per request
  bool verify = true;                                       ///< false: no swap verifies anything
  ChecksumSource checksums{};                               ///< A's and B's digests; default io::Checksums::discover
  bool corrupt = false;                                     ///< end with a swap to a corrupted copy of B
  cpu::WeightStorage weights = cpu::WeightStorage::copied;  ///< where dtype-kept tensors live
};

/// What a run shows its caller and how the caller ends it early, each part optional (`eredu
/// swap` draws its progress line with the first four and stops on a signal with the last two).
struct SwapScenarioHooks {
  /// A phase began: `name` ("open", "read", "verify", "canary", "publish"), the bytes it
  /// counts (0: it has no counter) and its `context` ("load A", "swap 1/2", "corrupt swap").
  std::function<void(std::string_view name, std::uint64_t total_bytes, std::string_view context)> phase{};
  /// Every 100 ms of a counted phase: the bytes done so far.
  std::function<void(std::uint64_t done)> update{};
  /// Every 100 ms of a phase without a counter, which shows its elapsed time instead.
  std::function<void()> tick{};
  /// A swap ended, or the run did: nothing is shown until the next phase.
  std::function<void()> finish{};
  /// Between blocking steps, and once the event loop has returned: throws to end the run.
  /// `doing` says what it was doing ("opening the checkpoints", "serving while swapping; the
  /// serving version was left as it was").
  std::function<void(const std::string& doing)> check{};
  /// Polled every 10 ms while the event loop runs: true cancels the swap in flight
  /// (terminally) and stops the clients; `check` then says why, or the cancellation is thrown.
  std::function<bool()> stop_requested{};
};

/// What a version must answer, computed from its files with pread before serving.
struct VersionReference {
  std::string path{};                    ///< the checkpoint
  std::uint64_t tag = 0;                 ///< XXH3 of every tensor's bytes in A's catalog order
  std::vector<std::uint64_t> outputs{};  ///< XXH3 of the probe output, per input
};

/// One response, as its client recorded it.
struct SwapResponse {
  std::uint32_t epoch_start = 0;  ///< even: between swaps; odd: while swap (epoch+1)/2 ran
  std::uint32_t epoch_end = 0;    ///< the epoch when it was answered
  std::uint32_t input = 0;        ///< which probe input
  std::uint64_t generation = 0;   ///< the version that answered
  std::uint64_t tag = 0;          ///< that version's weight tag, computed by the canary
  std::uint64_t output = 0;       ///< XXH3 of the output vector
  double latency_seconds = 0;     ///< from arrival on the loop to the answer
};

/// One attempted swap (the first load of A is not one).
struct SwapAttempt {
  std::string target{};            ///< the checkpoint swapped to
  bool ok = false;                 ///< published
  engine::SwapReport report{};     ///< the engine's figures, when ok
  std::size_t checksum_count = 0;  ///< digests verified before publishing (0: nothing verified)
  std::string error_kind{};        ///< errc name, when rejected
  std::string error{};             ///< the message, when rejected
  std::exception_ptr failure{};    ///< the eredu::Error itself, when rejected
  double seconds = 0;              ///< the whole attempt
};

/// Everything the scenario measured.
struct SwapScenarioResult {
  std::vector<std::string> paths{};            ///< A, B, and the corrupt copy if any
  std::vector<std::size_t> checksum_counts{};  ///< digests found per path (verify off: 0)
  std::size_t tensor_count = 0;                ///< tensors of every version
  std::uint64_t bytes = 0;                     ///< bytes a version's weights occupy
  std::string probe_tensor{};                  ///< the tensor requests multiply with
  std::size_t probe_rows = 0, probe_cols = 0;  ///< the part of it a request reads
  DType probe_dtype{};                         ///< its dtype (a quantized one is dequantized)
  std::vector<VersionReference> references{};  ///< A's and B's
  std::vector<SwapResponse> responses{};       ///< every response, in answer order
  std::vector<SwapAttempt> attempts{};         ///< every swap after the first load, in order
  std::uint64_t final_generation = 0;          ///< the slot's generation at the end
  double run_seconds = 0;                      ///< the first load to the last response
  double reference_seconds = 0;                ///< computing the references
  std::uint64_t staging_high_water = 0;        ///< the largest high-water of the sources' pools
  cpu::StoragePoolStats storage{};             ///< the tensor storage pool at the end
};

/// Runs the scenario (see file comment), reporting the swaps' phases to `hooks`. Throws
/// eredu::Error for a checkpoint that cannot be opened or served, what `options.checksums`
/// throws (`eredu swap --verify require`: a tensor without a digest), and what `hooks.check`
/// throws; a rejected swap is a record, not an error.
SwapScenarioResult run_swap_scenario(const SwapScenarioOptions& options, const SwapScenarioHooks& hooks = {});

}  // namespace eredu::bench
