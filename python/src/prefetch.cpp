#include "prefetch.hpp"

#include <asio/bind_cancellation_slot.hpp>
#include <optional>
#include <utility>

#include <fmt/format.h>

#include "eredu/core/error.hpp"
#include "runtime.hpp"
#include "text.hpp"

namespace eredu::python {

namespace py = pybind11;

/// What a pipeline uses, destroyed together on the loop thread (see prefetch.hpp).
struct PrefetchState {
  /// Declared in the order that makes destruction safe: the pipeline first, the source's use last.
  struct Parts {
    std::optional<Checkpoint::Use> use;
    std::unique_ptr<cpu::Executor> executor;
    cpu::StoragePool storage;
    std::unique_ptr<cpu::MaterializationContext> context;
    std::vector<TensorSetModule> blueprints;
    std::unique_ptr<Pipeline> pipeline;
    bool closing = false;  // loop thread only
  };
  std::shared_ptr<Parts> parts;

  /// Closes the pipeline if nobody did, then lets every part go on the loop thread.
  ~PrefetchState() {
    if (!parts) return;
    try {
      Runtime::get().post([p = std::move(parts)] {
        if (!p->pipeline || p->closing) return;  // `p` is dropped on the loop thread
        p->closing = true;
        p->pipeline->async_close([p](std::exception_ptr) {
          // Not inside the pipeline's own completion: after it.
          Runtime::get().post([p] {});
        });
      });
    } catch (...) {
      // A forked child: nothing runs the pipeline here, and nothing can close it.
    }
  }
};

/// A delivered unit, held by Python until released.
class PrefetchUnit {
 public:
  /// Takes `unit` of the pipeline `state` holds.
  PrefetchUnit(std::shared_ptr<PrefetchState> state, Pipeline::Unit unit)
      : state_(std::move(state)),
        unit_(std::move(unit)),
        name_(unit_.name()),
        index_(unit_.index()),
        pass_(unit_.pass()),
        stall_s_(std::chrono::duration<double>(unit_.stall()).count()) {}

  /// The unit's name.
  const std::string& name() const noexcept { return name_; }
  /// Position in the sequence.
  std::size_t index() const noexcept { return index_; }
  /// Pass it belongs to.
  std::size_t pass() const noexcept { return pass_; }
  /// Seconds the consumer waited for it.
  double stall_s() const noexcept { return stall_s_; }
  /// True until released.
  bool held() const noexcept { return static_cast<bool>(unit_); }
  /// Its tensors (GIL held); Error(invalid_argument) once released.
  py::list tensors() const {
    if (!unit_) throw Error(errc::invalid_argument, {}, fmt::format("unit '{}' was released", name_));
    return export_module(unit_.module());
  }
  /// Gives the unit's bytes back to the budget; its tensors stay valid (they own storage).
  void release() { unit_.release(); }

