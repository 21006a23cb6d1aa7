#pragma once
/// \file
/// eredu::engine::InPlaceModelSlot: hot-swap for memory-tight deployments — the new version's
/// weights are copied into the serving model's own storage, so the model's parameters keep
/// their addresses and no second model object is ever published.
///
/// \code
///   engine::InPlaceModelSlot<cpu::Backend, Model> slot([&] { return Model(config); });
///   // a request
///   auto reader = co_await slot.async_read(asio::use_awaitable);  // waits only during a copy
///   reply(reader.model().forward(x), reader.generation());
///   // a swap
///   co_await slot.async_swap(*source, plan, background, background.executor, asio::use_awaitable);
/// \endcode
///
/// A swap, in order: (1) materializes the complete new set into staging weights (the
/// backend's storage, through the bounded lease pool, on the caller's throttled context);
/// (2) validates every weight against the serving model's slots (missing, unexpected,
/// dtype, shape) and checks that the aliasing (tied weights) is the serving version's;
/// (3) runs the canary on a staged model that shares the staging weights (checksums were
/// verified inside the load of step 1, each tensor as it landed); only then (4) closes the gate to new readers, waits
/// for the readers still in a request to finish, copies every owner weight into its bound storage, and reopens. A
/// failure in 1-3 (or a cancellation) leaves the serving weights untouched and reports a typed error. The copy in 4 is
/// a bounded memcpy of validated sizes; if a backend ever fails it, the slot does not serve a mix of versions: every
/// later read fails with that error (backend_failure) until a swap succeeds. The gate is detail/in_place_gate.hpp; step
/// 3 is shared with ModelSlot (detail/swap_steps.hpp).
///
/// Trade-off against the double-buffered ModelSlot (see docs/hot_swap.md): the same peak
/// memory on a CPU (serving model + staged set), but the serving model's addresses never
/// change — what matters when other structures point into the weights (packed kernels,
/// registered or device-mapped memory, captured graphs) and, on a GPU, lets the staged set
/// live in host memory so device memory holds one version. The price is a reader pause:
/// requests wait for the drain of the requests in flight plus the copy (milliseconds per
/// GiB), where ModelSlot's readers never wait. A request must not call async_read while it
/// holds a Reader (it would wait for a swap that waits for it).

#include <asio/async_result.hpp>
#include <asio/awaitable.hpp>
#include <asio/system_executor.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>
#include <atomic>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "eredu/core/completion.hpp"
#include "eredu/core/detail/handler_delivery.hpp"
#include "eredu/core/detail/spawn_operation.hpp"
#include "eredu/core/error.hpp"
#include "eredu/engine/backend/in_place_backend.hpp"
#include "eredu/engine/detail/in_place_gate.hpp"
#include "eredu/engine/detail/materialize_unit.hpp"
#include "eredu/engine/detail/swap_steps.hpp"
#include "eredu/engine/orchestration/bind.hpp"
#include "eredu/engine/orchestration/engine_error.hpp"
#include "eredu/engine/serving/swap_options.hpp"

namespace eredu::engine {

/// A model swapped in place (see file comment). Thread-safe: readers on any thread; swaps
/// on the source's executor, one at a time.
template <ParameterBackend B, class Model>
requires Parameterized<Model, typename B::Parameter> && InPlaceBackend<B>
class InPlaceModelSlot {
 public:
  class Reader;

 private:
  using Gate = detail::InPlaceGate<Model, Reader>;

 public:
  /// Makes an empty model with every slot declared and nothing bound.
  using Factory = std::function<Model()>;

  /// Read access to the serving model for one request; the next swap's copy waits until it
  /// is released (destroyed or release()). Move-only.
  class Reader {
   public:
    Reader() = default;
    Reader(Reader&& other) noexcept : gate_(std::move(other.gate_)), generation_(other.generation_) {}
    Reader& operator=(Reader&& other) noexcept {
      if (this != &other) {
        release();
        gate_ = std::move(other.gate_);
        generation_ = other.generation_;
      }
      return *this;
    }
    ~Reader() { release(); }

    /// False for an empty Reader.
    explicit operator bool() const noexcept { return gate_ != nullptr; }
    /// The serving model (every slot bound once generation() > 0).
    const Model& model() const noexcept { return gate_->model; }
    /// The version being read: 0 before the first swap, +1 per successful swap.
    std::uint64_t generation() const noexcept { return generation_; }
    /// Ends the read now (idempotent).
    void release() {
      if (gate_) Gate::leave(std::exchange(gate_, nullptr));
    }

