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
/// later read fails with that error (backend_failure) until a swap succeeds. The swap is the swap core every slot runs
/// (detail/swap_core.hpp) with this slot's policy (detail/in_place_swap.hpp); the gate is detail/in_place_gate.hpp.
///
/// async_patch is the variant without the staged copy, for a version that differs from the
/// serving one in few bytes: it compares the new bytes with the serving ones as it reads them,
/// keeps only the blocks that differ, verifies every digest, and writes those blocks under the
/// gate, undoing them if the canary refuses (detail/in_place_patch.hpp).
///
/// Trade-off against the double-buffered ModelSlot (see docs/hot_swap.md): the same peak
/// memory on a CPU (serving model + staged set), but the serving model's addresses never
/// change — what matters when other structures point into the weights (packed kernels,
/// registered or device-mapped memory, captured graphs) and, on a GPU, lets the staged set
/// live in host memory so device memory holds one version. The price is a reader pause:
/// requests wait for the drain of the requests in flight plus the copy (0.08-1.3 s for a
/// 0.99 GiB shard on the 2-core VM of docs/performance.md), where ModelSlot's readers never
/// wait. A request must not call async_read while it holds a Reader (it would wait for a swap
/// that waits for it).

#include <asio/async_result.hpp>
#include <asio/system_executor.hpp>
#include <atomic>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <utility>

