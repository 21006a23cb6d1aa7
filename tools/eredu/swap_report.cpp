#include "swap_report.hpp"

#include <algorithm>
#include <cmath>
#include <map>

#include <fmt/format.h>

#include "cli.hpp"
#include "eredu/core/printable.hpp"

namespace eredu::cli {
namespace {

double percentile(std::vector<double>& v, double q) {
  if (v.empty()) return 0;
  const std::size_t i = static_cast<std::size_t>(std::ceil(q * static_cast<double>(v.size()))) - 1;
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(std::min(i, v.size() - 1)), v.end());
  return v[std::min(i, v.size() - 1)];
}

void latency_json(JsonWriter& json, std::string_view name, const LatencyStats& s) {
  json.key(name).begin_object().count("", s.count).seconds("p50", s.p50).seconds("p99", s.p99);
  json.seconds("max", s.max).end_object();
}

std::string generations_text(const std::set<std::uint64_t>& generations) {
  return fmt::format("{}", fmt::join(generations, ","));
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

void print_swap_text(const SwapScenarioOptions& o, const SwapScenarioResult& r, const SwapAnalysis& a) {
  // Paths and tensor names come from the user's files: escaped, as in every message.
  fmt::print("serving {} ({} tensors, {}), swapping with {}\n", printable(r.paths[0]), r.tensor_count,
             format_bytes(r.bytes), printable(r.paths[1]));
  fmt::print(
      "  requests  {} clients, y = {}[0:{}, :] · x ({} multiply-adds), {}\n", o.concurrency, printable(r.probe_tensor),
      r.probe_rows, r.probe_rows * r.probe_cols,
      o.serve_threads ? fmt::format("on a {}-thread arena", o.serve_threads) : std::string("inline on the loop"));
  std::string verify = o.verify == "off" ? std::string("off")
                                         : fmt::format("{}: A has {} digests, B {}", o.verify, r.checksum_counts[0],
                                                       r.checksum_counts[1]);
  fmt::print("  swaps     {}-thread arena, {} staging budget, checksums {}{}\n", o.swap_threads, format_bytes(o.budget),
             verify, o.weights == "copy" ? "" : fmt::format(", weights {}", o.weights));
  fmt::print("\n  {:<13} {:>8} {:>9} {:>9} {:>9}  {:<12} {}\n", "phase", "requests", "p50 µs", "p99 µs", "max µs",
             "generations", "mismatches");
  for (const SwapPhase& ph : a.phases) {
    const LatencyStats st = latency_stats(ph.latencies);
    fmt::print("  {:<13} {:>8} {:>9.1f} {:>9.1f} {:>9.1f}  {:<12} {}\n", ph.name, st.count, st.p50 * 1e6, st.p99 * 1e6,
               st.max * 1e6, generations_text(ph.generations), ph.mismatches);
  }
  fmt::print("\n");
  for (std::size_t i = 0; i < r.attempts.size(); ++i) {
    const SwapAttempt& s = r.attempts[i];
    const std::string verified = s.checksum_count == 0
                                     ? std::string("verify skipped (no checksums: nothing was verified)")
                                     : fmt::format("verify {:.3f} s ({} digests)", s.report.verify_s, s.checksum_count);
    if (s.ok)
      fmt::print("  swap {:<3} → generation {}: load {:.3f} s, {}, canary {:.3f} s, publish pause {} ns\n", i + 1,
                 s.report.generation, s.report.load_s, verified, s.report.canary_s, s.report.publish_pause.count());
    else
      fmt::print("  swap {:<3} to {} rejected after {:.3f} s [{}]: {}\n", i + 1, printable(s.target), s.seconds,
                 s.error_kind, printable(s.error));
  }
  fmt::print("\n  publish pause  p50 {:.0f} ns, p99 {:.0f} ns, max {:.0f} ns over {} swaps\n",
             a.publish_pause.p50 * 1e9, a.publish_pause.p99 * 1e9, a.publish_pause.max * 1e9, a.publish_pause.count);
  fmt::print("  request p99    steady {:.1f} µs, during swaps {:.1f} µs: ratio {:.2f}\n", a.steady.p99 * 1e6,
             a.during.p99 * 1e6, a.p99_ratio);
  if (o.corrupt)
    fmt::print("  failed swap    {} responses during and after it, {} changed; generation {} still serving\n",
               a.failed_window_count, a.changed, r.final_generation);
  fmt::print("  responses      {}, {} mismatched their version's reference\n", r.responses.size(), a.mismatches);
  fmt::print("  memory         staging high-water {}, tensor storage live {} retained {}, peak RSS {}\n",
             format_bytes(r.staging_high_water), format_bytes(r.storage.live_bytes),
             format_bytes(r.storage.retained_bytes), format_bytes(peak_rss_bytes()));
  if (a.verified_nothing && o.verify != "off")
    fmt::print(
        "  checksums      none for a published version: those swaps verified nothing (--verify require "
        "refuses that)\n");
  fmt::print("{}\n", a.ok ? "ok" : "FAILED");
}

void print_swap_json(const SwapScenarioOptions& o, const SwapScenarioResult& r, const SwapAnalysis& a) {
  JsonWriter json;
  begin_document(json, "swap");
  json.field("a", r.paths[0]).field("b", r.paths[1]).count("tensor", r.tensor_count).bytes("tensor", r.bytes);
  json.key("probe").begin_object().field("tensor", r.probe_tensor).field("rows", r.probe_rows);
  json.field("cols", r.probe_cols).field("dtype", dtype_name(r.probe_dtype)).end_object();
  json.field("serve_threads", o.serve_threads).field("swap_threads", o.swap_threads);
  json.field("concurrency", o.concurrency).count("phase_request", o.requests).bytes("budget", o.budget);
  json.field("weights", o.weights);
  json.field("verify", o.verify).count("a_checksum", r.checksum_counts[0]).count("b_checksum", r.checksum_counts[1]);
  json.seconds("", r.run_seconds).seconds("reference", r.reference_seconds);
  json.count("response", r.responses.size()).count("mismatch", a.mismatches);
  json.key("swaps").begin_array();
  for (const SwapAttempt& s : r.attempts) {
    json.begin_object().field("target", s.target).field("ok", s.ok).field("generation", s.report.generation);
    json.seconds("", s.seconds).seconds("load", s.report.load_s).seconds("verify", s.report.verify_s);
    json.seconds("canary", s.report.canary_s).field("verified", s.checksum_count > 0);
    json.count("checksum", s.checksum_count).bytes("verified", s.report.verified_bytes);
    json.seconds("publish_pause", std::chrono::duration<double>(s.report.publish_pause).count());
    if (s.ok) {
      json.null_field("error");
    } else {
      json.key("error").begin_object().field("kind", s.error_kind).field("message", s.error).end_object();
    }
    json.end_object();
  }
  json.end_array();
  latency_json(json, "publish_pause", a.publish_pause);
  latency_json(json, "steady", a.steady);
  latency_json(json, "during_swap", a.during);
  json.field("p99_ratio", a.p99_ratio);
  json.key("failed_swap").begin_object().field("attempted", o.corrupt).field("rejected", a.failed && !a.failed->ok);
  if (a.failed && !a.failed->ok)
    json.field("error_kind", a.failed->error_kind);
  else
    json.null_field("error_kind");
  json.count("response", a.failed_window_count).count("changed", a.changed);
  latency_json(json, "latency", a.failed_window);
  json.end_object();
  json.key("phases").begin_array();
  for (const SwapPhase& ph : a.phases) {
    json.begin_object().field("name", ph.name);
    latency_json(json, "latency", latency_stats(ph.latencies));
    json.key("generations").begin_array();
    for (std::uint64_t g : ph.generations) json.value(g);
    json.end_array().count("mismatch", ph.mismatches).end_object();
  }
  json.end_array();
  json.bytes("staging_high_water", r.staging_high_water);
  json.key("storage").begin_object().bytes("live", r.storage.live_bytes).bytes("retained", r.storage.retained_bytes);
  json.count("fresh_allocation", r.storage.fresh_allocations);
  json.count("recycled_allocation", r.storage.recycled_allocations).end_object();
  json.bytes("peak_rss", peak_rss_bytes()).field("verified_nothing", a.verified_nothing).field("ok", a.ok);
  print_document(json);
}

}  // namespace eredu::cli