   private:
    friend Gate;
    Reader(std::shared_ptr<Gate> gate, std::uint64_t generation) : gate_(std::move(gate)), generation_(generation) {}
    std::shared_ptr<Gate> gate_;
    std::uint64_t generation_ = 0;
  };

  /// A slot whose model comes from `make_model`; nothing is bound until the first swap.
  explicit InPlaceModelSlot(Factory make_model)
      : make_model_(std::move(make_model)), gate_(std::make_shared<Gate>(make_model_())) {}
  InPlaceModelSlot(const InPlaceModelSlot&) = delete;
  InPlaceModelSlot& operator=(const InPlaceModelSlot&) = delete;

  /// Read access, at once unless a swap is copying.
  ///
  /// @par Completion Signature
  /// `void(std::exception_ptr, Reader)`; the error is a torn slot's (see file comment). The
  /// handler runs on its associated executor (asio::system_executor if it has none), never
  /// inline.
  ///
  /// @par Per-Operation Cancellation
  /// none: a read waits at most for one copy.
  ///
  /// The slot must outlive the Reader, not the operation.
  template <asio::completion_token_for<void(std::exception_ptr, Reader)> Token>
  auto async_read(Token&& token) {
    return asio::async_initiate<Token, void(std::exception_ptr, Reader)>(
        [](auto handler, std::shared_ptr<Gate> gate) {
          auto deliver = eredu::detail::deliver_on_handler_executor<std::exception_ptr, Reader>(
              std::move(handler), asio::system_executor());
          Gate::enter(gate, std::move(deliver));
        },
        token, gate_);
  }

  /// Read access now, or nullopt while a swap is copying (for callers that cannot wait).
  /// Throws a torn slot's error.
  std::optional<Reader> try_read() { return Gate::try_enter(gate_); }

  /// Generation of the serving weights.
  std::uint64_t generation() const { return Gate::current_generation(gate_); }

  /// Loads `plan` from `source` and copies it into the serving model (see file comment);
  /// `executor` runs the copy.
  ///
  /// @par Completion Signature
  /// `void(std::exception_ptr, SwapReport)`; publish_pause is how long new readers were held
  /// back (drain + copy), readers_drained the part spent waiting for requests in flight.
  /// Errors: the load's, a validation's (missing_binding, bind_shape_mismatch, ...),
  /// invalid_argument for different aliasing, checksum_mismatch, canary_failed,
  /// swap_in_progress, cancelled; all of them leave the serving weights untouched. A failed
  /// copy (backend_failure) tears the slot.
  ///
  /// @par Per-Operation Cancellation
  /// terminal, up to the copy: the swap stops after its current step and fails with
  /// errc::cancelled. Once the gate is closed the swap runs to its end.
  ///
  /// `source`, `context`, `executor` and `options.progress` must outlive the operation; the
  /// plan is copied, and so is the canary.
  template <asio::completion_token_for<void(std::exception_ptr, SwapReport)> Token>
  auto async_swap(io::CheckpointSource& source, const WeightBindingPlan& plan,
                  typename B::MaterializationContext& context, typename B::Executor& executor,
                  SwapOptions<Model> options, Token&& token) {
    return eredu::detail::spawn_operation(
        source.get_executor(),
        swap(source, std::make_shared<const WeightBindingPlan>(plan), context, executor, std::move(options)),
        std::forward<Token>(token));
  }

  /// async_swap with default options.
  template <asio::completion_token_for<void(std::exception_ptr, SwapReport)> Token>
  auto async_swap(io::CheckpointSource& source, const WeightBindingPlan& plan,
                  typename B::MaterializationContext& context, typename B::Executor& executor, Token&& token) {
    return async_swap(source, plan, context, executor, SwapOptions<Model>{}, std::forward<Token>(token));
  }

 private:
  using Aliases = std::set<std::pair<ParameterId, ParameterId>>;

  static Aliases aliases_of(const WeightBindingPlan& plan) {
    Aliases out;
    for (auto [alias, owner] : plan.aliases()) out.emplace(alias->id(), owner->id());
    return out;
  }

