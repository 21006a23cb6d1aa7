#pragma once
/// \file
/// The CollectiveBackend concept (the seed's `CollectiveBackend`, backend.rs): all_reduce,
/// all_gather and all_to_all of a backend tensor over a backend-native group, submitted on a
/// backend executor and completing as the same eredu::Completion every other operation uses;
/// and the Asio initiating functions on top of it, which are what applications call:
///
/// \code
///   // every rank of `tp`, in the same order (MPI's and NCCL's rule for collectives)
///   cpu::Tensor partial = row_parallel_matmul(x, w_local);
///   cpu::Tensor y = co_await engine::async_all_reduce<mpi::Backend>(arena, tp, partial, engine::ReduceOp::sum,
///                                                                   asio::use_awaitable);
/// \endcode
///
/// Differences from the seed, and why:
///  * The operations return at once with the result tensor and the Completion of the
///    collective (as TransferBackend's promote/demote do), instead of blocking: the result must
///    not be read before the completion, and the backend retains input and output until then.
///  * all_reduce takes the reduction (sum, min, max); the seed leaves it implicit.
///  * Ordering is the executor's: a collective starts after the work already submitted to
///    `executor` (its fence), and work submitted to `executor` afterwards starts after the
///    collective — stream semantics, what NCCL on a CUDA stream does natively.
///  * A group is a backend-native handle (an MPI communicator, an NCCL communicator); its rank
///    and size are queried through the backend so that the engine needs no backend header.
///
/// Shapes: all_reduce keeps the shape; all_gather concatenates the group's tensors along dim 0
/// in rank order ([n, ...] becomes [size * n, ...]); all_to_all splits dim 0 into `size` equal
/// blocks, sends block j to rank j and returns the blocks received, in rank order, with the
/// input's shape. Every rank passes the same dtype and shape (what MPI and NCCL require).
///
/// GatherIntoBackend adds all_gather_into, the gather into a tensor the caller owns: a step
/// that gathers every iteration recycles one output instead of paying a new, first-touched
/// one per call (what made all_gather 0.19-0.86x of a plain MPI_Allgather loop,
/// docs/performance.md).

#include <asio/async_result.hpp>
#include <asio/system_executor.hpp>
#include <concepts>
#include <exception>
#include <utility>

#include "eredu/core/completion.hpp"
#include "eredu/core/detail/handler_delivery.hpp"
#include "eredu/engine/backend/submission_backend.hpp"

