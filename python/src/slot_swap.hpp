#pragma once
/// \file
/// eredu::python::start_slot_swap: one swap of a Python slot (ModelSlot or InPlaceModelSlot),
/// from a checkpoint or a published version, as an Operation. What every slot's swap shares
/// lives here: the tensor specs fixed by the first successful swap, the check that a later
/// source holds exactly those tensors, a published delta rebuilt over the serving bytes, the
/// digests, the Python canary, and the report. What differs (how the engine's slot loads and
/// publishes) is the `launch` each call passes.
///
/// A slot binding (Slot) provides, all on the loop thread:
///  * `blueprint`: the tensors the slot serves, fixed by its first successful swap (null before);
///  * `published`: the published version each recent generation was loaded from (a delta
///    against it reads only what changed);
///  * `serving()`: the serving version's tensors (ServingTensors), or nullopt before the first;
///  * `generation()`: the serving generation.
///
/// The canary is Python code that must not run on the loop thread: the swap's canary step
/// queues it to the operation's consumer (the asyncio loop that awaits the swap, or the
/// blocked caller) and awaits its verdict, so the loop keeps serving reads meanwhile.

#include <pybind11/pybind11.h>

#include <asio/awaitable.hpp>
#include <asio/bind_cancellation_slot.hpp>
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/use_awaitable.hpp>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "checkpoint.hpp"
#include "eredu/core/error.hpp"
#include "eredu/cpu/backend.hpp"
#include "eredu/engine/orchestration/engine_error.hpp"
#include "eredu/engine/serving/swap_options.hpp"
#include "operation.hpp"
#include "py_handle.hpp"
#include "runtime.hpp"
#include "tensor_set.hpp"
#ifdef EREDU_PYTHON_LIVE
#include "live.hpp"
#endif

