// The async contract every public operation of io/ and engine/ keeps (docs/style.md,
// "Asynchronous operations"): an Asio initiating function with the token last, completing
// with void(std::exception_ptr[, T]) for a callback, asio::use_future, asio::use_awaitable
// and asio::experimental::deferred alike. The "compile" namespace is compiled, never run,
// as in Asio's own unit tests; the test cases check what the compiler can, and run a
// deferred load whose arguments are gone before it starts.

#include "eredu/engine/orchestration/load.hpp"
#include "eredu/engine/orchestration/materialize.hpp"
#include "eredu/engine/serving/in_place_model_slot.hpp"
#include "eredu/engine/serving/model_slot.hpp"
#include "eredu/engine/serving/prefetch_pipeline.hpp"

#include <asio/awaitable.hpp>
#include <asio/co_spawn.hpp>
#include <asio/experimental/deferred.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/use_future.hpp>
#include <catch2/catch.hpp>
#include <cstddef>
#include <exception>
#include <filesystem>
#include <future>
#include <memory>
#include <optional>
#include <stop_token>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "cpu/cpu_fixture.hpp"
#include "eredu/core/async_event.hpp"
#include "eredu/core/completion.hpp"
#include "eredu/io/integrity/checksums.hpp"
#include "eredu/io/reading/checkpoint_source.hpp"
#include "eredu/io/reading/lease_pool.hpp"
#include "eredu/io/reading/reader.hpp"

using namespace eredu;
using namespace eredu::test;
using engine::WeightBinding;
using engine::WeightBindingPlan;

