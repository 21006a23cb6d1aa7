#pragma once
/// \file
/// eredu::mpi::Backend: the CPU backend with collectives over MPI — cpu::Backend (oneTBB
/// tensors, arenas, materialization) plus the engine's CollectiveBackend over
/// mpi::Communicator groups. A separate library (eredu::mpi), so that the CPU backend itself
/// never needs MPI.
///
/// \code
///   mpi::Environment env(argc, argv);
///   mpi::Communicator tp = mpi::Communicator::world(env);
///   cpu::Executor arena(2);
///   cpu::Tensor y = co_await engine::async_all_reduce<mpi::Backend>(arena, tp, partial, engine::ReduceOp::sum,
///                                                                   asio::use_awaitable);
/// \endcode
///
/// How a collective runs: it is queued on the communicator's progress thread with the
/// arena's fence (everything submitted to the arena so far) as its precondition; once that
/// work has completed the thread starts MPI_Iallreduce / MPI_Iallgather / MPI_Ialltoall and
/// polls it with MPI_Testsome, so no thread waits in MPI; later work on the arena is ordered
/// after the collective (stream semantics). Tensors of more than 2^30 elements are reduced as
/// several requests of at most 2^30, and gathers of more than INT_MAX bytes per rank use a
/// larger MPI datatype, since MPI counts are ints.
///
/// all_gather_into writes a caller's output instead of allocating one (a gather per step can
/// recycle it); all_gather is a fresh output and the same path.
///
/// Dtypes: all_gather and all_to_all move bytes, so every dtype; all_reduce reduces F64, F32,
/// BF16 and F16 (user-defined MPI operations: each step adds in f32 and rounds to nearest
/// even, as NCCL does; min and max return one of the inputs exactly), every integer type, BOOL
/// with min ("all") and max ("any"), and C64 with sum; anything else is Error(invalid_argument).

#include <chrono>
#include <cstddef>
#include <memory>
#include <utility>
#include <vector>

#include "eredu/core/completion.hpp"
#include "eredu/cpu/backend.hpp"
#include "eredu/cpu/tensor.hpp"
#include "eredu/engine/backend/collective_backend.hpp"
#include "eredu/engine/parallel/group_vote.hpp"
#include "eredu/mpi/communicator.hpp"

namespace eredu::mpi {

/// cpu::Backend with collectives over MPI (see file comment).
struct Backend : cpu::Backend {
  using Group = Communicator;  ///< an MPI communicator
  using Tensor = cpu::Tensor;  ///< what collectives move

  /// Reduces `tensor` across `group` in place (MPI_IN_PLACE): the result is `tensor`'s storage.
  /// Throws Error(invalid_argument) for a dtype MPI cannot reduce with `op`, or an empty
  /// group; every other failure fails the completion (CollectiveError).
  static std::pair<Tensor, Completion> all_reduce(Executor& executor, Group& group, Tensor tensor, engine::ReduceOp op);
  /// Gathers `tensor` from every rank into a new tensor [size * n, ...] (from
  /// cpu::Backend::default_storage()). Throws Error(invalid_argument) for an empty group or a
  /// tensor of more than 2^31 - 1 MiB per rank.
  static std::pair<Tensor, Completion> all_gather(Executor& executor, Group& group, Tensor tensor);
  /// Gathers `tensor` from every rank into `output` ([size * n, ...], `tensor`'s dtype), which
  /// a caller recycles across steps instead of a new tensor per call. `tensor` may be exactly
  /// this rank's block of `output` (MPI_IN_PLACE). Throws Error(invalid_argument) as all_gather,
  /// and for an output of another shape or dtype or one sharing storage with `tensor` otherwise.
  static Completion all_gather_into(Executor& executor, Group& group, Tensor tensor, Tensor output);
  /// Exchanges the `size` blocks of dim 0 of `tensor` into a new tensor of the same shape.
  /// Throws Error(invalid_argument) when dim 0 is not a multiple of the group's size.
  static std::pair<Tensor, Completion> all_to_all(Executor& executor, Group& group, Tensor tensor);
  /// Every rank's ballot bytes, for a group vote: Communicator::all_gather_bytes, patient
  /// (the progress thread sleeps between polls while ranks are still loading) and waiting at
  /// most `timeout`.
  static std::pair<std::shared_ptr<const std::vector<std::byte>>, Completion> gather_ballots(
      Group& group, std::vector<std::byte> bytes, std::chrono::milliseconds timeout) {
    return group.all_gather_bytes(std::move(bytes), timeout, true);
  }
  /// This rank in `group`.
  static int group_rank(const Group& group) noexcept { return group.rank(); }
  /// Ranks in `group`.
  static int group_size(const Group& group) noexcept { return group.size(); }
};

static_assert(engine::VotingBackend<Backend>);
static_assert(engine::GatherIntoBackend<Backend>);

}  // namespace eredu::mpi
