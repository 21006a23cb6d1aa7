#pragma once
// The report of `eredu swap A B`: the scenario's figures (eredu/bench/swap_analysis.hpp)
// printed as a table or as one --json document (docs/cli.md).

#include <string>

#include "eredu/bench/swap_analysis.hpp"
#include "eredu/bench/swap_scenario.hpp"

namespace eredu::cli {

/// The options of `eredu swap` as parsed: the scenario's, and the flags' spellings, which the
/// report repeats.
struct SwapCommandOptions {
  bench::SwapScenarioOptions scenario{};  ///< what to run (verify, checksums, weights: from the two below)
  std::string verify = "on";              ///< --verify: on | off | require
  std::string weights = "copy";           ///< --weights: copy | map | map-lock
};

/// Prints the table report on stdout.
void print_swap_text(const SwapCommandOptions& options, const bench::SwapScenarioResult& result,
                     const bench::SwapAnalysis& a);

/// Prints the --json document on stdout.
void print_swap_json(const SwapCommandOptions& options, const bench::SwapScenarioResult& result,
                     const bench::SwapAnalysis& a);

}  // namespace eredu::cli