namespace {

/// A callback for any completion signature whose first argument is the error.
struct AnyCallback {
  template <class... Values>
  void operator()(std::exception_ptr, Values&&...) const {}
};

/// Starts an operation with each kind of token, checking what each returns: a future of
/// `Result`, an awaitable of `Result`, a deferred operation (launched with a callback), and
/// nothing for a callback. `start(token)` calls the initiating function.
template <class Result, class Start>
void with_every_token(Start start) {
  static_assert(std::is_void_v<decltype(start(AnyCallback{}))>);
  static_assert(std::is_same_v<decltype(start(asio::use_future)), std::future<Result>>);
  static_assert(std::is_same_v<decltype(start(asio::use_awaitable)), asio::awaitable<Result>>);
  auto deferred = start(asio::experimental::deferred);
  static_assert(asio::experimental::is_deferred<decltype(deferred)>::value);
  std::move(deferred)(AnyCallback{});
}

/// A module of CPU parameters with one slot.
struct One {
  cpu::Parameter w{DType::U8, {16}};
  void visit_parameters(engine::ParameterVisitor<cpu::Parameter>& v, const std::string& prefix) const {
    v.visit({engine::ParameterId(engine::join_name(prefix, "w")), w.dtype, w.shape}, w);
  }
  void visit_parameters_mut(engine::ParameterVisitorMut<cpu::Parameter>& v, const std::string& prefix) {
    v.visit_mut({engine::ParameterId(engine::join_name(prefix, "w")), w.dtype, w.shape}, w);
  }
};

// Compiled, never run.
namespace compile {

[[maybe_unused]] void io_operations(asio::any_io_executor ex, io::CheckpointSource& source, io::ChunkStream& stream,
                                    io::LeasePool& pool, io::Reader& reader, const io::TensorReadRequest& request,
                                    std::span<std::byte> out, const io::Checksums& sums) {
  with_every_token<std::unique_ptr<io::CheckpointSource>>(
      [&](auto token) { return io::async_open_checkpoint(ex, "model.safetensors", io::SourceOptions{}, token); });
  with_every_token<std::unique_ptr<io::CheckpointSource>>(
      [&](auto token) { return io::async_open_checkpoint(ex, "model.safetensors", token); });
  with_every_token<io::Lease>([&](auto token) { return source.async_read(request, token); });
  with_every_token<void>([&](auto token) { return source.async_read_into(request, out, token); });
  with_every_token<std::optional<io::Lease>>([&](auto token) { return stream.async_next(token); });
  with_every_token<io::StagingBuffer>([&](auto token) { return pool.async_acquire(4096, token); });
  with_every_token<void>([&](auto token) { return reader.async_read({}, ex, token); });
  with_every_token<std::uint64_t>([&](auto token) { return io::async_verify_checksums(source, sums, token); });
  with_every_token<std::uint64_t>([&](auto token) { return io::async_verify_checksums(source, sums, ex, token); });
}

[[maybe_unused]] void core_operations(const Completion& completion, AsyncEvent& event) {
  with_every_token<void>([&](auto token) { return completion.async_wait(token); });
  with_every_token<void>([&](auto token) { return event.async_wait(token); });
}

[[maybe_unused]] void engine_operations(io::CheckpointSource& source, const WeightBindingPlan& plan,
                                        cpu::MaterializationContext& context, cpu::Executor& executor, One& module,
                                        engine::PrefetchPipeline<cpu::Backend, One>& pipeline,
                                        engine::ModelSlot<cpu::Backend, One>& slot,
                                        engine::InPlaceModelSlot<cpu::Backend, One>& in_place) {
  using Unit = engine::MaterializedUnit<cpu::Backend>;
  engine::MaterializeOptions options;
  with_every_token<Unit>(
      [&](auto token) { return engine::async_materialize<cpu::Backend>(source, plan, context, token); });
  with_every_token<Unit>(
      [&](auto token) { return engine::async_materialize<cpu::Backend>(source, plan, context, options, token); });
  with_every_token<void>(
      [&](auto token) { return engine::async_load<cpu::Backend>(module, source, plan, context, token); });
  with_every_token<void>(
      [&](auto token) { return engine::async_load<cpu::Backend>(module, source, plan, context, options, token); });
  with_every_token<engine::PrefetchPipeline<cpu::Backend, One>::Unit>(
      [&](auto token) { return pipeline.async_next(token); });
  with_every_token<void>([&](auto token) { return pipeline.async_close(token); });
  with_every_token<engine::SwapReport>([&](auto token) { return slot.async_swap(source, plan, context, token); });
  with_every_token<engine::SwapReport>([&](auto token) {
    engine::SwapOptions<One> swap_options{.origin = "b"};
    return slot.async_swap(source, plan, context, std::move(swap_options), token);
  });
  with_every_token<engine::SwapReport>(
      [&](auto token) { return in_place.async_swap(source, plan, context, executor, token); });
  with_every_token<engine::SwapReport>([&](auto token) {
    engine::SwapOptions<One> swap_options{.origin = "b"};
    return in_place.async_swap(source, plan, context, executor, std::move(swap_options), token);
  });
  with_every_token<engine::InPlaceModelSlot<cpu::Backend, One>::Reader>(
      [&](auto token) { return in_place.async_read(token); });
}

}  // namespace compile

/// A backend with executors but no host transfer: a ParameterBackend and SubmissionBackend
/// that is not a TransferBackend (declarations only: it is never run).
struct NoTransferBackend {
  struct Parameter {};
  struct MaterializedWeight {};
  struct MaterializationContext {};
  struct Materialization {};
  struct Executor {};
  static Materialization materialize(io::CheckpointSource&, const io::TensorReadRequest&, MaterializationContext&,
                                     std::stop_token);
  static Materialization materialize_recipe(io::CheckpointSource&, const engine::DerivedWeightRecipe&,
                                            MaterializationContext&, std::stop_token);
  static Completion completion(const Materialization&);
  static const MaterializedWeight& materialized_weight(const Materialization&);
  static MaterializedWeight finish_materialization(Materialization&&);
  static MaterializedWeight share_materialized_weight(const MaterializedWeight&);
  static void validate_bind(const Parameter&, const MaterializedWeight&);
  static void bind(Parameter&, MaterializedWeight&&) noexcept;
  static std::vector<std::unique_ptr<Executor>> fork_executors(Executor&, std::size_t);
  static Completion submit(Executor&);
  static void order_after(const Completion&, Executor&);
  template <class T>
  static void retain_until_complete(Executor&, const Completion&, T&&);
};

/// A module of NoTransferBackend parameters.
struct NoTransferModule {
  void visit_parameters(engine::ParameterVisitor<NoTransferBackend::Parameter>&, const std::string&) const {}
  void visit_parameters_mut(engine::ParameterVisitorMut<NoTransferBackend::Parameter>&, const std::string&) {}
};

/// True when a PrefetchPipeline<B, M> can be built with keep-on-host.
template <class B, class M>
constexpr bool can_keep_on_host =
    std::is_constructible_v<engine::PrefetchPipeline<B, M>, io::CheckpointSource&, std::vector<engine::PipelineUnit>,
                            typename engine::PrefetchPipeline<B, M>::ModuleFactory, typename B::MaterializationContext&,
                            engine::PrefetchOptions, engine::KeepOnHost<typename B::Executor>>;

/// True when a PrefetchPipeline<B, M> can be built without keep-on-host.
template <class B, class M>
constexpr bool can_stream =
    std::is_constructible_v<engine::PrefetchPipeline<B, M>, io::CheckpointSource&, std::vector<engine::PipelineUnit>,
                            typename engine::PrefetchPipeline<B, M>::ModuleFactory, typename B::MaterializationContext&,
                            engine::PrefetchOptions>;

}  // namespace

