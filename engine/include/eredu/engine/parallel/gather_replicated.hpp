#pragma once
/// \file
/// async_gather_replicated: the second half of a tensor-parallel load under
/// ReplicatedReads::gather (sharding.hpp) — each rank has read 1/N of dim 0 of every gathered
/// replicated tensor; the group all-gathers those rows into whole tensors, and the rank's
/// materialized unit, with the whole tensors in place of its rows, is bound to the module.
///
/// \code
///   engine::TensorParallelPlan plan = engine::plan_tensor_parallel(source->catalog(), rules, tp.rank(), tp.size(),
///                                                                  engine::ReplicatedReads::gather);
///   auto model = engine::PlanModule<cpu::Parameter>::from_tensor_parallel(plan);  // whole shapes
///   engine::MaterializedUnit<mpi::Backend> unit;  // stays empty where the read failed
///   try {
///     unit = co_await engine::async_materialize<mpi::Backend>(*source, plan.bindings, context, asio::use_awaitable);
///   } catch (...) { /* still gather: the group must learn that this rank failed */ }
///   co_await engine::async_gather_replicated<mpi::Backend>(io, arena, tp, plan, std::move(unit), model,
///                                                          asio::use_awaitable);
/// \endcode
///
/// Why a unit and not a bound module: a gathered tensor's slot declares its whole shape from
/// the start (ShardedTensor::local_shape), so nothing ever rebinds a parameter to another
/// shape; only the materialized weight, before binding, is this rank's rows.
///
/// Why a vote first: a rank whose read failed never reaches the gathers, and the others would
/// wait in their first all_gather until the group's timeout. Every rank, failed or not, first
/// says whether it holds its rows (one byte, VotingBackend::gather_ballots), so one rank's
/// failure fails every rank at once with the same typed error naming it.

#include <asio/any_io_executor.hpp>
#include <asio/async_result.hpp>
#include <asio/awaitable.hpp>
#include <asio/use_awaitable.hpp>
#include <chrono>
#include <concepts>
#include <cstddef>
#include <exception>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "eredu/core/collective_error.hpp"
#include "eredu/core/completion.hpp"
#include "eredu/core/detail/spawn_operation.hpp"
#include "eredu/engine/backend/parameter_backend.hpp"
#include "eredu/engine/description/parameterized.hpp"
#include "eredu/engine/orchestration/bind.hpp"
#include "eredu/engine/orchestration/materialized_unit.hpp"
#include "eredu/engine/parallel/group_vote.hpp"
#include "eredu/engine/parallel/sharding.hpp"

