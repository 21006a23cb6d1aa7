#include "in_place_slot.hpp"

#include <utility>

#include "eredu/core/error.hpp"
#include "text.hpp"

namespace eredu::python {

namespace py = pybind11;

const TensorSetModule& InPlaceRead::model() const {
  if (!reader_) throw Error(errc::invalid_argument, {}, "this read of the in-place slot was released");
  return reader_.model();
}

InPlaceSlotBinding::InPlaceSlotBinding(int threads)
    : background_(std::make_unique<cpu::Executor>(threads)), context_{*background_, storage_, false} {}

std::shared_ptr<NumberedSlot> InPlaceSlotBinding::slot_for_blueprint() {
  std::shared_ptr<NumberedSlot> slot = slot_.load();
  if (slot && slot_blueprint_ == blueprint) return slot;
  // A first swap: the tensors were (re)defined, so the slot that served nothing goes.
  const std::uint64_t instance = slot ? slot->instance + 1 : 1;
  if (slot) unused_.push_back(std::move(slot));
  slot = std::make_shared<NumberedSlot>([model = blueprint] { return model->unbound(); }, instance);
  slot_blueprint_ = blueprint;
  slot_.store(slot);
  return slot;
}

template <class Source>
std::shared_ptr<Operation> InPlaceSlotBinding::swap(std::function<SwapInput<Source>()> input,
                                                    std::optional<std::vector<ReadSpec>> specs,
                                                    const py::object& canary_job, bool blocking, std::string origin,
                                                    const std::string& what,
                                                    std::optional<engine::PatchOptions> patch) {
  std::shared_ptr<InPlaceSlotBinding> self = shared_from_this();
  auto launch = [self, patch](Source& source, const engine::WeightBindingPlan& plan,
                              engine::SwapOptions<TensorSetModule> options, auto handler) {
    InPlaceSlot& slot = self->slot_for_blueprint()->slot;
    if (patch)
      slot.async_patch(source, plan, *self->background_, std::move(options), *patch, std::move(handler));
    else
      slot.async_swap(source, plan, self->context_, *self->background_, std::move(options), std::move(handler));
  };
  return start_slot_swap<Source>(self, std::move(input), std::move(specs), canary_job, blocking, std::move(origin),
                                 what, std::move(launch));
}

std::optional<ServingTensors> InPlaceSlotBinding::serving() const {
  std::shared_ptr<InPlaceRead> read = try_read();
  if (!read) return std::nullopt;
  // The storage stays as read: only this slot's swaps write it, and one runs at a time.
  return ServingTensors::of(read->generation(), read->model());
}

std::shared_ptr<InPlaceRead> InPlaceSlotBinding::try_read() const {
  std::shared_ptr<NumberedSlot> slot = slot_.load();
  if (!slot) return nullptr;
  std::optional<InPlaceSlot::Reader> reader = slot->slot.try_read();
  if (!reader || reader->generation() == 0) return nullptr;
  return std::make_shared<InPlaceRead>(std::move(slot), std::move(*reader));
}

std::shared_ptr<Operation> InPlaceSlotBinding::read() {
  auto op = Operation::create("read of an in-place slot");
  std::shared_ptr<NumberedSlot> slot = slot_.load();
  if (!slot) {
    op->finish(nullptr, [] { return py::object(py::none()); });
    return op;
  }
  slot->slot.async_read([op, slot](std::exception_ptr error, InPlaceSlot::Reader reader) mutable {
    if (error) {
      op->finish(std::move(error));
      return;
    }
    if (reader.generation() == 0) {
      op->finish(nullptr, [] { return py::object(py::none()); });
      return;
    }
    auto read = std::make_shared<InPlaceRead>(std::move(slot), std::move(reader));
    op->finish(nullptr, [read] { return py::cast(read); });
  });
  return op;
}

std::uint64_t InPlaceSlotBinding::generation() const {
  std::shared_ptr<NumberedSlot> slot = slot_.load();
  return slot ? slot->slot.generation() : 0;
}

bool InPlaceSlotBinding::swapping() const {
  std::shared_ptr<NumberedSlot> slot = slot_.load();
  return slot && slot->slot.swapping();
}

namespace {

/// The optional patch settings of a native swap: None (a staged swap), or the budget in bytes.
std::optional<engine::PatchOptions> patch_options(const py::object& budget) {
  if (budget.is_none()) return std::nullopt;
  return engine::PatchOptions{.budget = budget.cast<std::uint64_t>()};
}

}  // namespace

void bind_in_place_slot(py::module_& m) {
  py::class_<InPlaceRead, std::shared_ptr<InPlaceRead>>(m, "InPlaceRead",
                                                        "A read of an in-place slot's serving version.")
      .def_property_readonly("generation", &InPlaceRead::generation)
      .def_property_readonly("instance", &InPlaceRead::instance)
      .def(
          "keys", [](const InPlaceRead& r) { return export_keys(r.model()); }, "Tensor names, in slot order.")
      .def(
          "tensors", [](const InPlaceRead& r) { return export_module(r.model()); },
          "The serving tensors (the slot's storage), in slot order.")
      .def("release", &InPlaceRead::release, "Ends the read (idempotent).");

  py::class_<InPlaceSlotBinding, std::shared_ptr<InPlaceSlotBinding>>(m, "InPlaceModelSlot",
                                                                      "A model swapped in place.")
      .def(py::init<int>(), py::arg("threads"))
      .def(
          "swap",
          [](InPlaceSlotBinding& s, std::shared_ptr<Checkpoint> checkpoint, const py::object& specs, int verify,
             const py::object& canary_job, bool blocking, const py::object& origin, const py::object& patch_budget) {
            std::optional<std::vector<ReadSpec>> rules;
            if (!specs.is_none()) rules = read_specs_from(specs);
            const std::string what = checkpoint->path();
            return s.swap<io::CheckpointSource>(checkpoint_input(std::move(checkpoint), verify), std::move(rules),
                                                canary_job, blocking, text_bytes(origin, "origin"), what,
                                                patch_options(patch_budget));
          },
          py::arg("checkpoint"), py::arg("specs"), py::arg("verify"), py::arg("canary_job"), py::arg("blocking"),
          py::arg("origin"), py::arg("patch_budget") = py::none())
#ifdef EREDU_PYTHON_LIVE
      .def(
          "swap",
          [](InPlaceSlotBinding& s, std::shared_ptr<PublishedVersion> version, const py::object& specs, int,
             const py::object& canary_job, bool blocking, const py::object& origin, const py::object& patch_budget) {
            std::optional<std::vector<ReadSpec>> rules;
            if (!specs.is_none()) rules = read_specs_from(specs);
            return s.swap<mpi::PublishedSource>(published_input(std::move(version)), std::move(rules), canary_job,
                                                blocking, text_bytes(origin, "origin"), "a published version",
                                                patch_options(patch_budget));
          },
          py::arg("checkpoint"), py::arg("specs"), py::arg("verify"), py::arg("canary_job"), py::arg("blocking"),
          py::arg("origin"), py::arg("patch_budget") = py::none())
#endif
      .def("try_read", &InPlaceSlotBinding::try_read,
           "A read now, or None while a swap writes (or before the first version).")
      .def("read", &InPlaceSlotBinding::read, "A read as an operation, waiting for the write in progress.")
      .def_property_readonly("generation", &InPlaceSlotBinding::generation)
      .def_property_readonly("swapping", &InPlaceSlotBinding::swapping)
      .def(
          "storage", [](const InPlaceSlotBinding& s) { return storage_dict(s.storage()); },
          "The slot's storage pool counters.");
}

}  // namespace eredu::python