TEST_CASE("async contract – keep-on-host exists only for a TransferBackend, decided at compile time",
          "[engine][async][pipeline]") {
  STATIC_REQUIRE(engine::ParameterBackend<NoTransferBackend>);
  STATIC_REQUIRE(engine::SubmissionBackend<NoTransferBackend>);
  STATIC_REQUIRE_FALSE(engine::TransferBackend<NoTransferBackend>);
  STATIC_REQUIRE(can_stream<NoTransferBackend, NoTransferModule>);
  STATIC_REQUIRE_FALSE(can_keep_on_host<NoTransferBackend, NoTransferModule>);
  STATIC_REQUIRE(engine::TransferBackend<cpu::Backend>);
  STATIC_REQUIRE(can_stream<cpu::Backend, One>);
  STATIC_REQUIRE(can_keep_on_host<cpu::Backend, One>);
}

TEST_CASE("async contract – one completion error type: every signature starts with std::exception_ptr",
          "[engine][async]") {
  // The compile namespace above instantiated every operation with every token; what is left
  // to state is the vocabulary they share.
  STATIC_REQUIRE(std::is_same_v<eredu::detail::operation_signature_t<io::Lease>, void(std::exception_ptr, io::Lease)>);
  STATIC_REQUIRE(std::is_same_v<eredu::detail::operation_signature_t<void>, void(std::exception_ptr)>);
  STATIC_REQUIRE(std::is_same_v<io::ReadCallback, UniqueFunction<void(std::exception_ptr)>>);
}

TEST_CASE("async contract – a deferred load runs after its plan and options have gone out of scope",
          "[engine][async][deferred]") {
  CpuCheckpoint ckpt{{{"w", DType::U8, {16}}}};
  asio::io_context ctx;
  auto source = io::CheckpointSource::open(ctx.get_executor(), ckpt.path, small_source_options());
  cpu::Executor executor{1};
  cpu::StoragePool storage;
  cpu::MaterializationContext mc{executor, storage};
  One module;
  engine::MaterializeProgress progress;
  auto load = [&] {
    WeightBindingPlan plan({WeightBinding::tensor("w", "w", Selection::all(), 16)});
    engine::MaterializeOptions options{.progress = &progress};
    return engine::async_load<cpu::Backend>(module, *source, plan, mc, options, asio::experimental::deferred);
  }();
  std::promise<void> loaded;
  std::future<void> done = loaded.get_future();
  std::move(load)([&](std::exception_ptr e) {
    if (e)
      loaded.set_exception(e);
    else
      loaded.set_value();
  });
  run_until_ready(ctx, done);
  CHECK(to_vector(module.w.value.bytes()) == ckpt.bytes("w"));
  CHECK(progress.owners_done == 1);
  CHECK(source->pool().in_use() == 0);
}

// g++ 12 relocates a class temporary written inside a co_await expression bitwise
// (docs/io.md, "Compiler caveats"): `co_await io::async_open_checkpoint(ex, path,
// io::SourceOptions{}, token)` aborts with "free(): invalid pointer". The first calls a user
// writes have overloads without the options, whose defaults are made outside the coroutine.
asio::awaitable<void> open_read_load(std::filesystem::path path, One* module, cpu::MaterializationContext* mc,
                                     std::vector<std::byte>* read) {
  auto ex = co_await asio::this_coro::executor;
  auto source = co_await io::async_open_checkpoint(ex, path, asio::use_awaitable);
  io::TensorReadRequest request{"w"};
  io::Lease lease = co_await source->async_read(request, asio::use_awaitable);
  read->assign(lease.bytes().begin(), lease.bytes().end());
  lease.release();
  WeightBindingPlan plan({WeightBinding::tensor("w", "w", Selection::all(), 16)});
  engine::MaterializedUnit<cpu::Backend> unit =
      co_await engine::async_materialize<cpu::Backend>(*source, plan, *mc, asio::use_awaitable);
  CHECK(unit.size() == 1);
  co_await engine::async_load<cpu::Backend>(*module, *source, plan, *mc, asio::use_awaitable);
}

TEST_CASE("async contract – open, read, materialize and load from a coroutine with no options temporary",
          "[engine][async][coroutine]") {
  CpuCheckpoint ckpt{{{"w", DType::U8, {16}}}};
  asio::io_context ctx;
  cpu::Executor executor{1};
  cpu::StoragePool storage;
  cpu::MaterializationContext mc{executor, storage};
  One module;
  std::vector<std::byte> read;
  std::future<void> done = asio::co_spawn(ctx, open_read_load(ckpt.path, &module, &mc, &read), asio::use_future);
  run_until_ready(ctx, done);  // rethrows the coroutine's failure
  CHECK(read == ckpt.bytes("w"));
  CHECK(to_vector(module.w.value.bytes()) == ckpt.bytes("w"));
}
