#pragma once
/// \file
/// eredu::python::InPlaceSlotBinding: engine::InPlaceModelSlot over the CPU backend for Python —
/// one copy of the model in memory, whose storage every version is written into. A request
/// holds a read (InPlaceRead) for as long as it uses the tensors; a swap stages the new version
/// and copies it in, a patch writes only the blocks that differ (InPlaceModelSlot::async_patch),
/// each while no read is held. Both are start_slot_swap (slot_swap.hpp), as ModelSlot's swap.
///
/// The engine's slot is made by the first swap, which fixes the tensors (InPlaceModelSlot
/// needs its model's slots when it is built). A first swap that fails leaves no version: the
/// next one may define other tensors, in a slot of its own.

#include <pybind11/pybind11.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "eredu/cpu/backend.hpp"
#include "eredu/engine/serving/in_place_model_slot.hpp"
#include "slot_swap.hpp"

namespace eredu::python {

/// The in-place slot type of the module.
using InPlaceSlot = engine::InPlaceModelSlot<cpu::Backend, TensorSetModule>;

/// An engine slot and which one its binding made it (the storage its tensors are): the same for
/// every version until a first swap has to define the tensors again.
struct NumberedSlot {
  /// The `instance`-th slot, whose model `make_model` makes.
  NumberedSlot(InPlaceSlot::Factory make_model, std::uint64_t n) : slot(std::move(make_model)), instance(n) {}
  InPlaceSlot slot;              ///< the engine's slot
  const std::uint64_t instance;  ///< 1 for the binding's first
};

/// One read of an in-place slot's serving version: the next swap's write waits until it is
/// released. Its tensors are the serving storage itself.
class InPlaceRead {
 public:
  /// Holds `reader` of `slot`.
  InPlaceRead(std::shared_ptr<NumberedSlot> slot, InPlaceSlot::Reader reader)
      : slot_(std::move(slot)), reader_(std::move(reader)) {}

  /// The version read; 0 once released.
  std::uint64_t generation() const noexcept { return reader_ ? reader_.generation() : 0; }
  /// Which engine slot this reads (NumberedSlot::instance).
  std::uint64_t instance() const noexcept { return slot_->instance; }
  /// The model read. Throws Error(invalid_argument) once released.
  const TensorSetModule& model() const;
  /// Ends the read (idempotent).
  void release() { reader_.release(); }

 private:
  std::shared_ptr<NumberedSlot> slot_;  // declared first: the reader goes before its slot
  InPlaceSlot::Reader reader_;
};

/// See file comment. Held by std::shared_ptr (Python's reference and each swap in flight).
class InPlaceSlotBinding : public std::enable_shared_from_this<InPlaceSlotBinding> {
 public:
  /// An empty slot whose swaps load on an arena of `threads` threads.
  explicit InPlaceSlotBinding(int threads);

  /// Swaps to `input` (a staged copy written in), or patches to it when `patch` is set (only
  /// the blocks that differ, at most patch->budget bytes held). As SlotBinding::swap.
  template <class Source>
  std::shared_ptr<Operation> swap(std::function<SwapInput<Source>()> input, std::optional<std::vector<ReadSpec>> specs,
                                  const pybind11::object& canary_job, bool blocking, std::string origin,
                                  const std::string& what, std::optional<engine::PatchOptions> patch);

  /// A read now, or null while a swap writes or before the first version (any thread).
  /// Throws a torn slot's error.
  std::shared_ptr<InPlaceRead> try_read() const;
  /// A read as an operation: it waits for the write in progress (at most one). Its result is
  /// an InPlaceRead, or None before the first version.
  std::shared_ptr<Operation> read();

  /// The serving generation (0 before the first swap).
  std::uint64_t generation() const;
  /// True while a swap runs.
  bool swapping() const;
  /// Bytes of the slot's storage pool in use and kept for the next swap.
  cpu::StoragePoolStats storage() const { return storage_.stats(); }

  // What start_slot_swap uses, on the loop thread (slot_swap.hpp).
  std::shared_ptr<const TensorSetModule> blueprint;  ///< the slot's tensors, once defined
  std::map<std::uint64_t, std::string> published;    ///< generation -> published version
  /// The serving version's tensors, or nullopt before the first swap.
  std::optional<ServingTensors> serving() const;

 private:
  /// The engine's slot for the current blueprint, made on the first swap. Loop thread.
  std::shared_ptr<NumberedSlot> slot_for_blueprint();

  std::unique_ptr<cpu::Executor> background_;
  cpu::StoragePool storage_;
  cpu::MaterializationContext context_;
  std::atomic<std::shared_ptr<NumberedSlot>> slot_;  // read from any thread
  std::shared_ptr<const TensorSetModule> slot_blueprint_;
  /// Slots whose first swap failed: kept until the binding goes, as their swaps may still be
  /// unwinding when the next first swap makes a new one.
  std::vector<std::shared_ptr<NumberedSlot>> unused_;
};

/// Registers eredu._native.InPlaceModelSlot and eredu._native.InPlaceRead.
void bind_in_place_slot(pybind11::module_& m);

}  // namespace eredu::python