#include "eredu/core/detail/handler_delivery.hpp"
#include "eredu/core/detail/spawn_operation.hpp"
#include "eredu/engine/backend/in_place_backend.hpp"
#include "eredu/engine/backend/patching_backend.hpp"
#include "eredu/engine/detail/in_place_gate.hpp"
#include "eredu/engine/detail/in_place_patch.hpp"
#include "eredu/engine/detail/in_place_swap.hpp"
#include "eredu/engine/detail/swap_core.hpp"
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
  using State = detail::InPlaceState<Model, Gate>;
  using Swap = detail::InPlaceSwap<B, Model, Gate>;

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
  explicit InPlaceModelSlot(Factory make_model) : state_{std::move(make_model), nullptr} {
    state_.gate = std::make_shared<Gate>(state_.make_model());
  }
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
        token, state_.gate);
  }

  /// Read access now, or nullopt while a swap is copying (for callers that cannot wait).
  /// Throws a torn slot's error.
  std::optional<Reader> try_read() { return Gate::try_enter(state_.gate); }

  /// Generation of the serving weights.
  std::uint64_t generation() const { return Gate::current_generation(state_.gate); }

  /// True while a swap is running (as ModelSlot::swapping).
  bool swapping() const noexcept { return state_.swapping.load(std::memory_order_acquire); }

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
  /// `source` is any io::ByteSource B reads from, as for ModelSlot::async_swap: from a source
  /// other than a local checkpoint, checksums that need re-reading the file fail the swap with
  /// invalid_argument before any read, the serving weights untouched.
  ///
  /// `source`, `context`, `executor` and `options.progress` must outlive the operation; the
  /// plan is copied, and so is the canary.
  template <io::ByteSource Source, asio::completion_token_for<void(std::exception_ptr, SwapReport)> Token>
  requires ParameterBackend<B, Source>
  auto async_swap(Source& source, const WeightBindingPlan& plan, typename B::MaterializationContext& context,
                  typename B::Executor& executor, SwapOptions<Model> options, Token&& token) {
    using Context = typename B::MaterializationContext;
    return asio::async_initiate<Token, void(std::exception_ptr, SwapReport)>(
        [](auto handler, State* state, Source* src, const WeightBindingPlan& p, Context* ctx, typename B::Executor* ex,
           SwapOptions<Model> o) {
          detail::SwapRequest<Source, Context, Model> request{src, detail::plan_for(handler, p), ctx, std::move(o)};
          Swap policy{state, ex, request.plan};
          eredu::detail::spawn_operation(src->get_executor(), detail::run_swap(std::move(policy), std::move(request)),
                                         std::move(handler));
        },
        token, &state_, &source, plan, &context, &executor, std::move(options));
  }

  /// async_swap with default options.
  template <io::ByteSource Source, asio::completion_token_for<void(std::exception_ptr, SwapReport)> Token>
  requires ParameterBackend<B, Source>
  auto async_swap(Source& source, const WeightBindingPlan& plan, typename B::MaterializationContext& context,
                  typename B::Executor& executor, Token&& token) {
    return async_swap(source, plan, context, executor, SwapOptions<Model>{}, std::forward<Token>(token));
  }

  /// Changes the serving version into `plan` read from `source` by writing only the bytes
  /// that differ, with no staged copy: for a version that differs from the serving one in few
  /// blocks (an RL step's update, a published delta), on a server without memory for a second
  /// copy. Each weight is read in the source's bounded chunks, compared with the serving bytes
  /// in 64-byte blocks, and hashed; the blocks that differ are kept (at most `patch.budget`
  /// bytes). Only once every weight is read and every digest checked does the slot close its
  /// gate, drain the requests in flight, write those blocks (keeping the bytes they replace),
  /// and run the canary on the patched model: if it throws, the replaced bytes go back and the
  /// serving version stays, byte for byte. A source sent as a delta against the serving bytes
  /// (io::DeltaSource, such as mpi::PublishedSource after use_base) is read only where it can
  /// differ, when the swap has a digest for the weight: the other bytes are hashed where they
  /// serve, so the digest still checks the whole patched weight. With block digests
  /// (io::DigestKind::xxh3_128_blocks), the slot keeps each checked weight's, and the next
  /// patch of a delta hashes only the 64 KiB blocks it changes (forgotten by async_swap).
  ///
  /// @par Completion Signature
  /// `void(std::exception_ptr, SwapReport)`; written_bytes is what it wrote, hashed_bytes what
  /// it hashed, publish_pause how
  /// long new readers were held back (drain, write and canary). Errors, all before any byte is
  /// written or with every written byte restored: invalid_argument when nothing is serving
  /// yet (the first version goes by async_swap), for another aliasing, or for a weight a recipe
  /// computes; unexpected_bindings, bind_dtype_mismatch, bind_shape_mismatch; exceeds_budget
  /// when the change is larger than `patch.budget`; backend_failure for weights mapped
  /// read-only from a file; the source's read errors; checksum_mismatch; canary_failed;
  /// swap_in_progress; cancelled.
  ///
  /// @par Per-Operation Cancellation
  /// terminal, up to the write: the patch stops after its current step and fails with
  /// errc::cancelled. Once the gate is closed it runs to its end.
  ///
  /// `executor` compares and hashes the chunks, off the source's event loop. The canary runs
  /// under the closed gate, so it must not read through this slot. `source`, `executor` and
  /// `options.progress` must outlive the operation; the plan and the canary are copied.
  template <io::ByteSource Source, asio::completion_token_for<void(std::exception_ptr, SwapReport)> Token>
  requires PatchingBackend<B>
  auto async_patch(Source& source, const WeightBindingPlan& plan, typename B::Executor& executor,
                   SwapOptions<Model> options, PatchOptions patch, Token&& token) {
    using Context = typename B::MaterializationContext;
    return asio::async_initiate<Token, void(std::exception_ptr, SwapReport)>(
        [](auto handler, State* state, Source* src, const WeightBindingPlan& p, typename B::Executor* ex,
           SwapOptions<Model> o, PatchOptions po) {
          detail::SwapRequest<Source, Context, Model> request{src, detail::plan_for(handler, p), nullptr, std::move(o)};
          detail::InPlacePatchSwap<B, Model, Gate> policy{state, request.plan, po.budget, ex};
          eredu::detail::spawn_operation(src->get_executor(), detail::run_swap(std::move(policy), std::move(request)),
                                         std::move(handler));
        },
        token, &state_, &source, plan, &executor, std::move(options), patch);
  }

  /// async_patch with default options (no digests, no canary, the default budget).
  template <io::ByteSource Source, asio::completion_token_for<void(std::exception_ptr, SwapReport)> Token>
  requires PatchingBackend<B>
  auto async_patch(Source& source, const WeightBindingPlan& plan, typename B::Executor& executor, Token&& token) {
    return async_patch(source, plan, executor, SwapOptions<Model>{}, PatchOptions{}, std::forward<Token>(token));
  }

 private:
  State state_;
};

}  // namespace eredu::engine
