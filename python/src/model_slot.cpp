#include "model_slot.hpp"

#include <asio/bind_cancellation_slot.hpp>
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/use_awaitable.hpp>
#include <set>
#include <stdexcept>
#include <utility>

#include <fmt/format.h>

#include "eredu/core/completion.hpp"
#include "eredu/core/error.hpp"
#include "eredu/engine/orchestration/engine_error.hpp"
#include "runtime.hpp"
#include "text.hpp"

namespace eredu::python {

namespace py = pybind11;

namespace {

/// A rejection's message as UTF-8 whatever it holds: a surrogate that escapes no byte is spelled
/// out, so that reporting a verdict cannot fail (and leave the swap waiting for one).
std::string verdict_text(const py::object& rejection) {
  const py::str text(rejection);
  py::object encoded =
      py::reinterpret_steal<py::object>(PyUnicode_AsEncodedString(text.ptr(), "utf-8", "backslashreplace"));
  if (!encoded) throw py::error_already_set();
  return std::string(PyBytes_AS_STRING(encoded.ptr()), static_cast<std::size_t>(PyBytes_GET_SIZE(encoded.ptr())));
}

/// The canary step: hands the new version's tensors to Python on the operation's consumer
/// thread and waits for the verdict, which `finish(None)` (accept) or `finish(message)`
/// (reject) delivers. The loop is free meanwhile. A verdict that can never come (the job
/// dropped unrun) fails the wait with cancelled, which rejects the version.
asio::awaitable<void> python_canary(std::shared_ptr<Operation> op, std::shared_ptr<PyHandle> job, bool blocking,
                                    std::vector<cpu::Tensor> tensors,
                                    std::shared_ptr<const std::vector<ReadSpec>> specs) {
  auto verdict = std::make_shared<CompletionSource>();
  Completion decided = verdict->completion();
  op->run_in_python([job, blocking, tensors = std::move(tensors), specs, verdict]() {
    py::cpp_function finish([verdict](const py::object& rejection) {
      if (rejection.is_none())
        verdict->complete();
      else
        verdict->fail(std::make_exception_ptr(std::runtime_error(verdict_text(rejection))));
    });
    try {
      job->get()(export_tensors(tensors, *specs), finish, blocking);
    } catch (py::error_already_set& e) {
      verdict->fail(std::make_exception_ptr(std::runtime_error(e.what())));
    }
  });
  co_await decided.async_wait(asio::use_awaitable);
}

py::dict report_dict(const engine::SwapReport& r) {
  py::dict d;
  d["generation"] = r.generation;
  d["bytes"] = r.bytes;
  d["verified_bytes"] = r.verified_bytes;
  d["load_s"] = r.load_s;
  d["verify_s"] = r.verify_s;
  d["canary_s"] = r.canary_s;
  d["publish_pause_ns"] = r.publish_pause.count();
  return d;
}

/// A published version as Python holds it: keeps the version (and so its storage) alive.
struct SlotVersion {
  std::shared_ptr<const Slot::Version> version;
};

}  // namespace

SlotBinding::SlotBinding(int threads)
    : background_(std::make_unique<cpu::Executor>(threads)), context_{*background_, storage_, false}, slot_([this] {
        return blueprint_->unbound();
      }) {}

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

template <class Source>
std::shared_ptr<Operation> SlotBinding::start_swap(std::function<SwapInput<Source>()> open,
                                                   std::optional<std::vector<ReadSpec>> specs,
                                                   const py::object& canary_job, bool blocking, std::string origin,
                                                   const std::string& what) {
  std::shared_ptr<PyHandle> canary;
  if (!canary_job.is_none()) canary = std::make_shared<PyHandle>(canary_job);
  auto op = Operation::create(fmt::format("swap to {}", what));
  // Its own parameter names: a coroutine lambda's parameters are copied into its frame.
  auto body = [](std::shared_ptr<SlotBinding> self, std::function<SwapInput<Source>()> open_input,
                 std::optional<std::vector<ReadSpec>> first_specs, std::shared_ptr<PyHandle> python_canary_job,
                 bool block, std::string label, std::shared_ptr<Operation> operation) -> asio::awaitable<void> {
    bool defined_here = false;
    std::function<void(bool)> finished;
    try {
      SwapInput<Source> in = open_input();
      finished = in.finished;
      const io::Catalog& catalog = in.source->catalog();
      if (!self->blueprint_) {
        if (!first_specs) throw Error(errc::invalid_argument, {}, "the first swap of a slot needs its tensor specs");
        self->blueprint_ = std::make_shared<const TensorSetModule>(TensorSet::build(catalog, *first_specs).module);
        defined_here = true;
      }
      // The serving version's tensors, in its order: a missing one fails to build (tensor_not_found).
      const std::vector<ReadSpec>& rules = *self->blueprint_->specs;
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
        // A delta against the version serving copies its bytes and reads only what changed.
        std::shared_ptr<const engine::ModelVersion<TensorSetModule>> serving = self->slot_.current();
        const auto from = serving ? self->published_.find(serving->generation) : self->published_.end();
        if (from != self->published_.end()) {
          auto index = std::make_shared<std::map<std::string, std::size_t>>();
          for (std::size_t i = 0; i < serving->model.set.slots().size(); ++i)
            index->emplace(serving->model.set.slots()[i].name, i);
          in.use_base(from->second, set.plan(), [serving, index](const std::string& name) {
            const auto it = index->find(name);
            return it == index->end() ? std::span<const std::byte>{}
                                      : serving->model.set.slots()[it->second].parameter.value.bytes();
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
      self->slot_.async_swap(*in.source, set.plan(), self->context_, std::move(options),
                             asio::bind_cancellation_slot(
                                 operation->cancellation_slot(),
                                 [self, keep = in.keep, operation, defined_here, finished, location = in.location](
                                     std::exception_ptr error, engine::SwapReport report) {
                                   if (finished) finished(!error);
                                   if (!error && !location.empty()) {
                                     self->published_[report.generation] = location;
                                     // Only the versions a slot may still serve can be a delta's base.
                                     while (self->published_.size() > 16)
                                       self->published_.erase(self->published_.begin());
                                   }
                                   // A first swap that failed leaves the slot empty: the next one defines it afresh.
                                   if (error && defined_here && self->slot_.generation() == 0) self->blueprint_.reset();
                                   if (error) {
                                     operation->finish(std::move(error));
                                     return;
                                   }
                                   operation->settle([&] {
                                     operation->finish(nullptr, [report] { return py::object(report_dict(report)); });
                                   });
                                 }));
    } catch (...) {
      if (finished) finished(false);
      if (defined_here) self->blueprint_.reset();
      operation->finish(std::current_exception());
    }
  };
  asio::co_spawn(Runtime::get().executor(),
                 body(shared_from_this(), std::move(open), std::move(specs), canary, blocking, std::move(origin), op),
                 asio::detached);
  return op;
}

std::shared_ptr<Operation> SlotBinding::swap(std::shared_ptr<Checkpoint> checkpoint,
                                             std::optional<std::vector<ReadSpec>> specs, int verify,
                                             const py::object& canary_job, bool blocking, std::string origin) {
  io::Checksums checksums = checkpoint->checksums_to_verify(verify);
  const std::string what = checkpoint->path();
  std::function<SwapInput<io::CheckpointSource>()> open = [checkpoint, checksums = std::move(checksums)]() mutable {
    auto use = std::make_shared<Checkpoint::Use>(checkpoint->use());
    SwapInput<io::CheckpointSource> in;
    in.source = &use->source();
    in.name = checkpoint->path();
    in.checksums = std::move(checksums);
    in.keep = use;
    return in;
  };
  return start_swap<io::CheckpointSource>(std::move(open), std::move(specs), canary_job, blocking, std::move(origin),
                                          what);
}

#ifdef EREDU_PYTHON_LIVE
std::shared_ptr<Operation> SlotBinding::swap(std::shared_ptr<PublishedVersion> version,
                                             std::optional<std::vector<ReadSpec>> specs, const py::object& canary_job,
                                             bool blocking, std::string origin) {
  // A published version is always verified: against the publisher's digests of what this slot
  // reads; its canary first confirms the version is still offered.
  std::function<SwapInput<mpi::PublishedSource>()> open = [version] {
    SwapInput<mpi::PublishedSource> in;
    in.source = &version->source();
    in.name = version->source().location();
    in.keep = version;
    mpi::PublishedSource* source = in.source;
    in.confirm = [source]() -> asio::awaitable<void> { co_await source->async_confirm(asio::use_awaitable); };
    in.finished = [source](bool ok) {
      source->finish(ok);
      source->use_base({}, {});  // lets the serving version it copied from go
    };
    in.location = source->location();
    in.use_base = [source](const std::string& serving_location, const engine::WeightBindingPlan& plan,
                           std::function<std::span<const std::byte>(const std::string&)> parameter_bytes) {
      if (!source->base().empty() && serving_location == source->base_location())
        source->use_base(source->base(), mpi::base_from_parameters(plan, std::move(parameter_bytes)));
    };
    in.digests = [source](const engine::WeightBindingPlan& plan) -> asio::awaitable<io::Checksums> {
      co_return co_await source->async_checksums(plan, asio::use_awaitable);
    };
    return in;
  };
  return start_swap<mpi::PublishedSource>(std::move(open), std::move(specs), canary_job, blocking, std::move(origin),
                                          "a published version");
}
#endif

void bind_model_slot(py::module_& m) {
  py::class_<SlotVersion>(m, "SlotVersion", "A published version of a ModelSlot.")
      .def_property_readonly("generation", [](const SlotVersion& v) { return v.version->generation; })
      .def_property_readonly("origin", [](const SlotVersion& v) { return text_str(v.version->origin); })
      .def(
          "keys",
          [](const SlotVersion& v) {
            py::list out;
            for (const ReadSpec& s : *v.version->model.specs) out.append(text_str(s.key));
            return out;
          },
          "Tensor names, in slot order.")
      .def(
          "tensors", [](const SlotVersion& v) { return export_module(v.version->model); },
          "The version's tensors, in slot order.");

  py::class_<SlotBinding, std::shared_ptr<SlotBinding>>(m, "ModelSlot", "A hot-swappable model version.")
      .def(py::init<int>(), py::arg("threads"))
      .def(
          "swap",
          [](SlotBinding& s, std::shared_ptr<Checkpoint> checkpoint, const py::object& specs, int verify,
             const py::object& canary_job, bool blocking, const py::object& origin) {
            std::optional<std::vector<ReadSpec>> rules;
            if (!specs.is_none()) rules = read_specs_from(specs);
            return s.swap(std::move(checkpoint), std::move(rules), verify, canary_job, blocking,
                          text_bytes(origin, "origin"));
          },
          py::arg("checkpoint"), py::arg("specs"), py::arg("verify"), py::arg("canary_job"), py::arg("blocking"),
          py::arg("origin"))
#ifdef EREDU_PYTHON_LIVE
      .def(
          "swap",
          [](SlotBinding& s, std::shared_ptr<PublishedVersion> version, const py::object& specs, int,
             const py::object& canary_job, bool blocking, const py::object& origin) {
            std::optional<std::vector<ReadSpec>> rules;
            if (!specs.is_none()) rules = read_specs_from(specs);
            return s.swap(std::move(version), std::move(rules), canary_job, blocking, text_bytes(origin, "origin"));
          },
          py::arg("checkpoint"), py::arg("specs"), py::arg("verify"), py::arg("canary_job"), py::arg("blocking"),
          py::arg("origin"))
#endif
      .def(
          "current",
          [](const SlotBinding& s) -> py::object {
            auto v = s.current();
            if (!v) return py::none();
            return py::cast(SlotVersion{std::move(v)});
          },
          "The serving version (wait-free), or None.")
      .def_property_readonly("generation",
                             [](const SlotBinding& s) {
                               auto v = s.current();
                               return v ? v->generation : 0;
                             })
      .def_property_readonly("swapping", &SlotBinding::swapping)
      .def(
          "storage",
          [](const SlotBinding& s) {
            const cpu::StoragePoolStats st = s.storage();
            py::dict d;
            d["live_bytes"] = st.live_bytes;
            d["retained_bytes"] = st.retained_bytes;
            d["fresh_allocations"] = st.fresh_allocations;
            d["recycled_allocations"] = st.recycled_allocations;
            return d;
          },
          "The slot's storage pool counters.");
}

}  // namespace eredu::python
