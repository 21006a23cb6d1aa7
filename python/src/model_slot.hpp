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
/// The canary is Python code that must not run on the loop thread: the swap's canary step
/// queues it to the operation's consumer (the asyncio loop that awaits the swap, or the
/// blocked caller) and awaits its verdict, so the loop keeps serving reads meanwhile.

#include <pybind11/pybind11.h>

#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "checkpoint.hpp"
#include "eredu/cpu/backend.hpp"
#include "eredu/engine/serving/model_slot.hpp"
#include "operation.hpp"
#include "py_handle.hpp"
#include "tensor_set.hpp"
#ifdef EREDU_PYTHON_LIVE
#include "live.hpp"
#endif

namespace eredu::python {

/// What a swap reads from (model_slot.cpp).
template <class Source>
struct SwapInput;

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

 private:
  /// The swap itself, for any source `open()` gives on the loop thread (model_slot.cpp).
  template <class Source>
  std::shared_ptr<Operation> start_swap(std::function<SwapInput<Source>()> open,
                                        std::optional<std::vector<ReadSpec>> specs, const pybind11::object& canary_job,
                                        bool blocking, std::string origin, const std::string& what);

  std::unique_ptr<cpu::Executor> background_;
  cpu::StoragePool storage_;  // keeps the retired version's storage for the next swap
  cpu::MaterializationContext context_;
  std::shared_ptr<const TensorSetModule> blueprint_;  // loop thread only
  Slot slot_;
  /// The published version each recent generation was loaded from (loop thread only): a
  /// delta against it reads only what changed.
  std::map<std::uint64_t, std::string> published_;
};

/// Registers eredu._native.ModelSlot and eredu._native.SlotVersion.
void bind_model_slot(pybind11::module_& m);

}  // namespace eredu::python
