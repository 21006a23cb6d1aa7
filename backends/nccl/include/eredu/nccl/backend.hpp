#pragma once
/// \file
/// eredu::nccl::Backend: the CUDA backend with collectives over NCCL — cuda::Backend (device
/// tensors, streams as executors, materialization, transfer) plus the engine's
/// CollectiveBackend over nccl::Communicator groups. A separate library (eredu::nccl), so that
/// the CUDA backend itself never needs NCCL or MPI.
///
/// \code
///   nccl::Communicator tp = nccl::Communicator::create(mpi_tp, device);
///   cuda::Executor stream(device);
///   cuda::Tensor y = co_await engine::async_all_reduce<nccl::Backend>(stream, tp, partial, engine::ReduceOp::sum,
///                                                                     asio::use_awaitable);
/// \endcode
///
/// How a collective runs: it is enqueued on the executor (cuda::Executor::enqueue), so it
/// starts after the work submitted to the executor before it — on the device, or once held
/// predecessors have completed — and later work on the stream runs after it (stream semantics,
/// NCCL's own). The NCCL call itself (ncclAllReduce in place, ncclAllGather into a new output
/// or, for all_gather_into, the caller's, or one ncclSend/ncclRecv per peer in an
/// ncclGroupStart/End group) is queued on the stream; its completion is the stream completion
/// after it (a stream callback relayed off CUDA's thread, stream_completion.hpp). A watchdog
/// fails the completion with CollectiveError naming the operation, the group, the rank and the
/// size when the collective has not completed within the group's timeout, and aborts the
/// communicator (its kernels then end; it is unusable). The NCCL call itself may keep the
/// submitting thread while NCCL connects to the peers (it does so lazily, at a communicator's
/// first collective), never longer than the timeout.
///
/// Dtypes: all_reduce reduces F32, F16, BF16, F64, I8, U8, I32, U32, I64 and U64 (NCCL's
/// types; sum, min, max) and refuses every other dtype with Error(invalid_argument) before
/// anything starts; all_gather and all_to_all move bytes, so every dtype. The tensor, the
/// executor and the group must be on the same device (Error(invalid_argument) otherwise).
/// Results come from cuda::Backend::default_memory(device), on the executor's stream.

#include <utility>

#include "eredu/core/completion.hpp"
#include "eredu/cuda/backend.hpp"
#include "eredu/cuda/tensor.hpp"
#include "eredu/engine/backend/collective_backend.hpp"
#include "eredu/nccl/communicator.hpp"

namespace eredu::nccl {

/// cuda::Backend with collectives over NCCL (see file comment).
struct Backend : cuda::Backend {
  using Group = Communicator;   ///< an NCCL communicator
  using Tensor = cuda::Tensor;  ///< what collectives move

  /// Reduces `tensor` across `group` in place (the result is `tensor`'s storage). Throws
  /// Error(invalid_argument) for a dtype NCCL cannot reduce, an empty group, or a tensor,
  /// executor and group on different devices; every other failure fails the completion
  /// (CollectiveError).
  static std::pair<Tensor, Completion> all_reduce(Executor& executor, Group& group, Tensor tensor, engine::ReduceOp op);
  /// Gathers `tensor` from every rank into a new tensor [size * n, ...]. Throws as all_reduce
  /// (any dtype), BackendError(out_of_memory) when the result cannot be allocated.
  static std::pair<Tensor, Completion> all_gather(Executor& executor, Group& group, Tensor tensor);
  /// Gathers `tensor` from every rank into `output` ([size * n, ...], `tensor`'s dtype, on the
  /// group's device), which a caller recycles across steps instead of a new tensor per call.
  /// `tensor` may be exactly this rank's block of `output` (NCCL's in-place form). Throws as
  /// all_gather, and Error(invalid_argument) for an output of another shape, dtype or device,
  /// or one sharing storage with `tensor` otherwise.
  static Completion all_gather_into(Executor& executor, Group& group, Tensor tensor, Tensor output);
  /// Exchanges the `size` blocks of dim 0 of `tensor` into a new tensor of the same shape.
  /// Throws as all_gather, and Error(invalid_argument) when dim 0 is not a multiple of the
  /// group's size.
  static std::pair<Tensor, Completion> all_to_all(Executor& executor, Group& group, Tensor tensor);
  /// This rank in `group`.
  static int group_rank(const Group& group) noexcept { return group.rank(); }
  /// Ranks in `group`.
  static int group_size(const Group& group) noexcept { return group.size(); }
};

static_assert(engine::GatherIntoBackend<Backend>);

}  // namespace eredu::nccl
