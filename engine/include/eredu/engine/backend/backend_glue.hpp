#pragma once
/// \file
/// engine::BackendGlue: the part of a backend that is the same in every backend, written
/// once. A backend derives from BackendGlue<Weight, Executor> and adds what is its own: its
/// buffer_traits, materialize / materialize_recipe (the landings the placement planner
/// chose, executed with its kernels), and the optional capabilities of
/// backend_requirements.hpp (verify_weight, overwrite, promote / demote). From the glue it
/// gets its parameter slot and in-flight realization types, the ParameterBackend roles that
/// only move a weight between them (completion, finish, share, validate_bind, bind), and the
/// SubmissionBackend roles that forward to its executor (fork, fence, ordering, retention).
/// A backend whose binding checks more (the CPU backend re-checks a mapped weight's file)
/// hides validate_bind with its own, which calls check_bind_fits first.

#include <asio/any_io_executor.hpp>
#include <asio/awaitable.hpp>
#include <asio/co_spawn.hpp>
#include <cstddef>
#include <exception>
#include <memory>
#include <utility>
#include <vector>

#include "eredu/core/completion.hpp"
#include "eredu/core/dtype.hpp"
#include "eredu/core/shape.hpp"

namespace eredu::engine {

/// A module's parameter slot: declared with the dtype and shape it accepts; `value` is empty
/// until a weight is bound.
template <class Weight>
struct BasicParameter {
  DType dtype{};   ///< the dtype a bound weight must have
  Shape shape{};   ///< the shape a bound weight must have
  Weight value{};  ///< the bound weight (empty before the first bind)

  /// A slot for a `d` weight of shape `s`.
  BasicParameter(DType d, Shape s) : dtype(d), shape(std::move(s)) {}
  BasicParameter() = default;
  /// True once a weight is bound.
  bool bound() const noexcept { return static_cast<bool>(value); }
};

/// One weight being realized: the destination, allocated up front, and the completion of
/// the work writing it (which holds what that work reads, such as leases, until then). Read
/// `weight` only once `done` has completed successfully.
template <class Weight>
struct BasicMaterialization {
  Weight weight{};    ///< the destination
  Completion done{};  ///< completes when every byte of `weight` is written and every lease released
};

/// Throws BackendError(bind_dtype_mismatch / bind_shape_mismatch), naming both sides, when a
/// `dtype` weight of `shape` does not fit a slot declared `slot_dtype` / `slot_shape`.
void check_bind_fits(DType slot_dtype, const Shape& slot_shape, DType dtype, const Shape& shape);

/// The shared roles of a backend whose realized weights are `Weight` (a handle with dtype()
/// and shape(), copied to share its storage) and whose submissions go to `Executor` (with
/// fork(n), fence(), order_after(completion) and a static retain_until_complete).
template <class Weight, class Executor>
struct BackendGlue {
  using Parameter = BasicParameter<Weight>;              ///< a module's slot
  using MaterializedWeight = Weight;                     ///< a realized weight
  using Materialization = BasicMaterialization<Weight>;  ///< an in-flight realization

  // --- ParameterBackend ---

  /// The completion of an in-flight realization.
  static Completion completion(const Materialization& m) { return m.done; }
  /// The weight an in-flight realization writes.
  static const Weight& materialized_weight(const Materialization& m) { return m.weight; }
  /// The realized weight; rethrows the realization's error. Call once completion() is ready.
  static Weight finish_materialization(Materialization&& m) {
    m.done.get();
    return std::move(m.weight);
  }
  /// Another handle to the same storage.
  static Weight share_materialized_weight(const Weight& weight) { return weight; }
  /// Throws BackendError(bind_dtype_mismatch / bind_shape_mismatch) naming both sides.
  static void validate_bind(const Parameter& parameter, const Weight& weight) {
    check_bind_fits(parameter.dtype, parameter.shape, weight.dtype(), weight.shape());
  }
  /// Stores the weight in the slot (replacing, and so releasing, any previous one).
  static void bind(Parameter& parameter, Weight&& weight) noexcept { parameter.value = std::move(weight); }

  // --- SubmissionBackend ---

  /// `count` new executors with `executor`'s resources (arenas, streams).
  static std::vector<std::unique_ptr<Executor>> fork_executors(Executor& executor, std::size_t count) {
    return executor.fork(count);
  }
  /// Completes when everything submitted to `executor` so far has.
  static Completion submit(Executor& executor) { return executor.fence(); }
  /// Later work on `executor` starts after `completion`.
  static void order_after(const Completion& completion, Executor& executor) { executor.order_after(completion); }
  /// Keeps `value` alive until `completion` has completed.
  template <class T>
  static void retain_until_complete(Executor&, const Completion& completion, T value) {
    Executor::retain_until_complete(completion, std::move(value));
  }

  // --- for the backend's materialize ---

  /// Runs `work` (the landing's steps) on `executor`, the source's; its end, success or
  /// error, completes the returned realization of `weight`.
  static Materialization start(const asio::any_io_executor& executor, Weight weight, asio::awaitable<void> work) {
    CompletionSource done;
    Completion completion = done.completion();
    asio::co_spawn(executor, std::move(work),
                   [done = std::move(done)](std::exception_ptr e) mutable { done.finish(std::move(e)); });
    return Materialization{std::move(weight), std::move(completion)};
  }
};

}  // namespace eredu::engine
