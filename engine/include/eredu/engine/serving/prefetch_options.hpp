#pragma once
/// \file
/// What a PrefetchPipeline takes and reports: its units, how far ahead it loads and within
/// what memory, keep-on-host, and the counters and per-unit timings of a run.

#include <cstddef>
#include <cstdint>
#include <deque>
#include <string>

#include "eredu/engine/description/weight_binding_plan.hpp"
#include "eredu/engine/orchestration/verify_options.hpp"

namespace eredu::engine {

/// One unit of a pipeline: its name (for reports and errors) and the plan that loads it.
struct PipelineUnit {
  std::string name{};      ///< e.g. "layers.3"; qualifies the parameters named in errors
  WeightBindingPlan plan;  ///< the unit's bindings, named as its module's slots
};

/// How far ahead a PrefetchPipeline loads, and within what memory.
struct PrefetchOptions {
  /// Largest accepted lookahead.
  static constexpr std::size_t max_lookahead = 4096;
  /// Largest accepted concurrent_loads.
  static constexpr std::size_t max_concurrent_loads = 256;
  /// Largest accepted timing_history.
  static constexpr std::size_t max_timing_history = std::size_t{1} << 20;

  /// Units loaded ahead of the one the consumer holds (K). At least 1.
  std::size_t lookahead = 2;
  /// Bytes of units started and not yet released, at most (0: (K+1) × the largest unit).
  std::uint64_t resident_budget = 0;
  /// Passes over the sequence (token-by-token decoding streams every layer each step);
  /// 0 streams until async_close.
  std::size_t passes = 1;
  /// Units being read at once (at least 1). One, the default, streams units in order, so
  /// the unit the consumer needs next gets all the read bandwidth and a disk sees one
  /// sequential stream; more can help when one unit cannot keep the reader busy.
  std::size_t concurrent_loads = 1;
  /// Per-unit timings kept in PipelineStats::units (the oldest are dropped beyond this).
  std::size_t timing_history = 4096;
  /// Digest verification of every unit read (not of units promoted from host copies, which
  /// were verified when read); a mismatch fails that unit like a read error. Under require,
  /// the constructor refuses a pipeline with a tensor that cannot be verified.
  VerifyOptions verify{};
};

/// Throws eredu::Error(invalid_argument) naming the first option of `options` out of range:
/// lookahead 1..max_lookahead, concurrent_loads 1..max_concurrent_loads, timing_history at
/// most max_timing_history, and verify (validate(const VerifyOptions&)). The PrefetchPipeline
/// constructor calls it.
void validate(const PrefetchOptions& options);

/// Keep-on-host, the PrefetchPipeline constructor argument that turns it on: a released unit's
/// weights stay in backend host buffers (TransferBackend::demote) and are promoted on the next
/// pass instead of being read again. Host memory then holds every unit once, so it is for a
/// model that fits in host memory but not in the backend's. Only a pipeline over a
/// TransferBackend takes it: the choice is made at compile time.
template <class Executor>
struct KeepOnHost {
  /// Demote and promote on `e` (a backend executor that must outlive async_close's completion).
  explicit KeepOnHost(Executor& e) noexcept : executor(e) {}
  Executor& executor;  ///< runs the demote and promote copies
};

/// What happened to one delivered unit.
struct UnitTiming {
  std::size_t index = 0;    ///< position in the sequence
  std::size_t pass = 0;     ///< pass it belongs to
  std::uint64_t bytes = 0;  ///< bytes its weights occupy
  double load_s = 0;        ///< from the start of its load to ready
  double stall_s = 0;       ///< how long the consumer waited for it in async_next
  bool from_host = false;   ///< promoted from a parked host copy, not read
};

/// Counters of a pipeline so far (see PrefetchPipeline::stats).
struct PipelineStats {
  std::uint64_t budget = 0;               ///< the resident budget in force
  std::uint64_t resident_bytes = 0;       ///< bytes of started, unreleased units now
  std::uint64_t resident_high_water = 0;  ///< the most resident_bytes ever reached
  std::uint64_t parked_bytes = 0;         ///< bytes held in host buffers (keep-on-host)
  std::size_t delivered = 0;              ///< units handed to the consumer
  double stall_s = 0;                     ///< total consumer wait
  double load_s = 0;                      ///< total of per-unit load times (they overlap)
  std::uint64_t tensors_verified = 0;     ///< tensors whose digest matched (PrefetchOptions::verify)
  std::uint64_t bytes_verified = 0;       ///< their stored bytes
  /// The most recent delivered units, in delivery order (at most
  /// PrefetchOptions::timing_history of them, so an endless stream stays bounded).
  std::deque<UnitTiming> units{};
};

}  // namespace eredu::engine