  asio::awaitable<SwapReport> swap(io::CheckpointSource& source, std::shared_ptr<const WeightBindingPlan> plan,
                                   typename B::MaterializationContext& context, typename B::Executor& executor,
                                   SwapOptions<Model> options) {
    detail::SwapClaim claim(swapping_, options.origin);
    co_await asio::this_coro::throw_if_cancelled(false);
    asio::cancellation_state cancel_state = co_await asio::this_coro::cancellation_state;
    const std::uint64_t serving = generation();
    const detail::SwapCancellation cancellation(cancel_state, "in-place swap", serving);
    if (serving > 0 && aliases_of(*plan) != aliases_)
      throw OrchestrationError(errc::invalid_argument, {},
                               "an in-place swap needs the serving version's aliasing (the same tied weights)");

    // 1. Stage the complete new set.
    SwapReport report;
    const detail::SwapClock::time_point t = detail::SwapClock::now();
    // Checksums (step 3) are verified inside the load, each tensor as it lands.
    MaterializeProgress own_counters;
    MaterializeOptions materialize = detail::swap_load_options(options, own_counters);
    const std::uint64_t verified_before = materialize.progress->bytes_verified.load();
    MaterializedUnit<B> unit = co_await detail::materialize_unit<B>(source, plan, context, materialize, true);
    report.load_s = detail::seconds_since(t);
    report.verified_bytes = materialize.progress->bytes_verified.load() - verified_before;
    detail::trace_step("load", t);
    report.bytes = detail::plan_bytes(*plan, source.catalog());

    // 2. Validate against the serving model's declarations (which never change).
    validate_materialized_unit<B>(gate_->model, unit.weights());
    cancellation.check("after the load");

    // 3. The canary on a staged model sharing the staging weights (the checksums were
    // verified in step 1).
    if (options.canary) {
      Model staged = make_model_();
      typename MaterializedUnit<B>::Weights shared;
      for (auto& [id, weight] : unit.weights()) shared.emplace(id, B::share_materialized_weight(weight));
      bind_materialized_unit<B>(staged, MaterializedUnit<B>(std::move(shared)));
      co_await detail::canary_step<Model>(options.canary, std::as_const(staged), serving, report);
    }
    cancellation.check("before the copy");

    // 4. Close the gate, drain the requests in flight, copy, reopen.
    const detail::SwapClock::time_point closed = detail::SwapClock::now();
    co_await Gate::close_and_drain(gate_);
    report.readers_drained = detail::SwapClock::now() - closed;
    detail::trace_step("drain readers", closed);

    std::exception_ptr copy_error;
    if (serving == 0) {
      // Nothing bound yet: the staged weights become the model's (validated: cannot fail).
      bind_materialized_unit<B>(gate_->model, std::move(unit));
      aliases_ = aliases_of(*plan);
    } else {
      try {
        co_await copy_owners(*plan, unit, executor);
      } catch (...) {
        copy_error = std::current_exception();
      }
    }
    std::exception_ptr torn;
    if (copy_error)
      torn = std::make_exception_ptr(BackendError(
          errc::backend_failure, {},
          fmt::format("an in-place swap failed during its final copy, so the weights are neither version {} nor "
                      "the new one; reads fail until a swap succeeds",
                      serving)));
    report.publish_pause = detail::SwapClock::now() - closed;
    detail::trace_step("publish in place", closed);
    report.generation = serving + 1;
    Gate::open(gate_, std::move(torn));
    if (copy_error) std::rethrow_exception(copy_error);
    co_return report;
  }

  /// Copies every owner's staged weight into its bound slot (aliases share the owner's
  /// storage and so follow), each copy parallel on `executor`, all awaited.
  asio::awaitable<void> copy_owners(const WeightBindingPlan& plan, const MaterializedUnit<B>& unit,
                                    typename B::Executor& executor) {
    std::set<ParameterId> owners;
    for (const WeightBinding* owner : plan.owners()) owners.insert(owner->id());
    struct Copier final : ParameterVisitorMut<typename B::Parameter> {
      Copier(const std::set<ParameterId>& o, const MaterializedUnit<B>& u, typename B::Executor& e)
          : owners(o), unit(u), executor(e) {}
      void visit_mut(const ParameterMetadata& metadata, typename B::Parameter& parameter) override {
        if (!owners.contains(metadata.id)) return;
        try {
          copies.push_back(B::overwrite(executor, parameter, *unit.find(metadata.id)));
        } catch (...) {
          copies.push_back(Completion::failed(attach_parameter(std::current_exception(), metadata.id.str())));
        }
      }
      const std::set<ParameterId>& owners;
      const MaterializedUnit<B>& unit;
      typename B::Executor& executor;
      std::vector<Completion> copies;
    } copier(owners, unit, executor);
    gate_->model.visit_parameters_mut(copier, std::string());
    co_await when_all(copier.copies).async_wait(asio::use_awaitable);
  }

  Factory make_model_;
  std::shared_ptr<Gate> gate_;
  Aliases aliases_;  // the serving version's (alias, owner) pairs
  std::atomic<bool> swapping_{false};
};

}  // namespace eredu::engine
