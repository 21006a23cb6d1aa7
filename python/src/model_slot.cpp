#include "model_slot.hpp"

#include <asio/bind_cancellation_slot.hpp>
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

std::shared_ptr<Operation> SlotBinding::swap(std::shared_ptr<Checkpoint> checkpoint,
                                             std::optional<std::vector<ReadSpec>> specs, int verify,
                                             const py::object& canary_job, bool blocking, std::string origin) {
  io::Checksums checksums = checkpoint->checksums_to_verify(verify);
  std::shared_ptr<PyHandle> canary;
  if (!canary_job.is_none()) canary = std::make_shared<PyHandle>(canary_job);
  auto op = Operation::create(fmt::format("swap to {}", checkpoint->path()));
  Runtime::get().post([self = shared_from_this(), checkpoint, specs = std::move(specs),
                       checksums = std::move(checksums), canary, blocking, origin = std::move(origin), op]() mutable {
    bool defined_here = false;
    try {
      Checkpoint::Use use = checkpoint->use();
      if (!self->blueprint_) {
        if (!specs) throw Error(errc::invalid_argument, {}, "the first swap of a slot needs its tensor specs");
        self->blueprint_ =
            std::make_shared<const TensorSetModule>(TensorSet::build(checkpoint->catalog(), *specs).module);
        defined_here = true;
      }
      // The serving version's tensors, in its order: a missing one fails to build (tensor_not_found).
      const std::vector<ReadSpec>& rules = *self->blueprint_->specs;
      TensorSet set = TensorSet::build(checkpoint->catalog(), rules);
      std::set<std::string> wanted;
      for (const ReadSpec& r : rules) wanted.insert(r.key);
      std::vector<std::string> extra;
      for (const io::TensorInfo& t : checkpoint->catalog().tensors())
        if (!wanted.contains(t.name)) extra.push_back(t.name);
      if (!extra.empty())
        throw engine::OrchestrationError(
            errc::unexpected_bindings, {.file = checkpoint->path()},
            fmt::format("{} tensor(s) the serving version does not have, e.g. '{}'", extra.size(), extra.front()));

      engine::SwapOptions<TensorSetModule> options;
      options.origin = std::move(origin);
      options.checksums = std::move(checksums);
      options.progress = &op->progress();  // the operation outlives the swap: its handler holds it
      if (canary) {
        options.canary = [op, canary, blocking](const TensorSetModule& model) {
          std::vector<cpu::Tensor> tensors;
          for (const app::TensorSetModule::Slot& s : model.set.slots()) tensors.push_back(s.parameter.value);
          return python_canary(op, canary, blocking, std::move(tensors), model.specs);
        };
      }
      io::CheckpointSource& source = use.source();
      self->slot_.async_swap(
          source, set.plan(), self->context_, std::move(options),
          asio::bind_cancellation_slot(
              op->cancellation_slot(), [self, use = std::make_shared<Checkpoint::Use>(std::move(use)), op,
                                        defined_here](std::exception_ptr error, engine::SwapReport report) {
                // A first swap that failed leaves the slot empty: the next one defines it afresh.
                if (error && defined_here && self->slot_.generation() == 0) self->blueprint_.reset();
                if (error) {
                  op->finish(std::move(error));
                  return;
                }
                op->settle([&] { op->finish(nullptr, [report] { return py::object(report_dict(report)); }); });
              }));
    } catch (...) {
      if (defined_here) self->blueprint_.reset();
      op->finish(std::current_exception());
    }
  });
  return op;
}

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