namespace eredu::engine {

/// The options of async_gather_replicated.
struct GatherReplicatedOptions {
  /// How long a rank waits for the others to say whether they hold their rows: they say it
  /// when their loads end, which may be minutes apart on slow storage.
  std::chrono::milliseconds timeout = std::chrono::minutes(10);
  std::string group = "tp";  ///< the group's name in messages
};

namespace detail {

/// The coroutine of async_gather_replicated (see there).
template <class B, class M>
asio::awaitable<void> gather_replicated(typename B::Executor* executor, typename B::Group* group,
                                        std::vector<std::string> gathered, MaterializedUnit<B> unit, M* module,
                                        GatherReplicatedOptions options) {
  using Tensor = typename B::Tensor;
  const int rank = B::group_rank(*group), size = B::group_size(*group);
  // 1. Every rank says whether it holds the rows of every gathered tensor.
  std::string missing;
  for (const std::string& parameter : gathered)
    if (!unit.contains(ParameterId(parameter))) {
      missing = parameter;
      break;
    }
  std::vector<std::byte> ballot{missing.empty() ? std::byte{1} : std::byte{0}};
  std::pair<std::shared_ptr<const std::vector<std::byte>>, Completion> vote =
      B::gather_ballots(*group, std::move(ballot), options.timeout);
  co_await vote.second.async_wait(asio::use_awaitable);
  const std::vector<std::byte>& ballots = *vote.first;
  std::vector<int> failed;
  for (int r = 0; r < size && static_cast<std::size_t>(r) < ballots.size(); ++r)
    if (ballots[static_cast<std::size_t>(r)] == std::byte{0}) failed.push_back(r);
  if (!failed.empty()) {
    CollectiveContext context{.operation = "gather_replicated",
                              .group = options.group,
                              .rank = rank,
                              .size = size,
                              .ranks = failed,
                              .failures = {},
                              .where = {.tensor = missing}};
    throw CollectiveError(errc::rank_failed, std::move(context),
                          fmt::format("rank {} of the group holds no rows to gather (its load failed){}: nothing is "
                                      "gathered or bound",
                                      rank_list(failed), missing.empty() ? "" : ", this rank none of this tensor's"));
  }
  // 2. Every gather, in plan order: the same order on every rank, as collectives require.
  typename MaterializedUnit<B>::Weights weights = std::move(unit).release();
  std::vector<std::pair<ParameterId, Tensor>> whole;
  std::vector<Completion> done;
  for (const std::string& parameter : gathered) {
    ParameterId id(parameter);
    std::pair<Tensor, Completion> started = B::all_gather(*executor, *group, weights.at(id));
    whole.emplace_back(std::move(id), std::move(started.first));
    done.push_back(std::move(started.second));
  }
  if (!done.empty()) {
    const Completion all = when_all(done);
    co_await all.async_wait(asio::use_awaitable);
  }
  // 3. The whole tensors in place of the rows, bound as one step (the module is unchanged on
  // any failure: bind_materialized_unit validates every slot first).
  for (auto& [id, tensor] : whole) weights.at(id) = std::move(tensor);
  bind_materialized_unit<B>(*module, MaterializedUnit<B>(std::move(weights)));
}

}  // namespace detail

/// All-gathers the rows of every gathered replicated tensor of `plan` across `group` and binds
/// `unit` — this rank's materialization of plan.bindings, with the whole tensors in place of
/// its rows — into `module` (see file comment). Call it on every rank of `group`, in the same
/// order as its other collectives, also where the materialization failed (with an empty
/// unit): the ranks first agree that each holds its rows.
///
/// @par Completion Signature
/// `void(std::exception_ptr)`. Errors: CollectiveError(rank_failed) on every rank when a rank
/// lacks the rows of a gathered tensor (its load failed; the message names the ranks, and on
/// that rank the tensor); CollectiveError(collective_error) when the agreement or a gather
/// fails or times out (the group is then unusable); what bind_materialized_unit throws (a
/// weight that does not fit its slot). On any failure `module` is unchanged.
///
/// @par Per-Operation Cancellation
/// none: a rank cannot withdraw from a collective (see async_all_gather); the timeouts bound
/// the waits instead.
///
/// `executor`, `group` and `module` must outlive the operation; the plan is read at once (the
/// names of its gathered tensors are kept) and the unit moved in. The coroutine runs on `io`;
/// the gathers run on `executor` (after its earlier work) and allocate their outputs where
/// B::all_gather does.
template <VotingBackend B, class M, asio::completion_token_for<void(std::exception_ptr)> Token>
requires ParameterBackend<B> && Parameterized<M, typename B::Parameter> &&
    std::same_as<typename B::Tensor, typename B::MaterializedWeight>
auto async_gather_replicated(asio::any_io_executor io, typename B::Executor& executor, typename B::Group& group,
                             const TensorParallelPlan& plan, MaterializedUnit<B> unit, M& module,
                             GatherReplicatedOptions options, Token&& token) {
  // Only the gathered tensors' parameters, in plan order (the same order on every rank).
  std::vector<std::string> gathered;
  for (const ShardedTensor& t : plan.tensors)
    if (t.gathered) gathered.push_back(t.parameter);
  return eredu::detail::spawn_operation(std::move(io),
                                        detail::gather_replicated<B>(&executor, &group, std::move(gathered),
                                                                     std::move(unit), &module, std::move(options)),
                                        std::forward<Token>(token));
}

/// async_gather_replicated with default options.
template <VotingBackend B, class M, asio::completion_token_for<void(std::exception_ptr)> Token>
requires ParameterBackend<B> && Parameterized<M, typename B::Parameter> &&
    std::same_as<typename B::Tensor, typename B::MaterializedWeight>
auto async_gather_replicated(asio::any_io_executor io, typename B::Executor& executor, typename B::Group& group,
                             const TensorParallelPlan& plan, MaterializedUnit<B> unit, M& module, Token&& token) {
  return async_gather_replicated<B>(std::move(io), executor, group, plan, std::move(unit), module,
                                    GatherReplicatedOptions{}, std::forward<Token>(token));
}

}  // namespace eredu::engine
