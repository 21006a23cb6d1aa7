#include "model_slot.hpp"

#include <utility>

#include "text.hpp"

namespace eredu::python {

namespace py = pybind11;

namespace {

/// A published version as Python holds it: keeps the version (and so its storage) alive.
struct SlotVersion {
  std::shared_ptr<const Slot::Version> version;
};

}  // namespace

SlotBinding::SlotBinding(int threads)
    : background_(std::make_unique<cpu::Executor>(threads)), context_{*background_, storage_, false}, slot_([this] {
        return blueprint->unbound();
      }) {}

std::optional<ServingTensors> SlotBinding::serving() const {
  std::shared_ptr<const Slot::Version> version = slot_.current();
  if (!version) return std::nullopt;
  return ServingTensors::of(version->generation, version->model);
}

template <class Source>
std::shared_ptr<Operation> SlotBinding::start_swap(std::function<SwapInput<Source>()> input,
                                                   std::optional<std::vector<ReadSpec>> specs,
                                                   const py::object& canary_job, bool blocking, std::string origin,
                                                   const std::string& what) {
  std::shared_ptr<SlotBinding> self = shared_from_this();
  auto launch = [self](Source& source, const engine::WeightBindingPlan& plan,
                       engine::SwapOptions<TensorSetModule> options, auto handler) {
    self->slot_.async_swap(source, plan, self->context_, std::move(options), std::move(handler));
  };
  return start_slot_swap<Source>(self, std::move(input), std::move(specs), canary_job, blocking, std::move(origin),
                                 what, std::move(launch));
}

std::shared_ptr<Operation> SlotBinding::swap(std::shared_ptr<Checkpoint> checkpoint,
                                             std::optional<std::vector<ReadSpec>> specs, int verify,
                                             const py::object& canary_job, bool blocking, std::string origin) {
  const std::string what = checkpoint->path();
  return start_swap<io::CheckpointSource>(checkpoint_input(std::move(checkpoint), verify), std::move(specs), canary_job,
                                          blocking, std::move(origin), what);
}

#ifdef EREDU_PYTHON_LIVE
std::shared_ptr<Operation> SlotBinding::swap(std::shared_ptr<PublishedVersion> version,
                                             std::optional<std::vector<ReadSpec>> specs, const py::object& canary_job,
                                             bool blocking, std::string origin) {
  return start_swap<mpi::PublishedSource>(published_input(std::move(version)), std::move(specs), canary_job, blocking,
                                          std::move(origin), "a published version");
}
#endif

void bind_model_slot(py::module_& m) {
  py::class_<SlotVersion>(m, "SlotVersion", "A published version of a ModelSlot.")
      .def_property_readonly("generation", [](const SlotVersion& v) { return v.version->generation; })
      .def_property_readonly("origin", [](const SlotVersion& v) { return text_str(v.version->origin); })
      .def(
          "keys", [](const SlotVersion& v) { return export_keys(v.version->model); }, "Tensor names, in slot order.")
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
          "storage", [](const SlotBinding& s) { return storage_dict(s.storage()); },
          "The slot's storage pool counters.");
}

}  // namespace eredu::python