namespace eredu::engine {

/// The reduction of an all_reduce.
enum class ReduceOp {
  sum,  ///< elementwise sum (floating point: in the reduction order the backend chooses)
  min,  ///< elementwise minimum
  max,  ///< elementwise maximum
};

/// "sum", "min" or "max", for messages.
constexpr const char* reduce_op_name(ReduceOp op) noexcept {
  switch (op) {
    case ReduceOp::sum:
      return "sum";
    case ReduceOp::min:
      return "min";
    case ReduceOp::max:
      return "max";
  }
  return "unknown";
}

/// A backend with collectives over groups of ranks (see file comment).
///
/// - `B::Group`: a backend-native group (communicator);
/// - `B::Tensor`: the tensor type collectives move (the backend's materialized weight);
/// - `B::all_reduce(ex, group, t, op)`, `B::all_gather(ex, group, t)`,
///   `B::all_to_all(ex, group, t)`: start the collective after the work submitted to `ex`,
///   return the result tensor and the collective's Completion; throw at once (a typed
///   eredu::Error) for a dtype or shape the collective cannot take;
/// - `B::group_rank(group)`, `B::group_size(group)`: this rank and the number of ranks.
template <class B>
concept CollectiveBackend = SubmissionBackend<B> && requires {
  typename B::Group;
  typename B::Tensor;
} && requires(typename B::Executor& executor, typename B::Group& group, const typename B::Group& const_group,
              typename B::Tensor tensor, ReduceOp op) {
  { B::all_reduce(executor, group, tensor, op) } -> std::same_as<std::pair<typename B::Tensor, Completion>>;
  { B::all_gather(executor, group, tensor) } -> std::same_as<std::pair<typename B::Tensor, Completion>>;
  { B::all_to_all(executor, group, tensor) } -> std::same_as<std::pair<typename B::Tensor, Completion>>;
  { B::group_rank(const_group) } -> std::same_as<int>;
  { B::group_size(const_group) } -> std::same_as<int>;
};

/// A CollectiveBackend that also gathers into a caller's tensor.
///
/// - `B::all_gather_into(ex, group, t, output)`: as all_gather, but the result is written into
///   `output`, a tensor of the gathered shape [size * n, ...] and `t`'s dtype; returns the
///   collective's Completion, after which `output` holds the gather. Throws
///   Error(invalid_argument) at once for an output of another shape or dtype, or one that
///   shares storage with `t` unless `t` is exactly this rank's block of it (the in-place form).
template <class B>
concept GatherIntoBackend = CollectiveBackend<B> && requires(typename B::Executor& executor, typename B::Group& group,
                                                             typename B::Tensor tensor, typename B::Tensor output) {
  { B::all_gather_into(executor, group, tensor, output) } -> std::same_as<Completion>;
};

namespace detail {

/// Completes `handler` with (error, tensor) on its own executor once `started`'s completion
/// fires; the tensor is delivered only on success. Used by the initiating functions below.
template <class Tensor, class Handler>
void deliver_collective(Handler handler, std::pair<Tensor, Completion> started) {
  auto deliver = eredu::detail::deliver_on_handler_executor<std::exception_ptr, Tensor>(std::move(handler),
                                                                                        asio::system_executor());
  const Completion done = started.second;
  done.on_complete([deliver = std::move(deliver), out = std::move(started.first)](std::exception_ptr error) mutable {
    if (error)
      deliver(std::move(error), Tensor{});
    else
      deliver(nullptr, std::move(out));
  });
}

/// Completes `handler` with `error` and an empty tensor, on its own executor.
template <class Tensor, class Handler>
void deliver_collective_error(Handler handler, std::exception_ptr error) {
  eredu::detail::deliver_on_handler_executor<std::exception_ptr, Tensor>(std::move(handler), asio::system_executor())(
      std::move(error), Tensor{});
}

/// Starts a collective with `start()` (returning the result tensor and its Completion) and
/// completes `handler` with its outcome; a throw from `start` (a refusal before anything
/// started) completes it with that error. The body of every initiating function below.
template <class Tensor, class Handler, class Start>
void start_collective(Handler handler, Start start) {
  std::pair<Tensor, Completion> started;
  try {
    started = start();
  } catch (...) {
    deliver_collective_error<Tensor>(std::move(handler), std::current_exception());
    return;
  }
  deliver_collective(std::move(handler), std::move(started));
}

}  // namespace detail

/// Reduces `tensor` elementwise across `group` with `op`; every rank receives the result.
///
/// The reduction happens in place where the backend allows it (MPI_IN_PLACE, NCCL's in-place
/// form): the result may share the input's storage, whose bytes are then overwritten — pass a
/// copy to keep the input. The dtypes a backend reduces are in its documentation
/// (docs/distributed.md).
///
/// @par Completion Signature
/// `void(std::exception_ptr, typename B::Tensor)`: the reduced tensor on success (empty on
/// failure). Errors: CollectiveError(collective_error) — the collective failed, did not finish
/// within the group's timeout (a rank died or stalled: the message names the ranks known to be
/// gone), or the group is unusable after an earlier failure; Error(invalid_argument) for a
/// dtype the backend does not reduce; the failure of the work the collective was ordered after.
/// After a failure the tensor's bytes are undefined and, after a timeout, may still be written
/// by the transport: drop every handle to it.
///
/// @par Per-Operation Cancellation
/// none: MPI and NCCL cannot withdraw a rank from a collective; the group's timeout bounds the
/// wait instead.
///
/// `executor` and `group` must outlive the operation; the tensor is retained by it.
template <CollectiveBackend B, asio::completion_token_for<void(std::exception_ptr, typename B::Tensor)> Token>
auto async_all_reduce(typename B::Executor& executor, typename B::Group& group, typename B::Tensor tensor, ReduceOp op,
                      Token&& token) {
  using Tensor = typename B::Tensor;
  return asio::async_initiate<Token, void(std::exception_ptr, Tensor)>(
      [](auto handler, typename B::Executor* ex, typename B::Group* g, Tensor t, ReduceOp o) {
        detail::start_collective<Tensor>(std::move(handler), [&] { return B::all_reduce(*ex, *g, std::move(t), o); });
      },
      token, &executor, &group, std::move(tensor), op);
}

/// Gathers `tensor` from every rank of `group`, concatenated along dim 0 in rank order.
///
/// @par Completion Signature
/// `void(std::exception_ptr, typename B::Tensor)`: a new tensor of shape
/// [size * n, ...] for an input [n, ...] (a scalar input counts as [1]). Errors: as
/// async_all_reduce, and Error(invalid_argument) for a tensor that is not whole bytes.
///
/// @par Per-Operation Cancellation
/// none (see async_all_reduce).
///
/// `executor` and `group` must outlive the operation; the tensor is retained by it.
template <CollectiveBackend B, asio::completion_token_for<void(std::exception_ptr, typename B::Tensor)> Token>
auto async_all_gather(typename B::Executor& executor, typename B::Group& group, typename B::Tensor tensor,
                      Token&& token) {
  using Tensor = typename B::Tensor;
  return asio::async_initiate<Token, void(std::exception_ptr, Tensor)>(
      [](auto handler, typename B::Executor* ex, typename B::Group* g, Tensor t) {
        detail::start_collective<Tensor>(std::move(handler), [&] { return B::all_gather(*ex, *g, std::move(t)); });
      },
      token, &executor, &group, std::move(tensor));
}

/// Gathers `tensor` from every rank of `group` into `output`, concatenated along dim 0 in rank order.
///
/// What async_all_gather does, without its new output per call: `output` (the gathered shape
/// [size * n, ...], `tensor`'s dtype) is written by the collective, so a loop that gathers
/// every step can recycle one. `tensor` may be exactly this rank's block of `output` (rows
/// [rank * n, (rank + 1) * n)), the in-place gather; any other sharing of storage is refused.
///
/// @par Completion Signature
/// `void(std::exception_ptr, typename B::Tensor)`: `output` on success (empty on failure).
/// Errors: as async_all_gather, and Error(invalid_argument), before anything starts, for an
/// output of another shape or dtype, or one that shares storage with `tensor` otherwise (the
/// message names both). After a failure `output`'s bytes are undefined (see async_all_reduce).
///
/// @par Per-Operation Cancellation
/// none (see async_all_reduce).
///
/// `executor` and `group` must outlive the operation; both tensors are retained by it.
template <GatherIntoBackend B, asio::completion_token_for<void(std::exception_ptr, typename B::Tensor)> Token>
auto async_all_gather_into(typename B::Executor& executor, typename B::Group& group, typename B::Tensor tensor,
                           typename B::Tensor output, Token&& token) {
  using Tensor = typename B::Tensor;
  return asio::async_initiate<Token, void(std::exception_ptr, Tensor)>(
      [](auto handler, typename B::Executor* ex, typename B::Group* g, Tensor t, Tensor out) {
        detail::start_collective<Tensor>(std::move(handler), [&] {
          Completion done = B::all_gather_into(*ex, *g, std::move(t), out);
          return std::pair<Tensor, Completion>(std::move(out), std::move(done));
        });
      },
      token, &executor, &group, std::move(tensor), std::move(output));
}

/// Exchanges blocks of `tensor` across `group`: dim 0 is split into `size` equal blocks,
/// block j goes to rank j, and the result holds the blocks received, in rank order.
///
/// @par Completion Signature
/// `void(std::exception_ptr, typename B::Tensor)`: a new tensor with the input's shape.
/// Errors: as async_all_reduce, and Error(invalid_argument) when dim 0 is not a multiple of
/// the group's size.
///
/// @par Per-Operation Cancellation
/// none (see async_all_reduce).
///
/// `executor` and `group` must outlive the operation; the tensor is retained by it.
template <CollectiveBackend B, asio::completion_token_for<void(std::exception_ptr, typename B::Tensor)> Token>
auto async_all_to_all(typename B::Executor& executor, typename B::Group& group, typename B::Tensor tensor,
                      Token&& token) {
  using Tensor = typename B::Tensor;
  return asio::async_initiate<Token, void(std::exception_ptr, Tensor)>(
      [](auto handler, typename B::Executor* ex, typename B::Group* g, Tensor t) {
        detail::start_collective<Tensor>(std::move(handler), [&] { return B::all_to_all(*ex, *g, std::move(t)); });
      },
      token, &executor, &group, std::move(tensor));
}

}  // namespace eredu::engine
