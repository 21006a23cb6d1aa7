// The report of `eredu swap A B` (see swap_report.hpp).
#include "swap_report.hpp"

#include <chrono>
#include <set>

#include <fmt/format.h>

#include "cli.hpp"
#include "eredu/core/printable.hpp"

namespace eredu::cli {
namespace {

using bench::LatencyStats;
using bench::SwapAnalysis;
using bench::SwapAttempt;
using bench::SwapPhase;
using bench::SwapScenarioResult;

void latency_json(JsonWriter& json, std::string_view name, const LatencyStats& s) {
  json.key(name).begin_object().count("", s.count).seconds("p50", s.p50).seconds("p99", s.p99);
  json.seconds("max", s.max).end_object();
}

std::string generations_text(const std::set<std::uint64_t>& generations) {
  return fmt::format("{}", fmt::join(generations, ","));
}

}  // namespace

void print_swap_text(const SwapCommandOptions& command, const SwapScenarioResult& r, const SwapAnalysis& a) {
  const bench::SwapScenarioOptions& o = command.scenario;
  // Paths and tensor names come from the user's files: escaped, as in every message.
  fmt::print("serving {} ({} tensors, {}), swapping with {}\n", printable(r.paths[0]), r.tensor_count,
             format_bytes(r.bytes), printable(r.paths[1]));
  fmt::print(
      "  requests  {} clients, y = {}[0:{}, :] · x ({} multiply-adds), {}\n", o.concurrency, printable(r.probe_tensor),
      r.probe_rows, r.probe_rows * r.probe_cols,
      o.serve_threads ? fmt::format("on a {}-thread arena", o.serve_threads) : std::string("inline on the loop"));
  std::string verify = command.verify == "off" ? std::string("off")
                                               : fmt::format("{}: A has {} digests, B {}", command.verify,
                                                             r.checksum_counts[0], r.checksum_counts[1]);
  fmt::print("  swaps     {}-thread arena, {} staging budget, checksums {}{}\n", o.swap_threads, format_bytes(o.budget),
             verify, command.weights == "copy" ? "" : fmt::format(", weights {}", command.weights));
  fmt::print("\n  {:<13} {:>8} {:>9} {:>9} {:>9}  {:<12} {}\n", "phase", "requests", "p50 µs", "p99 µs", "max µs",
             "generations", "mismatches");
  for (const SwapPhase& ph : a.phases) {
    const LatencyStats st = bench::latency_stats(ph.latencies);
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
  if (a.verified_nothing && command.verify != "off")
    fmt::print(
        "  checksums      none for a published version: those swaps verified nothing (--verify require "
        "refuses that)\n");
  fmt::print("{}\n", a.ok ? "ok" : "FAILED");
}

void print_swap_json(const SwapCommandOptions& command, const SwapScenarioResult& r, const SwapAnalysis& a) {
  const bench::SwapScenarioOptions& o = command.scenario;
  JsonWriter json;
  begin_document(json, "swap");
  json.field("a", r.paths[0]).field("b", r.paths[1]).count("tensor", r.tensor_count).bytes("tensor", r.bytes);
  json.key("probe").begin_object().field("tensor", r.probe_tensor).field("rows", r.probe_rows);
  json.field("cols", r.probe_cols).field("dtype", dtype_name(r.probe_dtype)).end_object();
  json.field("serve_threads", o.serve_threads).field("swap_threads", o.swap_threads);
  json.field("concurrency", o.concurrency).count("phase_request", o.requests).bytes("budget", o.budget);
  json.field("weights", command.weights);
  json.field("verify", command.verify)
      .count("a_checksum", r.checksum_counts[0])
      .count("b_checksum", r.checksum_counts[1]);
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
    latency_json(json, "latency", bench::latency_stats(ph.latencies));
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
