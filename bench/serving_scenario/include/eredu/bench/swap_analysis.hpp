#pragma once
/// \file
/// What a hot-swap serving scenario's records mean (swap_scenario.hpp): its responses sorted
/// into phases (before, each swap, after each swap, the failed swap), each checked against
/// its version's reference, and the latency and publish-pause figures. Printing them is the
/// caller's (`eredu swap`'s table and --json document, docs/cli.md).

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "eredu/bench/swap_scenario.hpp"

namespace eredu::bench {

/// Latency figures of a set of samples, in seconds.
struct LatencyStats {
  std::size_t count = 0;  ///< samples
  double p50 = 0;         ///< median
  double p99 = 0;         ///< 99th percentile
  double max = 0;         ///< largest
};

/// The figures of `samples` (nearest-rank percentiles); all 0 when there are none.
LatencyStats latency_stats(std::vector<double> samples);

/// One reporting phase: steady (between swaps) or during a swap.
struct SwapPhase {
  std::string name{};                     ///< "before", "swap 1", "after 1", "failed swap", ...
  std::vector<double> latencies{};        ///< seconds, per response
  std::set<std::uint64_t> generations{};  ///< versions that answered in it
  std::uint64_t mismatches = 0;           ///< responses that differ from their version's reference
};

/// What the responses and swaps of one scenario mean.
struct SwapAnalysis {
  std::vector<SwapPhase> phases{};        ///< in order
  LatencyStats steady{};                  ///< responses between swaps
  LatencyStats during{};                  ///< responses overlapping a successful swap
  LatencyStats failed_window{};           ///< responses overlapping the failed swap
  LatencyStats publish_pause{};           ///< the publications of the successful swaps
  std::uint64_t mismatches = 0;           ///< responses not from exactly one version
  std::uint64_t changed = 0;              ///< responses during or after the failed swap not from the serving version
  std::uint64_t failed_window_count = 0;  ///< responses during or after the failed swap
  bool swaps_ok = true;                   ///< every swap but the corrupt one published
  const SwapAttempt* failed = nullptr;    ///< the corrupt swap, when attempted
  bool failed_ok = true;                  ///< it was rejected and changed nothing
  double p99_ratio = 0;                   ///< during.p99 / steady.p99
  bool verified_nothing = false;          ///< some published swap verified no digest
  bool ok = false;                        ///< no mismatch, every swap as expected
};

/// Analyses `result` of a scenario run with `options`.
SwapAnalysis analyze_swap(const SwapScenarioOptions& options, const SwapScenarioResult& result);

}  // namespace eredu::bench
