#pragma once
/// \file
/// eredu::python::Prefetch: engine::PrefetchPipeline over the CPU backend for Python —
/// `for unit in eredu.prefetch(...)` and `async for`. Units are lists of ReadSpecs (the Python
/// layer groups tensors into layers, or takes the user's grouping); each delivered unit is a
/// PrefetchUnit whose tensors Python sees zero-copy, held until released.
///
/// Ownership: one PrefetchState holds the pipeline and everything it uses (the checkpoint's
/// source, its own TBB arena and storage pool). The Python Prefetch object, every operation in
/// flight and every unit not yet released share it, so a unit may outlive the Prefetch object
/// (its release still reaches a live pipeline). When the last of them lets go, the state
/// closes the pipeline if nobody did (async_close: every load stopped, every lease back) and is
/// destroyed on the loop thread.

#include <pybind11/pybind11.h>

#include <memory>
#include <string>
#include <vector>

#include "checkpoint.hpp"
#include "eredu/cpu/backend.hpp"
#include "eredu/engine/serving/prefetch_pipeline.hpp"
#include "operation.hpp"
#include "tensor_set.hpp"

namespace eredu::python {

/// The pipeline type of the module.
using Pipeline = engine::PrefetchPipeline<cpu::Backend, TensorSetModule>;

/// One unit to stream: its name and its tensors.
struct UnitSpec {
  std::string name;             ///< "model.layers.3"; qualifies parameters in errors
  std::vector<ReadSpec> specs;  ///< the unit's tensors, read whole
};

struct PrefetchState;

/// A pipeline (see file comment). Create with Prefetch::create.
class Prefetch {
 public:
  /// Builds the pipeline on the loop thread; loads start at once. Throws, before any read,
  /// what PrefetchPipeline's constructor throws (a bad plan, a unit larger than the budget,
  /// lookahead 0) and what TensorSet::build throws.
  static std::shared_ptr<Prefetch> create(std::shared_ptr<Checkpoint> checkpoint, std::vector<UnitSpec> units,
                                          engine::PrefetchOptions options, int threads);

  /// The next unit; the result is a PrefetchUnit, or None after the last pass. Errors: the
  /// unit's load error, again on every later call; cancelled once cancelled or closed.
  std::shared_ptr<Operation> next();
  /// Stops every load and waits until every lease is back; units held stay valid.
  std::shared_ptr<Operation> close();
  /// The pipeline's counters, and its storage pool's.
  pybind11::dict stats() const;
  /// Number of units per pass.
  std::size_t size() const;

  /// Use create().
  explicit Prefetch(std::shared_ptr<PrefetchState> state) : state_(std::move(state)) {}

 private:
  std::shared_ptr<PrefetchState> state_;
};

/// Registers eredu._native.Prefetch and eredu._native.PrefetchUnit.
void bind_prefetch(pybind11::module_& m);

}  // namespace eredu::python
