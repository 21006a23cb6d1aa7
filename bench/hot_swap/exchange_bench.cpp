// exchange_bench: how long ModelSlot's publish step (PublishedPtr::publish) takes while
// reader threads load the same PublishedPtr in a loop, as requests do; how long retiring
// the replaced pointer takes (readers preempted inside a load delay it, never a reader);
// and how long the loads take.
//
//   exchange_bench [--exchanges N] [--readers R] [--json]
//
// Prints p50/p99/max of the exchange and of a reader's load (sampled), in nanoseconds.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "eredu/core/published_ptr.hpp"

namespace {

using Clock = std::chrono::steady_clock;

/// A stand-in for a published version.
struct Version {
  std::uint64_t generation = 0;
  std::vector<float> weights = std::vector<float>(64, 1.0f);
};

/// p-quantile (nearest rank) of `v`, sorted in place.
double quantile(std::vector<double>& v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<std::size_t>(std::ceil(p * static_cast<double>(v.size()))) - 1)];
}

std::string summary(std::vector<double> v, bool json) {
  const double p50 = quantile(v, 0.5), p99 = quantile(v, 0.99), max = v.empty() ? 0 : v.back();
  return json ? fmt::format("{{\"count\":{},\"p50_ns\":{:.0f},\"p99_ns\":{:.0f},\"max_ns\":{:.0f}}}", v.size(), p50,
                            p99, max)
              : fmt::format("{} samples: p50 {:.0f} ns, p99 {:.0f} ns, max {:.0f} ns", v.size(), p50, p99, max);
}

}  // namespace

int main(int argc, char** argv) {
  int exchanges = 20000, readers = 2;
  bool json = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--json")
      json = true;
    else if (a == "--exchanges" && i + 1 < argc)
      exchanges = std::stoi(argv[++i]);
    else if (a == "--readers" && i + 1 < argc)
      readers = std::stoi(argv[++i]);
    else {
      fmt::print(stderr, "usage: {} [--exchanges 20000] [--readers 2] [--json]\n", argv[0]);
      return 2;
    }
  }
  eredu::PublishedPtr<Version> current;
  current.publish(std::make_shared<const Version>());
  std::atomic<bool> stop{false};
  std::vector<std::vector<double>> loads(static_cast<std::size_t>(readers));
  std::vector<std::uint64_t> reads(static_cast<std::size_t>(readers));
  std::atomic<std::uint64_t> sink{0};  // keeps the readers' use of each version from being optimized out
  std::vector<std::thread> threads;
  for (int r = 0; r < readers; ++r)
    threads.emplace_back([&, r] {
      auto& mine = loads[static_cast<std::size_t>(r)];
      std::uint64_t n = 0, sum = 0;
      while (!stop.load(std::memory_order_relaxed)) {
        const bool sample = n % 64 == 0;  // timing every load would slow the loop it measures
        const Clock::time_point t0 = sample ? Clock::now() : Clock::time_point{};
        std::shared_ptr<const Version> v = current.load();
        if (sample) mine.push_back(std::chrono::duration<double, std::nano>(Clock::now() - t0).count());
        sum += v->generation + static_cast<std::uint64_t>(v->weights[n % 64]);  // use it, as a request would
        ++n;
      }
      reads[static_cast<std::size_t>(r)] = n;
      sink.fetch_add(sum, std::memory_order_relaxed);
    });
  std::vector<double> pauses, retirements;
  pauses.reserve(static_cast<std::size_t>(exchanges));
  retirements.reserve(static_cast<std::size_t>(exchanges));
  for (int i = 1; i <= exchanges; ++i) {
    // Built before the clock starts, as ModelSlot builds the version before it publishes.
    auto next = std::make_shared<const Version>(Version{static_cast<std::uint64_t>(i)});
    const Clock::time_point t0 = Clock::now();
    current.publish(std::move(next));
    const Clock::time_point t1 = Clock::now();
    pauses.push_back(std::chrono::duration<double, std::nano>(t1 - t0).count());
    // Retirement, as ModelSlot polls it (here: yielding between attempts).
    std::optional<std::shared_ptr<const Version>> old;
    while (!(old = current.try_retire())) std::this_thread::yield();
    retirements.push_back(std::chrono::duration<double, std::nano>(Clock::now() - t1).count());
    old.reset();                                                                   // after the clocks, as in ModelSlot
    if (i % 100 == 0) std::this_thread::sleep_for(std::chrono::microseconds(50));  // let readers run between bursts
  }
  stop = true;
  for (auto& t : threads) t.join();
  std::vector<double> all_loads;
  std::uint64_t total_reads = 0;
  for (std::size_t r = 0; r < loads.size(); ++r) {
    all_loads.insert(all_loads.end(), loads[r].begin(), loads[r].end());
    total_reads += reads[r];
  }
  const unsigned cpus = std::thread::hardware_concurrency();
  if (json)
    fmt::print("{{\"readers\":{},\"cpus\":{},\"reads\":{},\"exchange\":{},\"retire\":{},\"load\":{}}}\n", readers, cpus,
               total_reads, summary(pauses, true), summary(retirements, true), summary(all_loads, true));
  else
    fmt::print("{} readers on {} CPUs, {} loads\n  publish   {}\n  retire    {}\n  load      {}\n", readers, cpus,
               total_reads, summary(pauses, false), summary(retirements, false), summary(all_loads, false));
  return 0;
}
