// The hot-swap serving scenario as a library (bench/serving_scenario): what its hooks see, how
// a stop request ends a run, and the analysis `eredu swap` prints. The command's own output,
// options and signals are tests/cli's.

#include <catch2/catch.hpp>
#include <cstdint>
#include <set>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "eredu/bench/swap_analysis.hpp"
#include "eredu/bench/swap_scenario.hpp"
#include "eredu/synth/synthetic_checkpoint.hpp"
#include "support/temp_dir.hpp"

using namespace eredu;

namespace {

/// Two small checkpoints with the same tensors and different values (seeds 1 and 2).
struct TwoVersions {
  test::TempDir dir;
  std::string a = (dir / "a.safetensors").string();
  std::string b = (dir / "b.safetensors").string();
  TwoVersions() {
    synth::write_synthetic(a, {.target_bytes = 1 << 20, .seed = 1, .layers = 1});
    synth::write_synthetic(b, {.target_bytes = 1 << 20, .seed = 2, .layers = 1});
  }
};

bench::SwapScenarioOptions small_run(const TwoVersions& v) {
  bench::SwapScenarioOptions o;
  o.a = v.a;
  o.b = v.b;
  o.requests = 40;
  o.concurrency = 2;
  o.work = 4096;
  return o;
}

}  // namespace

TEST_CASE("the serving scenario answers from one version at a time and shows each swap's phases to its hooks",
          "[serving_scenario]") {
  TwoVersions v;
  bench::SwapScenarioOptions o = small_run(v);
  o.corrupt = true;
  std::vector<std::pair<std::string, std::string>> phases;  // (context, name)
  int finished = 0;
  std::vector<std::string> checked;
  bench::SwapScenarioHooks hooks{
      .phase = [&](std::string_view name, std::uint64_t,
                   std::string_view context) { phases.emplace_back(std::string(context), std::string(name)); },
      .finish = [&] { ++finished; },
      .check = [&](const std::string& doing) { checked.push_back(doing); },
      .stop_requested = [] { return false; }};
  const bench::SwapScenarioResult r = bench::run_swap_scenario(o, hooks);
  const bench::SwapAnalysis a = bench::analyze_swap(o, r);

  CHECK(a.ok);
  CHECK(a.mismatches == 0);
  REQUIRE(r.attempts.size() == 3);  // A→B, B→A, and the corrupt copy
  CHECK(r.attempts[0].ok);
  CHECK(r.attempts[1].ok);
  CHECK_FALSE(r.attempts[2].ok);  // only verification can tell: the copy carries B's true digest
  CHECK(r.attempts[2].checksum_count == 1);
  CHECK(r.final_generation == 3);
  CHECK(a.failed == &r.attempts[2]);
  CHECK(a.changed == 0);
  REQUIRE(a.phases.size() == 7);
  CHECK(a.phases[0].name == "before");
  CHECK(a.phases[5].name == "failed swap");
  CHECK(a.phases[0].generations == std::set<std::uint64_t>{1});
  CHECK(a.phases[2].generations == std::set<std::uint64_t>{2});
  CHECK(a.phases[6].generations == std::set<std::uint64_t>{3});

  // The first load and each swap: read, then the canary and the publication, in that order.
  REQUIRE_FALSE(phases.empty());
  CHECK(phases.front() == std::pair<std::string, std::string>{"", "open"});
  for (const std::string context : {"load A", "swap 1/2", "swap 2/2", "corrupt swap"}) {
    std::vector<std::string> names;
    for (const auto& [c, n] : phases)
      if (c == context) names.push_back(n);
    INFO(context);
    REQUIRE_FALSE(names.empty());
    CHECK(names.front() == "read");
    if (context != std::string("corrupt swap")) CHECK(names.back() == "publish");
  }
  CHECK(finished == 5);  // each of the four swaps, then the run
  CHECK(checked.back() == "serving while swapping; the serving version was left as it was");
  CHECK(checked.front() == "opening the checkpoints");
}

TEST_CASE("a stop request cancels the run and stops the clients, and the check says what was stopped",
          "[serving_scenario]") {
  TwoVersions v;
  bench::SwapScenarioOptions o = small_run(v);
  bool stop = false;
  std::pair<std::string, std::string> stop_at{"swap 1/2", "read"};  // the phase whose start asks to stop
  bench::SwapScenarioHooks hooks{.phase =
                                     [&](std::string_view name, std::uint64_t, std::string_view context) {
                                       if (context == stop_at.first && name == stop_at.second) stop = true;
                                     },
                                 .stop_requested = [&] { return stop; }};
  const auto throw_when_stopped = [&](const std::string& doing) {
    if (stop) throw std::runtime_error(doing);
  };

  SECTION("while serving, without a check: the cancellation itself is thrown") {
    o.requests = std::uint64_t{1} << 40;  // never answered: only the stop ends the first phase
    stop_at = {"load A", "publish"};      // A is published: the clients start, and the stop follows
    CHECK_THROWS(bench::run_swap_scenario(o, hooks));
    CHECK(stop);
  }
  SECTION("during a swap, with a check: its exception, saying what the run was doing") {
    hooks.check = throw_when_stopped;
    CHECK_THROWS_WITH(bench::run_swap_scenario(o, hooks),
                      "serving while swapping; the serving version was left as it was");
  }
  SECTION("before serving: the run ends at the check before the loop runs") {
    stop = true;
    hooks.check = throw_when_stopped;
    CHECK_THROWS_WITH(bench::run_swap_scenario(o, hooks), "opening the checkpoints");
  }
}

TEST_CASE("latency figures are nearest-rank percentiles", "[serving_scenario]") {
  std::vector<double> samples;
  for (int i = 100; i >= 1; --i) samples.push_back(i);
  const bench::LatencyStats s = bench::latency_stats(samples);
  CHECK(s.count == 100);
  CHECK(s.p50 == 50);
  CHECK(s.p99 == 99);
  CHECK(s.max == 100);
  const bench::LatencyStats none = bench::latency_stats({});
  CHECK(none.count == 0);
  CHECK(none.p99 == 0);
}
