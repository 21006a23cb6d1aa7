// What a hot-swap serving scenario's records mean (see swap_analysis.hpp).
#include "eredu/bench/swap_analysis.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>

#include <fmt/format.h>

namespace eredu::bench {
namespace {

double percentile(std::vector<double>& v, double q) {
  if (v.empty()) return 0;
  const std::size_t i = static_cast<std::size_t>(std::ceil(q * static_cast<double>(v.size()))) - 1;
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(std::min(i, v.size() - 1)), v.end());
  return v[std::min(i, v.size() - 1)];
}

}  // namespace

LatencyStats latency_stats(std::vector<double> v) {
  LatencyStats s;
  s.count = v.size();
  if (v.empty()) return s;
  s.max = *std::max_element(v.begin(), v.end());
  s.p99 = percentile(v, 0.99);
  s.p50 = percentile(v, 0.50);
  return s;
}

SwapAnalysis analyze_swap(const SwapScenarioOptions& o, const SwapScenarioResult& r) {
  SwapAnalysis a;
  const std::size_t successful = o.swaps;
  a.phases.resize(2 * (successful + (o.corrupt ? 1 : 0)) + 1);
  for (std::size_t i = 0; i < a.phases.size(); ++i) {
    const std::size_t k = (i + 1) / 2;
    if (i == 0)
      a.phases[i].name = "before";
    else if (i % 2 == 1)
      a.phases[i].name = k <= successful ? fmt::format("swap {}", k) : "failed swap";
    else
      a.phases[i].name = k <= successful ? fmt::format("after {}", k) : "after failed";
  }
  std::vector<double> steady, during, failed_window;
  const std::uint64_t final_generation = 1 + successful;
  const auto failed_epoch = static_cast<std::uint32_t>(2 * successful + 1);
  // Which checkpoint each published generation holds: generation 1 is A (the first load),
  // and each later one whatever the swap that published it loaded. Not parity: a rejected
  // swap publishes no generation, so after one, parity would blame every later response.
  std::map<std::uint64_t, std::size_t> reference_of{{1, 0}};
  for (const SwapAttempt& s : r.attempts) {
    if (!s.ok) continue;
    const auto at = std::find(r.paths.begin(), r.paths.end(), s.target);
    const auto index = static_cast<std::size_t>(at - r.paths.begin());
    if (index < r.references.size()) reference_of[s.report.generation] = index;
  }
  for (const SwapResponse& x : r.responses) {
    const auto found = reference_of.find(x.generation);
    const VersionReference* want = found == reference_of.end() ? nullptr : &r.references[found->second];
    const bool ok = want && x.tag == want->tag && x.input < want->outputs.size() && x.output == want->outputs[x.input];
    // A request that overlapped a swap belongs to that swap's phase.
    std::size_t index = x.epoch_start;
    if (x.epoch_end != x.epoch_start && index % 2 == 0) ++index;
    SwapPhase& ph = a.phases[std::min(index, a.phases.size() - 1)];
    ph.latencies.push_back(x.latency_seconds);
    ph.generations.insert(x.generation);
    if (!ok) {
      ++ph.mismatches;
      ++a.mismatches;
    }
    if (o.corrupt && x.epoch_end >= failed_epoch) {  // answered during or after the failed swap
      ++a.failed_window_count;
      if (!ok || x.generation != final_generation) ++a.changed;
    }
    if (index % 2 == 0)
      steady.push_back(x.latency_seconds);
    else if (o.corrupt && index == failed_epoch)
      failed_window.push_back(x.latency_seconds);
    else
      during.push_back(x.latency_seconds);
  }
  a.steady = latency_stats(std::move(steady));
  a.during = latency_stats(std::move(during));
  a.failed_window = latency_stats(std::move(failed_window));
  std::vector<double> pauses;
  for (std::size_t i = 0; i < successful && i < r.attempts.size(); ++i) {
    const SwapAttempt& s = r.attempts[i];
    a.swaps_ok &= s.ok;
    if (s.ok) {
      pauses.push_back(std::chrono::duration<double>(s.report.publish_pause).count());
      a.verified_nothing |= s.checksum_count == 0;
    }
  }
  a.publish_pause = latency_stats(std::move(pauses));
  a.failed = o.corrupt && r.attempts.size() > successful ? &r.attempts[successful] : nullptr;
  a.failed_ok = !a.failed || (!a.failed->ok && a.changed == 0 && r.final_generation == final_generation);
  a.p99_ratio = a.steady.p99 > 0 ? a.during.p99 / a.steady.p99 : 0;
  a.ok = a.mismatches == 0 && a.swaps_ok && a.failed_ok;
  return a;
}

}  // namespace eredu::bench
