#pragma once
/// \file
/// eredu::cuda::Backend: the CUDA backend, realising the engine's ParameterBackend,
/// SubmissionBackend and TransferBackend concepts with weights in device memory.
///
/// How a weight reaches the device:
///  * the destination is allocated up front from the context's stream-ordered pool
///    (cudaMallocFromPoolAsync on the executor's stream), so running out of device memory
///    fails at once, before any read;
///  * the selected bytes are read as a stream of bounded chunk leases; each chunk is copied
///    host-to-device with cudaMemcpyAsync straight from the lease pool's memory (page-locked
///    with pin_staging, so the copy is a DMA with no extra host copy) while the next chunk is
///    read; each lease is retained until the completion of *its* copy and released by it —
///    never earlier, so the pool cannot hand the bytes to another read under a running copy;
///  * recipes: a cast reads its source into a temporary device buffer and converts it with a
///    kernel; slices of a source narrow the read; a concat along the outermost dim uploads
///    each input into its place; other slices, concats and permutations run layout kernels
///    on temporaries. Temporaries are freed stream-ordered right after the kernels that read them.
/// Every step runs as a coroutine on the source's Asio executor; stream work is awaited as an
/// eredu::Completion (stream_completion.hpp), so no coroutine resumes on a CUDA thread.
///
/// Errors: every CUDA call is checked; a failure is a BackendError naming the call, the CUDA
/// error and the tensor (out_of_memory for allocation failures, backend_failure otherwise).

#include <memory>
#include <stop_token>
#include <utility>
#include <vector>

#include "eredu/core/completion.hpp"
#include "eredu/cuda/device_memory_pool.hpp"
#include "eredu/cuda/executor.hpp"
#include "eredu/cuda/host_buffer.hpp"
#include "eredu/cuda/materialization.hpp"
#include "eredu/cuda/materialization_context.hpp"
#include "eredu/cuda/parameter.hpp"
#include "eredu/cuda/tensor.hpp"
#include "eredu/engine/backend/backend_glue.hpp"
#include "eredu/engine/description/recipe.hpp"
#include "eredu/engine/orchestration/placement.hpp"
#include "eredu/io/reading/byte_source.hpp"
#include "eredu/io/reading/checkpoint_source.hpp"

namespace eredu::cuda {

/// The CUDA backend's types and operations (see file comment). Stateless: state lives in
/// the MaterializationContext, the Executor (stream) and the DeviceMemoryPool.
struct Backend : engine::BackendGlue<Tensor, Executor> {
  using MaterializationContext = cuda::MaterializationContext;  ///< stream + device pool + pinned staging
  using Executor = cuda::Executor;                              ///< a CUDA stream
  using HostBuffer = cuda::HostBuffer;                          ///< a weight parked in pinned host memory

  /// What device tensors offer the placement planner: device memory, 256-byte aligned
  /// (cudaMalloc), that no source reads into and no mapping becomes: every weight lands
  /// as a stream of chunk leases copied to the device.
  static constexpr engine::BufferTraits buffer_traits{.host = false, .alignment = 256};

  // --- ParameterBackend ---

  /// Starts uploading `request` (checkpoint dtype kept) into a new device tensor. Throws at
  /// once for an unknown tensor, a bad selection, or a device allocation failure
  /// (BackendError(out_of_memory) naming the tensor).
  template <io::ByteSource S>
  static Materialization materialize(S& source, const io::TensorReadRequest& request, MaterializationContext& context,
                                     std::stop_token stop);
  /// Starts executing a recipe into a new device tensor. Throws RecipeError at once if it does
  /// not infer against the source's catalog, BackendError when the output cannot be allocated.
  template <io::ByteSource S>
  static Materialization materialize_recipe(S& source, const engine::DerivedWeightRecipe& recipe,
                                            MaterializationContext& context, std::stop_token stop);

  // --- SubmissionBackend: engine::BackendGlue's (fork_executors, submit, order_after,
  // retain_until_complete), forwarded to the Executor ---

  // --- TransferBackend ---

  /// Copies a parked weight from pinned host memory into new device memory from `memory`, on
  /// `executor`'s stream. The tensor must not be read before the completion; the host buffer
  /// is retained until then.
  static std::pair<Tensor, Completion> promote(Executor& executor, const HostBuffer& host, DeviceMemoryPool& memory);
  /// promote() into default_memory(executor.device()).
  static std::pair<Tensor, Completion> promote(Executor& executor, const HostBuffer& host);
  /// Copies a weight into a new pinned host buffer on `executor`'s stream; the weight's
  /// storage is retained until the copy completes. The weight must already be complete, or
  /// written on a stream `executor` is ordered after.
  static std::pair<HostBuffer, Completion> demote(Executor& executor, const Tensor& weight);

  /// A process-wide pool on `device`, used by the two-argument promote().
  static DeviceMemoryPool& default_memory(int device);
};

// Compiled once, in backend.cpp, for the local-file source; other sources instantiate the
// steps (detail/materialize_steps.hpp) where they are used.
extern template Materialization Backend::materialize(io::CheckpointSource&, const io::TensorReadRequest&,
                                                     MaterializationContext&, std::stop_token);
extern template Materialization Backend::materialize_recipe(io::CheckpointSource&, const engine::DerivedWeightRecipe&,
                                                            MaterializationContext&, std::stop_token);

}  // namespace eredu::cuda

#include "eredu/cuda/detail/materialize_steps.hpp"
