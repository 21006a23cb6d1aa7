#pragma once
/// \file
/// eredu::python::SlotBinding: engine::ModelSlot over the CPU backend for Python — a serving
/// version read wait-free from any thread (`current()`), replaced by `swap()`: load on a
/// background arena, verify checksums, run the Python canary, publish.
///
/// The model is a TensorSetModule. Its slots are fixed by the first successful swap's
/// checkpoint (every tensor, with the dtype rules Python chose then); a later checkpoint must
/// hold the same tensors with the same dtypes and shapes: a missing one fails with
/// tensor_not_found, an extra one with unexpected_bindings, a different shape with
/// bind_shape_mismatch — and the old version keeps serving.
///
/// The swap itself is start_slot_swap (slot_swap.hpp); this binding launches the engine's.

#include <pybind11/pybind11.h>

#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "eredu/cpu/backend.hpp"
#include "eredu/engine/serving/model_slot.hpp"
#include "slot_swap.hpp"

namespace eredu::python {

/// The slot type of the module.
using Slot = engine::ModelSlot<cpu::Backend, TensorSetModule>;

/// See file comment. Held by std::shared_ptr (Python's reference and each swap in flight).
class SlotBinding : public std::enable_shared_from_this<SlotBinding> {
 public:
  /// An empty slot whose swaps load on an arena of `threads` threads (the throttle: serving
  /// keeps the other cores).
  explicit SlotBinding(int threads);

  /// Swaps to `checkpoint`. `specs` gives the slots on the first swap (ignored later);
  /// `verify`: 0 never, 1 when digests exist, 2 digests required (else Error(invalid_argument));
  /// `canary_job(tensors, finish, blocking)` is the Python side of the canary (None: none).
  /// The result is the SwapReport as a dict.
  std::shared_ptr<Operation> swap(std::shared_ptr<Checkpoint> checkpoint, std::optional<std::vector<ReadSpec>> specs,
                                  int verify, const pybind11::object& canary_job, bool blocking, std::string origin);
#ifdef EREDU_PYTHON_LIVE
  /// Swaps to a published version (live.hpp), verified against the publisher's digests of what
  /// the slot reads; its canary first confirms the version is still offered, and the publisher
  /// is told when the swap ends.
  std::shared_ptr<Operation> swap(std::shared_ptr<PublishedVersion> version, std::optional<std::vector<ReadSpec>> specs,
                                  const pybind11::object& canary_job, bool blocking, std::string origin);
#endif

  /// The serving version (any thread, wait-free), or null before the first swap.
  std::shared_ptr<const Slot::Version> current() const noexcept { return slot_.current(); }
  /// True while a swap runs.
  bool swapping() const noexcept { return slot_.swapping(); }
  /// Bytes of the slot's storage pool in use and kept for the next swap.
  cpu::StoragePoolStats storage() const { return storage_.stats(); }

  // What start_slot_swap uses, on the loop thread (slot_swap.hpp).
  std::shared_ptr<const TensorSetModule> blueprint;  ///< the slot's tensors, once defined
  std::map<std::uint64_t, std::string> published;    ///< generation -> published version
  /// The serving version's tensors, or nullopt before the first swap.
  std::optional<ServingTensors> serving() const;
  /// The serving generation.
  std::uint64_t generation() const { return slot_.generation(); }

 private:
  /// swap() for any source.
  template <class Source>
  std::shared_ptr<Operation> start_swap(std::function<SwapInput<Source>()> input,
                                        std::optional<std::vector<ReadSpec>> specs, const pybind11::object& canary_job,
                                        bool blocking, std::string origin, const std::string& what);

  std::unique_ptr<cpu::Executor> background_;
  cpu::StoragePool storage_;  // keeps the retired version's storage for the next swap
  cpu::MaterializationContext context_;
  Slot slot_;
};

/// Registers eredu._native.ModelSlot and eredu._native.SlotVersion.
void bind_model_slot(pybind11::module_& m);

}  // namespace eredu::python
