#pragma once
/// \file
/// eredu::cpu::Backend: the oneTBB CPU backend, realising the engine's ParameterBackend,
/// SubmissionBackend and TransferBackend concepts.
///
/// How a weight reaches its tensor is decided above the backend, by the engine's placement
/// planner (engine/orchestration/placement.hpp) from the source's capabilities and
/// buffer_traits; the backend executes the landing decided, reaching the source through
/// io::ByteSource alone:
///  * checkpoint dtype kept, no recipe: the tensor's storage is allocated (recycled from the
///    StoragePool when possible, otherwise populated on all cores of the executor's arena)
///    and the reader writes the selected bytes straight into it — one copy from the page
///    cache, no staging lease, no second copy;
///  * a cast: the tensor is read in bounded chunk leases; each chunk is converted on the
///    arena while the next one is read, and each lease is released as soon as its
///    conversion has completed;
///  * other recipes: sources read straight into their place where the layout allows it
///    (a concat along the outermost dim, a reshape, a slice folded into the read's
///    selection), otherwise into temporary tensors, then sliced, concatenated or transposed
///    on the arena.
/// Every step runs as a coroutine on the source's Asio executor; TBB work is awaited as an
/// eredu::Completion, so no coroutine ever resumes inside a TBB worker.

#include <memory>
#include <stop_token>
#include <utility>
#include <vector>

#include "eredu/core/completion.hpp"
#include "eredu/cpu/executor.hpp"
#include "eredu/cpu/host_buffer.hpp"
#include "eredu/cpu/materialization.hpp"
#include "eredu/cpu/materialization_context.hpp"
#include "eredu/cpu/parameter.hpp"
#include "eredu/cpu/tensor.hpp"
#include "eredu/engine/backend/backend_glue.hpp"
#include "eredu/engine/description/recipe.hpp"
#include "eredu/engine/orchestration/placement.hpp"
#include "eredu/io/integrity/checksums.hpp"
#include "eredu/io/reading/byte_source.hpp"
#include "eredu/io/reading/checkpoint_source.hpp"

namespace eredu::cpu {

/// The CPU backend's types and operations (see file comment). Besides the concepts above it
/// is an engine::VerifyingBackend: dtype-kept tensors hold the stored bytes and are hashed in
/// place on the arena. Stateless: state lives in
/// the MaterializationContext, the Executor and the StoragePool.
struct Backend : engine::BackendGlue<Tensor, Executor> {
  using MaterializationContext = cpu::MaterializationContext;  ///< executor + storage pool
  using Executor = cpu::Executor;                              ///< a TBB arena
  using HostBuffer = cpu::HostBuffer;                          ///< a parked weight

  /// What tensor storage (StorageBlock) offers the placement planner: host memory the source
  /// reads into, 64-byte aligned, that can adopt a file mapping (mapped weights) and be laid
  /// out as a direct window (StoragePool::allocate_window).
  /// A weight's storage block holds what its release needs (the pool's state, or its
  /// mapping): a cancelled unit's weights may be freed after its caller was told
  /// (engine::detail::ReleasesLate).
  static constexpr bool weights_release_alone = true;
  static constexpr engine::BufferTraits buffer_traits{
      .host = true, .alignment = 64, .adopts_mappings = true, .reads_into = true, .lays_out_windows = true};

  // --- ParameterBackend ---

  /// Starts reading `request` (checkpoint dtype kept) straight into a new tensor, from any
  /// io::ByteSource, placed as engine::plan_placement decides for buffer_traits. Throws at
  /// once for an unknown tensor, a bad selection, or an allocation failure.
  template <io::ByteSource S>
  static Materialization materialize(S& source, const io::TensorReadRequest& request, MaterializationContext& context,
                                     std::stop_token stop);
  /// Starts executing a recipe into a new tensor, from any io::ByteSource. Throws
  /// RecipeError at once if it does not infer against the source's catalog.
  template <io::ByteSource S>
  static Materialization materialize_recipe(S& source, const engine::DerivedWeightRecipe& recipe,
                                            MaterializationContext& context, std::stop_token stop);
  /// Throws BackendError(bind_dtype_mismatch / bind_shape_mismatch) naming both sides
  /// (engine::check_bind_fits); a mapped weight's file is re-checked: a rewritten one throws
  /// file_changed, a replaced one is logged once (its bytes stay those of the opened file).
  static void validate_bind(const Parameter& parameter, const Tensor& weight);

  // --- ReservingBackend ---

  /// Maps the address space of `bytes` of fresh tensor storage in one call
  /// (StoragePool::reserve), when weights are copied; does nothing for mapped weights.
  static void reserve_storage(MaterializationContext& context, std::uint64_t bytes) noexcept;

  // --- VerifyingBackend ---

  /// Hashes `weight` (a complete tensor read whole with its dtype kept, so its bytes are the
  /// stored ones) on `context.executor` and compares the digest with `check`: the completion
  /// fails with Error(checksum_mismatch) naming file, tensor and offset when they differ.
  static Completion verify_weight(MaterializationContext& context, const Tensor& weight, io::DigestCheck check);

  // --- InPlaceBackend ---

  /// Copies `weight` into the storage already bound to `slot` (parallel on `executor`),
  /// keeping the slot's address. Throws BackendError at once when the slot is unbound or
  /// its bound tensor differs from `weight` in dtype, shape or size; `weight` is retained
  /// until the copy completes, and the slot must not be read before then.
  static Completion overwrite(Executor& executor, Parameter& slot, const Tensor& weight);

  // --- PatchingBackend ---

  /// The bytes of the tensor bound to `slot`, to compare and write in place. Throws
  /// BackendError when the slot is unbound or its tensor is mapped read-only from its file.
  static std::span<std::byte> writable_bytes(Parameter& slot);
  /// Runs `work` on `executor` (a task of its arena).
  static Completion submit_host_work(Executor& executor, UniqueFunction<void()> work) {
    return executor.submit(std::move(work));
  }

  // --- SubmissionBackend: engine::BackendGlue's (fork_executors, submit, order_after,
  // retain_until_complete), forwarded to the Executor. CPU tensors are written eagerly, so
  // submitting values is a fence. ---

  // --- TransferBackend ---

  /// Copies a parked weight back into pooled tensor storage on `executor` (parallel).
  /// The tensor must not be read before the completion.
  static std::pair<Tensor, Completion> promote(Executor& executor, const HostBuffer& host, StoragePool& storage);
  /// promote() into a process-wide default pool.
  static std::pair<Tensor, Completion> promote(Executor& executor, const HostBuffer& host);
  /// Copies a weight into a compact host buffer on `executor` (parallel); the weight's
  /// storage is retained until the copy completes.
  static std::pair<HostBuffer, Completion> demote(Executor& executor, const Tensor& weight);

  /// The pool used by the two-argument promote().
  static StoragePool& default_storage();
};

// Compiled once, in backend.cpp, for the local-file source; other sources instantiate the
// steps (detail/materialize_steps.hpp) where they are used.
extern template Materialization Backend::materialize(io::CheckpointSource&, const io::TensorReadRequest&,
                                                     MaterializationContext&, std::stop_token);
extern template Materialization Backend::materialize_recipe(io::CheckpointSource&, const engine::DerivedWeightRecipe&,
                                                            MaterializationContext&, std::stop_token);

}  // namespace eredu::cpu

#include "eredu/cpu/detail/materialize_steps.hpp"