namespace eredu::python {

/// What a swap reads from, whatever it is: its byte source and catalog, how messages name it,
/// what stays open while the swap runs, and what a published version adds (the confirmation
/// before the canary, the "done" after the swap).
template <class Source>
struct SwapInput {
  Source* source = nullptr;
  std::string name{};
  io::Checksums checksums{};
  std::shared_ptr<void> keep{};  // keeps the source open until the swap ends
  std::function<asio::awaitable<void>()> confirm{};
  std::function<void(bool)> finished{};
  /// Digests of what `plan` reads, fetched before the swap (a published version's).
  std::function<asio::awaitable<io::Checksums>(const engine::WeightBindingPlan&)> digests{};
  /// Where the source is (set for a published version: what a later delta names as its base).
  std::string location{};
  /// A published delta: reconstruct it over the serving version, which was loaded from
  /// `serving_location`, when that is the delta's base (PublishedSource::use_base).
  std::function<void(const std::string& serving_location, const engine::WeightBindingPlan&,
                     std::function<std::span<const std::byte>(const std::string& parameter)> parameter_bytes)>
      use_base{};
};

/// The serving version's tensors, by slot name; each holds its storage.
struct ServingTensors {
  std::uint64_t generation = 0;              ///< the version's generation
  std::map<std::string, cpu::Tensor> slots;  ///< slot name -> bound tensor
  /// The bound tensors of `model`, serving as `generation`.
  static ServingTensors of(std::uint64_t generation, const TensorSetModule& model) {
    ServingTensors out{generation, {}};
    for (const app::TensorSetModule::Slot& s : model.set.slots()) out.slots.emplace(s.name, s.parameter.value);
    return out;
  }
};

/// The canary step: hands the new version's tensors to Python on the operation's consumer
/// thread and waits for the verdict (see file comment).
asio::awaitable<void> python_canary(std::shared_ptr<Operation> op, std::shared_ptr<PyHandle> job, bool blocking,
                                    std::vector<cpu::Tensor> tensors,
                                    std::shared_ptr<const std::vector<ReadSpec>> specs);

/// A swap's report as the dict Python sees.
pybind11::dict report_dict(const engine::SwapReport& r);
/// A slot's storage pool counters as the dict Python sees.
pybind11::dict storage_dict(const cpu::StoragePoolStats& stats);

/// A swap from `checkpoint`, verified as `verify` says (0 never, 1 when digests exist, 2
/// digests required, else Error(invalid_argument)).
std::function<SwapInput<io::CheckpointSource>()> checkpoint_input(std::shared_ptr<Checkpoint> checkpoint, int verify);
#ifdef EREDU_PYTHON_LIVE
/// A swap to a published version: always verified, against the publisher's digests of what the
/// slot reads; its canary first confirms the version is still offered, and the publisher is
/// told when the swap ends.
std::function<SwapInput<mpi::PublishedSource>()> published_input(std::shared_ptr<PublishedVersion> version);
#endif

/// Starts a swap of `slot` to what `open()` gives on the loop thread (see file comment).
/// `specs` defines the slot's tensors on its first swap; `canary_job(tensors, finish,
/// blocking)` is the Python side of the canary (None: none); `what` names the operation.
/// `launch(source, plan, options, handler)` starts the engine's swap, on the loop thread; its
/// handler takes `(std::exception_ptr, engine::SwapReport)`.
template <class Source, class Slot, class Launch>
std::shared_ptr<Operation> start_slot_swap(std::shared_ptr<Slot> slot, std::function<SwapInput<Source>()> open,
                                           std::optional<std::vector<ReadSpec>> specs,
                                           const pybind11::object& canary_job, bool blocking, std::string origin,
                                           const std::string& what, Launch launch) {
  std::shared_ptr<PyHandle> canary;
  if (!canary_job.is_none()) canary = std::make_shared<PyHandle>(canary_job);
  auto op = Operation::create(fmt::format("swap to {}", what));
  // Its own parameter names: a coroutine lambda's parameters are copied into its frame.
  auto body = [](std::shared_ptr<Slot> self, std::function<SwapInput<Source>()> open_input,
                 std::optional<std::vector<ReadSpec>> first_specs, std::shared_ptr<PyHandle> python_canary_job,
                 bool block, std::string label, std::shared_ptr<Operation> operation,
                 Launch start) -> asio::awaitable<void> {
    bool defined_here = false;
    std::function<void(bool)> finished;
    try {
      SwapInput<Source> in = open_input();
      finished = in.finished;
      const io::Catalog& catalog = in.source->catalog();
      if (!self->blueprint) {
        if (!first_specs) throw Error(errc::invalid_argument, {}, "the first swap of a slot needs its tensor specs");
        self->blueprint = std::make_shared<const TensorSetModule>(TensorSet::build(catalog, *first_specs).module);
        defined_here = true;
      }
      // The serving version's tensors, in its order: a missing one fails to build (tensor_not_found).
      const std::vector<ReadSpec>& rules = *self->blueprint->specs;
      TensorSet set = TensorSet::build(catalog, rules);
      std::set<std::string> wanted;
      for (const ReadSpec& r : rules) wanted.insert(r.key);
      std::vector<std::string> extra;
      for (const io::TensorInfo& t : catalog.tensors())
        if (!wanted.contains(t.name)) extra.push_back(t.name);
      if (!extra.empty())
        throw engine::OrchestrationError(
            errc::unexpected_bindings, {.file = in.name},
            fmt::format("{} tensor(s) the serving version does not have, e.g. '{}'", extra.size(), extra.front()));

      engine::SwapOptions<TensorSetModule> options;
      options.origin = std::move(label);
      if (in.use_base) {
        // A delta against the version serving reads only what changed.
        std::optional<ServingTensors> serving = self->serving();
        const auto from = serving ? self->published.find(serving->generation) : self->published.end();
        if (from != self->published.end()) {
          auto tensors = std::make_shared<const std::map<std::string, cpu::Tensor>>(std::move(serving->slots));
          in.use_base(from->second, set.plan(), [tensors](const std::string& name) {
            const auto it = tensors->find(name);
            return it == tensors->end() ? std::span<const std::byte>{} : it->second.bytes();
          });
        }
      }
      // Not a conditional expression: GCC 12 destroys the temporaries of a co_await inside one twice.
      if (in.digests)
        options.checksums = co_await in.digests(set.plan());
      else
        options.checksums = std::move(in.checksums);
      options.progress = &operation->progress();  // the operation outlives the swap: its handler holds it
      if (python_canary_job || in.confirm) {
        options.canary = [operation, python_canary_job, block,
                          confirm = in.confirm](const TensorSetModule& model) -> asio::awaitable<void> {
          if (confirm) co_await confirm();
          if (!python_canary_job) co_return;
          std::vector<cpu::Tensor> tensors;
          for (const app::TensorSetModule::Slot& s : model.set.slots()) tensors.push_back(s.parameter.value);
          co_await python_canary(operation, python_canary_job, block, std::move(tensors), model.specs);
        };
      }
      start(*in.source, set.plan(), std::move(options),
            asio::bind_cancellation_slot(operation->cancellation_slot(),
                                         [self, keep = in.keep, operation, defined_here, finished,
                                          location = in.location](std::exception_ptr error, engine::SwapReport report) {
                                           if (finished) finished(!error);
                                           if (!error && !location.empty()) {
                                             self->published[report.generation] = location;
                                             // Only the versions a slot may still serve can be a delta's base.
                                             while (self->published.size() > 16)
                                               self->published.erase(self->published.begin());
                                           }
                                           // A first swap that failed leaves the slot empty: the next one defines it
                                           // afresh.
                                           if (error && defined_here && self->generation() == 0)
                                             self->blueprint.reset();
                                           if (error) {
                                             operation->finish(std::move(error));
                                             return;
                                           }
                                           operation->settle([&] {
                                             operation->finish(
                                                 nullptr, [report] { return pybind11::object(report_dict(report)); });
                                           });
                                         }));
    } catch (...) {
      if (finished) finished(false);
      if (defined_here) self->blueprint.reset();
      operation->finish(std::current_exception());
    }
  };
  asio::co_spawn(Runtime::get().executor(),
                 body(std::move(slot), std::move(open), std::move(specs), canary, blocking, std::move(origin), op,
                      std::move(launch)),
                 asio::detached);
  return op;
}

}  // namespace eredu::python