 private:
  std::shared_ptr<PrefetchState> state_;  // outlives the unit's release
  Pipeline::Unit unit_;
  std::string name_;
  std::size_t index_, pass_;
  double stall_s_;
};

std::shared_ptr<Prefetch> Prefetch::create(std::shared_ptr<Checkpoint> checkpoint, std::vector<UnitSpec> units,
                                           engine::PrefetchOptions options, int threads) {
  auto state = std::make_shared<PrefetchState>();
  Runtime::get().run_on_loop([&] {
    auto parts = std::make_shared<PrefetchState::Parts>();
    parts->use.emplace(checkpoint->use());
    parts->executor = std::make_unique<cpu::Executor>(threads > 0 ? threads : checkpoint->options().threads);
    // Its own pool, keeping what it frees: a steady stream reuses the storage of the unit it
    // just released (docs/pipeline.md) and never first-touches memory again.
    parts->storage = cpu::StoragePool();
    // Resident copies stay with the reader: the arena's threads belong to the consumer's compute.
    parts->context = std::make_unique<cpu::MaterializationContext>(
        cpu::MaterializationContext{*parts->executor, parts->storage, false});
    std::vector<engine::PipelineUnit> pipeline_units;
    for (UnitSpec& u : units) {
      TensorSet set = TensorSet::build(checkpoint->catalog(), u.specs);
      pipeline_units.push_back({std::move(u.name), set.plan()});
      parts->blueprints.push_back(std::move(set.module));
    }
    PrefetchState::Parts* raw = parts.get();  // the factory runs while the parts live
    parts->pipeline = std::make_unique<Pipeline>(
        parts->use->source(), std::move(pipeline_units),
        [raw](std::size_t i) { return raw->blueprints.at(i).unbound(); }, *parts->context, options);
    state->parts = std::move(parts);
  });
  return std::make_shared<Prefetch>(std::move(state));
}

std::shared_ptr<Operation> Prefetch::next() {
  auto op = Operation::create("prefetch next unit");
  Runtime::get().post([state = state_, op] {
    op->settle([&] {
      state->parts->pipeline->async_next(asio::bind_cancellation_slot(
          op->cancellation_slot(), [state, op](std::exception_ptr error, Pipeline::Unit unit) mutable {
            op->settle([&] {
              if (error) {
                op->finish(std::move(error));
              } else if (!unit) {
                op->finish(nullptr, [] { return py::object(py::none()); });
              } else {
                auto held = std::make_shared<PrefetchUnit>(state, std::move(unit));
                op->finish(nullptr, [held] { return py::cast(held); });
              }
            });
          }));
    });
  });
  return op;
}

std::shared_ptr<Operation> Prefetch::close() {
  auto op = Operation::create("prefetch close");
  Runtime::get().post([state = state_, op] {
    op->settle([&] {
      state->parts->closing = true;
      state->parts->pipeline->async_close([state, op](std::exception_ptr error) { op->finish(std::move(error)); });
    });
  });
  return op;
}

std::size_t Prefetch::size() const { return state_->parts->pipeline->size(); }

py::dict Prefetch::stats() const {
  const engine::PipelineStats s = state_->parts->pipeline->stats();
  const cpu::StoragePoolStats storage = state_->parts->storage.stats();
  py::dict d;
  d["budget"] = s.budget;
  d["resident_bytes"] = s.resident_bytes;
  d["resident_high_water"] = s.resident_high_water;
  d["delivered"] = s.delivered;
  d["stall_s"] = s.stall_s;
  d["load_s"] = s.load_s;
  d["storage_live_bytes"] = storage.live_bytes;
  d["storage_retained_bytes"] = storage.retained_bytes;
  d["storage_fresh_allocations"] = storage.fresh_allocations;
  d["storage_recycled_allocations"] = storage.recycled_allocations;
  return d;
}

void bind_prefetch(py::module_& m) {
  py::class_<PrefetchUnit, std::shared_ptr<PrefetchUnit>>(m, "PrefetchUnit", "A delivered pipeline unit.")
      .def_property_readonly("name", [](const PrefetchUnit& u) { return text_str(u.name()); })
      .def_property_readonly("index", &PrefetchUnit::index)
      .def_property_readonly("pass_", &PrefetchUnit::pass)
      .def_property_readonly("stall_s", &PrefetchUnit::stall_s)
      .def_property_readonly("held", &PrefetchUnit::held)
      .def("tensors", &PrefetchUnit::tensors, "The unit's tensors, in spec order.")
      .def("release", &PrefetchUnit::release, "Gives the unit's bytes back to the pipeline's budget.");

  py::class_<Prefetch, std::shared_ptr<Prefetch>>(m, "Prefetch", "A prefetch pipeline over a checkpoint.")
      .def(
          py::init([](std::shared_ptr<Checkpoint> checkpoint, const py::list& units, std::size_t lookahead,
                      std::uint64_t budget, std::size_t passes, std::size_t concurrent_loads, int threads, int verify) {
            std::vector<UnitSpec> specs;
            for (const py::handle u : units) {
              if (!py::isinstance<py::tuple>(u) || py::len(u) != 2)
                throw Error(errc::invalid_argument, {}, "a unit is (name, specs)");
              const py::tuple t = py::reinterpret_borrow<py::tuple>(u);
              specs.push_back({text_bytes(t[0], "a unit name"), read_specs_from(t[1])});
            }
            engine::PrefetchOptions options{.lookahead = lookahead,
                                            .resident_budget = budget,
                                            .passes = passes,
                                            .concurrent_loads = concurrent_loads,
                                            .verify = checkpoint->verify_options(verify)};
            return Prefetch::create(std::move(checkpoint), std::move(specs), options, threads);
          }),
          py::arg("checkpoint"), py::arg("units"), py::arg("lookahead"), py::arg("budget"), py::arg("passes"),
          py::arg("concurrent_loads"), py::arg("threads"), py::arg("verify") = 0)
      .def("next", &Prefetch::next, "Starts waiting for the next unit (Operation: PrefetchUnit or None).")
      .def("close", &Prefetch::close, "Starts closing (Operation: None).")
      .def("stats", &Prefetch::stats)
      .def("__len__", &Prefetch::size);
}

}  // namespace eredu::python
