#pragma once
// The backend conformance suite: the contract every eredu backend must pass, written once as
// Catch2 TEMPLATE_TEST_CASEs over conformance adapters (conformance_adapter.hpp). A backend's
// conformance .cpp defines its adapter, then
//
//   #define EREDU_CONFORMANCE_ADAPTERS eredu::test::CpuAdapter
//   #include "conformance/backend_conformance.hpp"
//
// What every backend is checked for (docs/testing.md lists the same):
//  * the concepts it claims (STATIC_REQUIRE), and bind being noexcept;
//  * tensors and selections arrive byte for byte with their dtype and shape;
//  * recipes (cast, slice, concat, transpose/permute, reshape) give the bytes of the reference
//    evaluator (support/reference_recipe.hpp), computed in the test from the file's bytes;
//  * a failure stops the unit: the error names the failing parameter, nothing is returned, a
//    realization whose unit was stopped completes as cancelled (or done), never with an error
//    of its own, and every lease comes back;
//  * the staging pool is never exceeded and every lease comes back, under a pool smaller than
//    the unit;
//  * aliases share their owner's storage, with no copy and no second read;
//  * bind after a successful validate_bind cannot fail; a rejected weight changes nothing;
//  * (TransferBackend) demote then promote round-trips bytes, dtype and shape;
//  * (InPlaceBackend) an overwrite keeps the slot's address and takes the new bytes;
//  * (SubmissionBackend) fork, fence and retain_until_complete;
//  * (CollectiveBackend, over the adapter's group of one rank) all_reduce (sum, min, max) gives
//    back its input's bytes, dtype and shape for every dtype the backend reduces, and refuses
//    the ones it does not with Error(invalid_argument), at once and through the async form;
//    all_gather and all_to_all are the identity into a new tensor; (GatherIntoBackend)
//    all_gather_into writes the caller's output, in place too, and refuses another shape or
//    dtype; a collective waits for the work submitted before it and later work waits for the
//    collective; the initiating functions complete a callback on its executor, a future and a
//    coroutine, with the result or the refusal.
// A backend that cannot run here (no device) passes each runtime case with a WARN naming why.
//
// Reads go through the real reader with a FaultInjector installed, so mapped reads are off and
// the reader's byte counts cover every read; cast sources hold finite values only (the NaN
// payload rules are the conversion tests' business).

#ifndef EREDU_CONFORMANCE_ADAPTERS
#error "define EREDU_CONFORMANCE_ADAPTERS (the adapter types) before including backend_conformance.hpp"
#endif

#include <array>
#include <asio/awaitable.hpp>
#include <asio/bind_executor.hpp>
#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/use_future.hpp>
#include <catch2/catch.hpp>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <exception>
#include <functional>
#include <future>
#include <iterator>
#include <memory>
#include <random>
#include <stdexcept>
#include <stop_token>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "conformance/conformance_adapter.hpp"
#include "eredu/core/completion.hpp"
#include "eredu/core/error.hpp"
#include "eredu/engine/backend/collective_backend.hpp"
#include "eredu/engine/backend/in_place_backend.hpp"
#include "eredu/engine/backend/parameter_backend.hpp"
#include "eredu/engine/backend/submission_backend.hpp"
#include "eredu/engine/backend/transfer_backend.hpp"
#include "eredu/engine/orchestration/load.hpp"
#include "eredu/engine/orchestration/materialize.hpp"
#include "support/checkpoint_fixture.hpp"
#include "support/reference_recipe.hpp"
#include "support/slot_module.hpp"

namespace eredu::test::conformance {

/// The suite's tensors: every dtype the casts take, odd sizes (the u8 tensor puts the others
/// at odd file offsets, so chunk boundaries split elements), a tensor larger than a chunk, and
/// an integer tensor for the collective cases' reductions.
inline std::vector<synth::TensorSpec> specs() {
  return {
      {"odd", DType::U8, {7}},          {"q", DType::BF16, {8, 16}},        {"k", DType::BF16, {8, 16}},
      {"v", DType::BF16, {8, 16}},      {"gate", DType::F32, {4, 6}},       {"up", DType::F32, {4, 10}},
      {"big", DType::BF16, {300, 257}}, {"mat", DType::F32, {67, 131}},     {"cube", DType::F16, {3, 5, 7}},
      {"half", DType::F16, {64, 64}},   {"e4m3", DType::F8_E4M3, {16, 32}}, {"e5m2", DType::F8_E5M2, {16, 32}},
      {"e8m0", DType::F8_E8M0, {64}},   {"i32", DType::I32, {6, 10}},
  };
}

/// Random contents with finite values only: f32 spans 2^-30..2^30 (f16 subnormals, zeros
/// and overflow to Inf when narrowed) with many exact rounding ties, the narrow formats any
/// non-NaN, non-Inf pattern.
inline std::vector<std::vector<std::byte>> contents(const std::vector<synth::TensorSpec>& tensors) {
  std::mt19937_64 rng(2024);
  std::vector<std::vector<std::byte>> out;
  for (const synth::TensorSpec& s : tensors) {
    std::vector<std::byte> bytes(synth::tensor_nbytes(s));
    const std::size_t elem = dtype_bits(s.dtype) / 8;
    for (std::size_t at = 0; at < bytes.size(); at += elem) {
      std::uint64_t r = rng();
      switch (s.dtype) {
        case DType::F32: {
          const auto exp = static_cast<std::uint32_t>(127 - 30 + r % 61);
          auto mant = static_cast<std::uint32_t>((r >> 16) & 0x7FFFFFu);
          // A quarter are exact ties of bf16 rounding, a quarter of f16's: round-half-even shows.
          if ((r >> 40) % 4 == 0) mant = (mant & ~0xFFFFu) | 0x8000u;
          if ((r >> 40) % 4 == 1) mant = (mant & ~0x1FFFu) | 0x1000u;
          const std::uint32_t bits = static_cast<std::uint32_t>((r >> 8) & 0x80000000u) | (exp << 23) | mant;
          std::memcpy(&bytes[at], &bits, 4);
          break;
        }
        case DType::BF16:
          while (((r >> 7) & 0xFF) == 0xFF) r = rng();
          break;
        case DType::F16:
          while (((r >> 10) & 0x1F) == 0x1F) r = rng();
          break;
        case DType::F8_E4M3:
          while ((r & 0x7F) == 0x7F) r = rng();
          break;
        case DType::F8_E5M2:
          while ((r & 0x7C) == 0x7C) r = rng();
          break;
        case DType::F8_E8M0:
          while ((r & 0xFF) == 0xFF) r = rng();
          break;
        default:
          break;
      }
      if (s.dtype != DType::F32)
        for (std::size_t i = 0; i < elem; ++i) bytes[at + i] = static_cast<std::byte>(r >> (8 * i));
    }
    out.push_back(std::move(bytes));
  }
  return out;
}

/// Fails every read that touches [begin, end) of file 0 with EIO (off while begin == end).
struct FailRange final : io::FaultInjector {
  std::uint64_t begin = 0;  ///< first failing byte (absolute file offset)
  std::uint64_t end = 0;    ///< one past the last
  io::ReadFault on_complete(std::uint32_t, std::uint64_t offset, std::uint64_t length) override {
    if (offset < end && offset + length > begin) return {.error = EIO};
    return {};
  }
};

/// One case's world: the checkpoint, the event loop, a source over it (reads through a
/// fault injector), and the adapter's backend environment.
template <class A>
struct Bench {
  using B = typename A::Backend;                        ///< the backend under test
  using Weight = typename B::MaterializedWeight;        ///< its weight
  using Materialization = typename B::Materialization;  ///< its in-flight realization

  TestCheckpoint ckpt;                           ///< specs() with contents()
  asio::io_context ctx;                          ///< the event loop every coroutine runs on
  FailRange faults;                              ///< the source's fault injector (off at first)
  std::unique_ptr<io::CheckpointSource> source;  ///< the checkpoint, opened with `faults`
  std::unique_ptr<typename A::Env> env;          ///< destroyed before the source (CUDA unpins its pool)

  /// Opens the source with `options` (plus the fault injector) and the adapter's Env.
  explicit Bench(io::SourceOptions options = small_source_options()) : ckpt(specs(), contents(specs())) {
    options.reader.faults = &faults;
    source = io::CheckpointSource::open(ctx.get_executor(), ckpt.path, options);
    env = std::make_unique<typename A::Env>(ctx, *source);
  }
  /// Drops the backend environment first.
  ~Bench() { env.reset(); }

  /// What materializations run with.
  typename B::MaterializationContext& context() { return env->context(); }
  /// The adapter's executor.
  typename B::Executor& executor() { return env->executor(); }

  /// Runs the loop until `c` is ready.
  void wait(const Completion& c) { drive_until(ctx, c); }
  /// Waits for `m` and returns its weight (or throws its error).
  Weight finish(Materialization m) {
    wait(B::completion(m));
    return B::finish_materialization(std::move(m));
  }
  /// Materializes `request` (dtype kept) and returns the weight.
  Weight read(const io::TensorReadRequest& request) { return finish(B::materialize(*source, request, context(), {})); }
  /// Materializes `recipe` and returns the weight.
  Weight run(const engine::DerivedWeightRecipe& recipe) {
    return finish(B::materialize_recipe(*source, recipe, context(), {}));
  }
  /// The reference bytes of `recipe`, from the file's bytes.
  std::vector<std::byte> reference(const engine::DerivedWeightRecipe& recipe) const {
    return reference_evaluate(recipe, source->catalog(), [&](const std::string& key, const Selection& sel) {
      const synth::TensorSpec& s = ckpt.spec(key);
      return select_bytes(ckpt.bytes(key), s.shape, s.dtype, sel);
    });
  }
  /// Bytes every reader has delivered so far.
  std::uint64_t bytes_read() { return source->reader().stats().bytes; }
};

/// A plan binding `names` as "t.<name>" to the whole tensors, and `aliases` (alias, owner).
inline engine::WeightBindingPlan plan_of(const io::Catalog& catalog, const std::vector<std::string>& names,
                                         const std::vector<std::pair<std::string, std::string>>& aliases = {}) {
  std::vector<engine::WeightBinding> b;
  for (const std::string& n : names)
    b.push_back(engine::WeightBinding::tensor("t." + n, n, Selection::all(), catalog.at(n).nbytes));
  for (const auto& [alias, owner] : aliases)
    b.push_back(engine::WeightBinding::alias(alias, "t." + owner, catalog.at(owner).nbytes));
  return engine::WeightBindingPlan(std::move(b));
}

/// The suite's tensors of `dtype`, in file order: the collective cases take their inputs from
/// the checkpoint, so every backend makes them the same way (materializing them).
inline std::vector<synth::TensorSpec> tensors_of(DType dtype) {
  std::vector<synth::TensorSpec> out;
  for (const synth::TensorSpec& s : specs())
    if (s.dtype == dtype) out.push_back(s);
  return out;
}

/// `shape` gathered over `size` ranks — dim 0 times `size`, a scalar as [size] — computed here
/// rather than by the code under test.
inline Shape gathered_shape(Shape shape, int size) {
  if (shape.empty()) shape = {1};
  shape[0] *= static_cast<std::uint64_t>(size);
  return shape;
}

/// How the async cases complete a collective's initiating function.
enum class TokenKind {
  callback,   ///< a plain callback bound to the test's loop (asio::bind_executor)
  future,     ///< asio::use_future: the result arrives on another thread
  coroutine,  ///< asio::use_awaitable inside a coroutine spawned on the test's loop
};

/// Every token kind, for loops.
inline constexpr TokenKind token_kinds[] = {TokenKind::callback, TokenKind::future, TokenKind::coroutine};

/// "callback", "use_future" or "coroutine", for INFO.
inline const char* token_name(TokenKind kind) {
  switch (kind) {
    case TokenKind::callback:
      return "callback";
    case TokenKind::future:
      return "use_future";
    case TokenKind::coroutine:
      return "coroutine";
  }
  return "unknown";
}

/// Completes `initiate(token)` — an initiating function with the token still to pass — with a
/// token of `kind`, driving the bench's loop until it is done; returns the tensor or throws the
/// failure. `on_loop` is set to whether the callback or the coroutine's continuation ran on the
/// loop's thread (left false for a future, which has no loop).
template <class A, class Initiate>
typename A::Backend::Tensor complete_with(Bench<A>& bench, TokenKind kind, Initiate initiate, bool& on_loop) {
  using Tensor = typename A::Backend::Tensor;
  on_loop = false;
  switch (kind) {
    case TokenKind::callback: {
      Outcome<Tensor> outcome;
      initiate(
          asio::bind_executor(bench.ctx, [&bench, &on_loop, h = outcome.handler()](std::exception_ptr e, Tensor t) {
            on_loop = bench.ctx.get_executor().running_in_this_thread();
            h(std::move(e), std::move(t));
          }));
      return run_until_ready(bench.ctx, outcome);
    }
    case TokenKind::future: {
      std::future<Tensor> f = initiate(asio::use_future);
      return run_until_ready(bench.ctx, f);
    }
    case TokenKind::coroutine: {
      std::future<Tensor> f = asio::co_spawn(
          bench.ctx,
          [&]() -> asio::awaitable<Tensor> {
            Tensor t = co_await initiate(asio::use_awaitable);
            on_loop = bench.ctx.get_executor().running_in_this_thread();
            co_return t;
          },
          asio::use_future);
      return run_until_ready(bench.ctx, f);
    }
  }
  throw std::logic_error("unknown token kind");
}

/// The eredu::Error that `initiate`, completed with a token of `kind`, fails with; throws
/// std::logic_error when it succeeds or fails with something else.
template <class A, class Initiate>
Error failure_with(Bench<A>& bench, TokenKind kind, Initiate initiate) {
  bool on_loop = false;
  try {
    complete_with(bench, kind, std::move(initiate), on_loop);
  } catch (const Error& e) {
    return e;
  } catch (const std::exception& e) {
    throw std::logic_error(std::string("expected an eredu::Error, got: ") + e.what());
  }
  throw std::logic_error(std::string("expected a refusal through ") + token_name(kind) + ", and it succeeded");
}

/// Gathers and exchanges `written` — which the executor's work held by `gate` is about to
/// fill with `expected` — and submits later work that reads their outputs; checks that nothing
/// of it completes while the gate holds, then opens it: a collective that started before the
/// held work read the old bytes, and later work that started before the collective read an
/// unwritten output, so either shows as bytes other than `expected`.
template <class A>
void check_collectives_keep_executor_order(Bench<A>& bench, CompletionSource& gate,
                                           const typename A::Backend::Tensor& written,
                                           const std::vector<std::byte>& expected) {
  using B = typename A::Backend;
  auto& group = bench.env->group();
  auto [gathered, gathered_done] = B::all_gather(bench.executor(), group, written);
  auto [exchanged, exchanged_done] = B::all_to_all(bench.executor(), group, written);
  // Work submitted after the collectives, reading their outputs. (Not a demote and its promote
  // together: on an arena, work submitted in turn may run at once, so the promote waits below.)
  std::vector<Completion> later;
  std::vector<std::function<void()>> check_later;  // run once `later` has completed
  if constexpr (engine::TransferBackend<B>) {
    auto [host, demoted] = B::demote(bench.executor(), gathered);
    later.push_back(demoted);
    auto kept = std::make_shared<std::decay_t<decltype(host)>>(std::move(host));
    check_later.push_back([&bench, &expected, kept] {
      auto [back, promoted] = B::promote(bench.executor(), *kept);
      bench.wait(promoted);
      promoted.get();
      CHECK(A::host_bytes(back) == expected);  // what the demote read, after the gather
    });
  }
  if constexpr (engine::InPlaceBackend<B>) {
    io::TensorReadRequest v_request{"v"};
    auto slot = A::parameter(DType::BF16, {8, 16});
    auto v = bench.read(v_request);
    B::validate_bind(slot, v);
    B::bind(slot, std::move(v));
    later.push_back(B::overwrite(bench.executor(), slot, exchanged));
    check_later.push_back([&expected, weight = A::bound(slot)] {
      CHECK(A::host_bytes(weight) == expected);  // what the overwrite copied, after the exchange
    });
  }
  run_ready_handlers(bench.ctx);
  CHECK_FALSE(gathered_done.ready());
  CHECK_FALSE(exchanged_done.ready());
  for (const Completion& c : later) CHECK_FALSE(c.ready());
  gate.complete();
  for (const Completion& c : later) {
    bench.wait(c);
    c.get();
  }
  for (const auto& check : check_later) check();
  bench.wait(gathered_done);
  gathered_done.get();
  bench.wait(exchanged_done);
  exchanged_done.get();
  CHECK(A::host_bytes(gathered) == expected);
  CHECK(A::host_bytes(exchanged) == expected);
}

}  // namespace eredu::test::conformance

/// Ends a runtime case with a WARN naming why, where the adapter's backend cannot run here.
#define EREDU_CONFORMANCE_REQUIRE_BACKEND()                                \
  do {                                                                     \
    if (const std::string why_ = TestType::unavailable(); !why_.empty()) { \
      WARN(TestType::name << " backend: " << why_ << ": skipping");        \
      return;                                                              \
    }                                                                      \
  } while (false)

TEMPLATE_TEST_CASE("backend conformance – the backend satisfies the concepts it claims", "[conformance]",
                   EREDU_CONFORMANCE_ADAPTERS) {
  using B = typename TestType::Backend;
  STATIC_REQUIRE(eredu::engine::ParameterBackend<B>);
  STATIC_REQUIRE(eredu::engine::SubmissionBackend<B>);
  STATIC_REQUIRE(eredu::engine::TransferBackend<B> == TestType::transfer);
  STATIC_REQUIRE(eredu::engine::InPlaceBackend<B> == TestType::in_place);
  STATIC_REQUIRE(eredu::engine::CollectiveBackend<B> == TestType::collective);
  STATIC_REQUIRE(eredu::engine::GatherIntoBackend<B> == TestType::gather_into);
  if constexpr (TestType::collective) {
    // The collective cases materialize their inputs: what collectives move is a weight.
    STATIC_REQUIRE(std::is_same_v<typename B::Tensor, typename B::MaterializedWeight>);
  }
  STATIC_REQUIRE(
      noexcept(B::bind(std::declval<typename B::Parameter&>(), std::declval<typename B::MaterializedWeight&&>())));
  STATIC_REQUIRE(std::is_copy_constructible_v<typename B::MaterializedWeight>);  // aliases are handles
  STATIC_REQUIRE(std::is_move_constructible_v<typename B::Materialization>);
}

TEMPLATE_TEST_CASE("backend conformance – tensors and selections arrive byte for byte, dtype and shape kept",
                   "[conformance]", EREDU_CONFORMANCE_ADAPTERS) {
  EREDU_CONFORMANCE_REQUIRE_BACKEND();
  using namespace eredu;
  test::conformance::Bench<TestType> bench;
  for (const synth::TensorSpec& spec : bench.ckpt.specs) {
    INFO(spec.name);
    io::TensorReadRequest whole{spec.name};
    auto w = bench.read(whole);
    CHECK(TestType::dtype(w) == spec.dtype);
    CHECK(TestType::shape(w) == spec.shape);
    CHECK(TestType::host_bytes(w) == bench.ckpt.bytes(spec.name));
  }
  const synth::TensorSpec& big = bench.ckpt.spec("big");
  for (const Selection& sel : {Selection::rows(big.shape, 10, 290), Selection::columns(big.shape, 100, 101),
                               Selection{{{299, 300}, {3, 250}}}, Selection{{{5, 6}, {0, 257}}}}) {
    INFO(sel.to_string());
    io::TensorReadRequest request{"big", sel};
    auto w = bench.read(request);
    CHECK(TestType::shape(w) == sel.selected_shape(big.shape));
    CHECK(TestType::host_bytes(w) == test::select_bytes(bench.ckpt.bytes("big"), big.shape, big.dtype, sel));
  }
  CHECK(bench.source->pool().in_use() == 0);
  CHECK(bench.source->pool().high_water() <= bench.source->pool().budget());
}

TEMPLATE_TEST_CASE("backend conformance – recipes give the reference evaluator's bytes, dtype and shape",
                   "[conformance][recipe]", EREDU_CONFORMANCE_ADAPTERS) {
  EREDU_CONFORMANCE_REQUIRE_BACKEND();
  using namespace eredu;
  using R = engine::DerivedWeightRecipe;
  test::conformance::Bench<TestType> bench;
  const std::vector<R> recipes = {
      R::cast(R::source("big"), DType::F32),
      R::cast(R::source("big"), DType::F16),
      R::cast(R::source("half"), DType::BF16),
      R::cast(R::source("half"), DType::F32),
      R::cast(R::source("mat"), DType::BF16),
      R::cast(R::source("mat"), DType::F16),
      R::cast(R::source("e4m3"), DType::F32),
      R::cast(R::source("e4m3"), DType::BF16),
      R::cast(R::source("e5m2"), DType::F32),
      R::cast(R::source("e8m0"), DType::BF16),
      R::concat({R::source("q"), R::source("k"), R::source("v")}, 0),
      R::concat({R::source("q"), R::source("k"), R::source("v")}, 1),
      R::concat({R::source("gate"), R::source("up")}, 1),
      R::slice(R::source("big"), 1, {5, 200}),
      R::slice(R::source("big"), 0, {7, 150}),
      R::slice(R::cast(R::source("mat"), DType::BF16), 1, {3, 100}),
      R::transpose(R::source("mat")),
      R::transpose(R::source("big")),
      R::permute(R::source("cube"), {2, 0, 1}),
      R::permute(R::source("cube"), {1, 2, 0}),
      R::cast(R::concat({R::source("q"), R::source("k")}, 1), DType::F32),
      R::transpose(R::cast(R::source("e4m3"), DType::BF16)),
      R::reshape(R::source("big"), {257, 300}),
      R::reshape(R::transpose(R::source("gate")), {24}),
      R::source("big", Selection{{{10, 290}, {0, 257}}}),
      R::concat({R::source("q", Selection{{{0, 4}, {0, 16}}}), R::source("k", Selection{{{4, 8}, {0, 16}}})}, 0),
  };
  for (const R& recipe : recipes) {
    INFO(recipe.to_string());
    const engine::InferredWeight expected = recipe.infer(bench.source->catalog());
    auto w = bench.run(recipe);
    CHECK(TestType::dtype(w) == expected.dtype);
    CHECK(TestType::shape(w) == expected.shape);
    CHECK(TestType::host_bytes(w) == bench.reference(recipe));
  }
  CHECK(bench.source->pool().in_use() == 0);
}

TEMPLATE_TEST_CASE("backend conformance – a failure stops the unit, names its parameter, and returns every lease",
                   "[conformance][failure]", EREDU_CONFORMANCE_ADAPTERS) {
  EREDU_CONFORMANCE_REQUIRE_BACKEND();
  using namespace eredu;
  using B = typename TestType::Backend;
  using R = engine::DerivedWeightRecipe;
  test::conformance::Bench<TestType> bench;

  SECTION("an I/O error in one tensor fails the whole unit") {
    // (not named `half`: CUDA's cuda_fp16.h, which nccl.h includes, declares a global one)
    const io::TensorInfo& failing = bench.source->catalog().at("half");
    bench.faults.begin = failing.offset + failing.nbytes / 2;
    bench.faults.end = bench.faults.begin + 1;
    // The failing tensor first: should a neighbour's read window reach the bad byte too, the
    // first failure in plan order is still the one named.
    engine::WeightBindingPlan plan = test::conformance::plan_of(
        bench.source->catalog(), {"half", "big", "mat", "q", "cube", "e4m3"}, {{"tied", "q"}});
    test::Outcome<engine::MaterializedUnit<B>> unit;
    engine::async_materialize<B>(*bench.source, plan, bench.context(), unit.handler());
    const Error e = test::failure_of(bench.ctx, unit);
    CHECK(e.kind() == errc::io_error);
    CHECK(e.context().parameter == "t.half");
    CHECK_THAT(e.what(), Catch::Contains(bench.ckpt.path.string()));
  }
  SECTION("a realization whose unit was stopped before it ran completes as cancelled") {
    std::stop_source stop;
    stop.request_stop();
    std::vector<typename B::Materialization> in_flight;
    for (const char* name : {"big", "q", "mat"}) {
      io::TensorReadRequest request{name};
      in_flight.push_back(B::materialize(*bench.source, request, bench.context(), stop.get_token()));
    }
    for (const R& recipe : {R::cast(R::source("big"), DType::F32), R::concat({R::source("q"), R::source("k")}, 0),
                            R::transpose(R::source("mat"))})
      in_flight.push_back(B::materialize_recipe(*bench.source, recipe, bench.context(), stop.get_token()));
    for (auto& m : in_flight) {
      const Completion c = B::completion(m);
      bench.wait(c);
      CHECK(is_cancellation(c.error()));
    }
  }
  SECTION("realizations stopped midway complete as cancelled or done, never with errors of their own") {
    std::stop_source stop;
    std::vector<typename B::Materialization> in_flight;
    std::vector<std::string> names;
    for (const char* name : {"big", "mat", "half", "e4m3"}) {
      io::TensorReadRequest request{name};
      in_flight.push_back(B::materialize(*bench.source, request, bench.context(), stop.get_token()));
      names.emplace_back(name);
    }
    for (const char* name : {"big", "mat"}) {
      in_flight.push_back(B::materialize_recipe(*bench.source, R::cast(R::source(name), DType::F16), bench.context(),
                                                stop.get_token()));
      names.push_back(std::string(name) + " as f16");
    }
    bench.ctx.restart();
    bench.ctx.poll_one();
    stop.request_stop();
    for (std::size_t i = 0; i < in_flight.size(); ++i) {
      INFO(names[i]);
      const Completion c = B::completion(in_flight[i]);
      bench.wait(c);
      const std::exception_ptr e = c.error();
      CHECK((e == nullptr || is_cancellation(e)));
      if (!e && i < 4)
        CHECK(TestType::host_bytes(B::finish_materialization(std::move(in_flight[i]))) == bench.ckpt.bytes(names[i]));
    }
  }
  CHECK(bench.source->pool().in_use() == 0);
}

TEMPLATE_TEST_CASE("backend conformance – a unit larger than the staging pool stays within it and returns every lease",
                   "[conformance][lease]", EREDU_CONFORMANCE_ADAPTERS) {
  EREDU_CONFORMANCE_REQUIRE_BACKEND();
  using namespace eredu;
  using B = typename TestType::Backend;
  using R = engine::DerivedWeightRecipe;
  io::SourceOptions options = test::small_source_options(std::size_t{64} << 10);
  options.chunk_bytes = std::size_t{16} << 10;
  test::conformance::Bench<TestType> bench(options);
  // Every tensor fits the 64 KiB pool on its own; together, and cast, they do not.
  std::vector<engine::WeightBinding> b;
  for (const char* n : {"mat", "half", "q", "k", "v", "cube", "e4m3", "e5m2", "odd"})
    b.push_back(engine::WeightBinding::tensor(std::string("t.") + n, n, Selection::all(),
                                              bench.source->catalog().at(n).nbytes));
  b.push_back(engine::WeightBinding::from_recipe("t.mat16", R::cast(R::source("mat"), DType::F16), 67 * 131 * 2));
  b.push_back(engine::WeightBinding::from_recipe("t.half32", R::cast(R::source("half"), DType::F32), 64 * 64 * 4));
  engine::WeightBindingPlan plan(std::move(b));
  for (int round = 0; round < 2; ++round) {
    test::Outcome<engine::MaterializedUnit<B>> done;
    engine::async_materialize<B>(*bench.source, plan, bench.context(), done.handler());
    engine::MaterializedUnit<B> unit = test::run_until_ready(bench.ctx, done);
    CHECK(unit.size() == 11);
    const auto* mat = unit.find(engine::ParameterId("t.mat"));
    REQUIRE(mat);
    CHECK(TestType::host_bytes(*mat) == bench.ckpt.bytes("mat"));
    const auto* half32 = unit.find(engine::ParameterId("t.half32"));
    REQUIRE(half32);
    CHECK(TestType::host_bytes(*half32) == bench.reference(R::cast(R::source("half"), DType::F32)));
    CHECK(bench.source->pool().in_use() == 0);
  }
  CHECK(bench.source->pool().high_water() <= bench.source->pool().budget());
}

TEMPLATE_TEST_CASE("backend conformance – an alias shares its owner's storage: no copy, no second read",
                   "[conformance][alias]", EREDU_CONFORMANCE_ADAPTERS) {
  EREDU_CONFORMANCE_REQUIRE_BACKEND();
  using namespace eredu;
  using B = typename TestType::Backend;
  io::SourceOptions options = test::small_source_options();
  options.reader.direct = io::DirectMode::off;  // so every read delivers exactly its bytes
  test::conformance::Bench<TestType> bench(options);
  auto materialize = [&](const engine::WeightBindingPlan& plan) {
    test::Outcome<engine::MaterializedUnit<B>> done;
    engine::async_materialize<B>(*bench.source, plan, bench.context(), done.handler());
    return test::run_until_ready(bench.ctx, done);
  };
  const std::uint64_t before = bench.bytes_read();
  auto owners_only = materialize(test::conformance::plan_of(bench.source->catalog(), {"q", "mat"}));
  const std::uint64_t owners_read = bench.bytes_read() - before;
  auto with_aliases =
      materialize(test::conformance::plan_of(bench.source->catalog(), {"q", "mat"}, {{"head", "q"}, {"mat_t", "mat"}}));
  const std::uint64_t aliased_read = bench.bytes_read() - before - owners_read;
  CHECK(owners_read > 0);
  CHECK(aliased_read == owners_read);  // the aliases read nothing
  CHECK(with_aliases.size() == 4);
  const auto* q = with_aliases.find(engine::ParameterId("t.q"));
  const auto* head = with_aliases.find(engine::ParameterId("head"));
  const auto* mat = with_aliases.find(engine::ParameterId("t.mat"));
  const auto* mat_t = with_aliases.find(engine::ParameterId("mat_t"));
  REQUIRE((q && head && mat && mat_t));
  CHECK(TestType::same_storage(*q, *head));
  CHECK(TestType::same_storage(*mat, *mat_t));
  CHECK(TestType::address(*q) == TestType::address(*head));
  CHECK_FALSE(TestType::same_storage(*q, *mat));
  CHECK(TestType::host_bytes(*head) == bench.ckpt.bytes("q"));
  CHECK(bench.source->pool().in_use() == 0);
}

TEMPLATE_TEST_CASE("backend conformance – bind after validate_bind cannot fail, and a rejected weight changes nothing",
                   "[conformance][bind]", EREDU_CONFORMANCE_ADAPTERS) {
  EREDU_CONFORMANCE_REQUIRE_BACKEND();
  using namespace eredu;
  using B = typename TestType::Backend;
  test::conformance::Bench<TestType> bench;
  io::TensorReadRequest request{"q"};
  auto w = bench.read(request);

  auto slot = TestType::parameter(DType::BF16, {8, 16});
  B::validate_bind(slot, w);
  auto kept = B::share_materialized_weight(w);
  B::bind(slot, std::move(kept));  // noexcept (checked statically above)
  REQUIRE(TestType::is_bound(slot));
  CHECK(TestType::same_storage(TestType::bound(slot), w));
  CHECK(TestType::host_bytes(TestType::bound(slot)) == bench.ckpt.bytes("q"));

  auto wrong_dtype = TestType::parameter(DType::F32, {8, 16});
  try {
    B::validate_bind(wrong_dtype, w);
    FAIL("a bf16 weight validated for an f32 slot");
  } catch (const BackendError& e) {
    CHECK(e.kind() == errc::bind_dtype_mismatch);
  }
  auto wrong_shape = TestType::parameter(DType::BF16, {16, 8});
  try {
    B::validate_bind(wrong_shape, w);
    FAIL("an [8, 16] weight validated for a [16, 8] slot");
  } catch (const BackendError& e) {
    CHECK(e.kind() == errc::bind_shape_mismatch);
  }
  CHECK_FALSE(TestType::is_bound(wrong_dtype));
  CHECK_FALSE(TestType::is_bound(wrong_shape));

  // Through the engine: one slot of the wrong shape, and the module is left exactly as it was.
  test::SlotModule<typename B::Parameter> module(
      {{"t.q", DType::BF16, {8, 16}}, {"t.mat", DType::F32, {131, 67}}, {"t.cube", DType::F16, {3, 5, 7}}});
  engine::WeightBindingPlan plan = test::conformance::plan_of(bench.source->catalog(), {"q", "mat", "cube"});
  test::Outcome<void> done;
  engine::async_load<B>(module, *bench.source, plan, bench.context(), done.handler());
  const Error e = test::failure_of(bench.ctx, done);
  CHECK(e.kind() == errc::bind_shape_mismatch);
  CHECK(e.context().parameter == "t.mat");
  module.for_each([](const std::string& name, const typename B::Parameter& p) {
    INFO(name);
    CHECK_FALSE(TestType::is_bound(p));
  });
  CHECK(bench.source->pool().in_use() == 0);
}

TEMPLATE_TEST_CASE("backend conformance – demote then promote round-trips bytes, dtype and shape",
                   "[conformance][transfer]", EREDU_CONFORMANCE_ADAPTERS) {
  using namespace eredu;
  using B = typename TestType::Backend;
  if constexpr (!engine::TransferBackend<B>) {
    STATIC_REQUIRE_FALSE(TestType::transfer);
    WARN(TestType::name << " backend: not a TransferBackend: nothing to round-trip");
  } else {
    EREDU_CONFORMANCE_REQUIRE_BACKEND();
    test::conformance::Bench<TestType> bench;
    for (const char* name : {"big", "mat", "e4m3", "odd", "cube"}) {
      INFO(name);
      io::TensorReadRequest request{name};
      auto w = bench.read(request);
      auto [host, demoted] = B::demote(bench.executor(), w);
      bench.wait(demoted);
      demoted.get();
      auto [back, promoted] = B::promote(bench.executor(), host);
      bench.wait(promoted);
      promoted.get();
      CHECK(TestType::dtype(back) == TestType::dtype(w));
      CHECK(TestType::shape(back) == TestType::shape(w));
      CHECK_FALSE(TestType::same_storage(back, w));
      CHECK(TestType::host_bytes(back) == bench.ckpt.bytes(name));
    }
  }
}

TEMPLATE_TEST_CASE("backend conformance – an in-place overwrite keeps the slot's address and takes the new bytes",
                   "[conformance][in-place]", EREDU_CONFORMANCE_ADAPTERS) {
  using namespace eredu;
  using B = typename TestType::Backend;
  if constexpr (!engine::InPlaceBackend<B>) {
    STATIC_REQUIRE_FALSE(TestType::in_place);
    WARN(TestType::name << " backend: not an InPlaceBackend: nothing to overwrite");
  } else {
    EREDU_CONFORMANCE_REQUIRE_BACKEND();
    test::conformance::Bench<TestType> bench;
    io::TensorReadRequest q_request{"q"}, k_request{"k"}, gate_request{"gate"};
    auto q = bench.read(q_request);
    auto k = bench.read(k_request);
    auto slot = TestType::parameter(DType::BF16, {8, 16});
    B::validate_bind(slot, q);
    B::bind(slot, std::move(q));
    const void* address = TestType::address(TestType::bound(slot));

    Completion copied = B::overwrite(bench.executor(), slot, k);
    bench.wait(copied);
    copied.get();
    CHECK(TestType::address(TestType::bound(slot)) == address);
    CHECK(TestType::host_bytes(TestType::bound(slot)) == bench.ckpt.bytes("k"));
    CHECK_FALSE(TestType::same_storage(TestType::bound(slot), k));

    auto unbound = TestType::parameter(DType::BF16, {8, 16});
    CHECK_THROWS_AS(B::overwrite(bench.executor(), unbound, k), BackendError);
    auto gate = bench.read(gate_request);
    CHECK_THROWS_AS(B::overwrite(bench.executor(), slot, gate), BackendError);  // other dtype and shape
    CHECK(TestType::address(TestType::bound(slot)) == address);
    CHECK(TestType::host_bytes(TestType::bound(slot)) == bench.ckpt.bytes("k"));
  }
}

TEMPLATE_TEST_CASE("backend conformance – executors fork, fence, and retain values until a completion",
                   "[conformance][submission]", EREDU_CONFORMANCE_ADAPTERS) {
  EREDU_CONFORMANCE_REQUIRE_BACKEND();
  using namespace eredu;
  using B = typename TestType::Backend;
  test::conformance::Bench<TestType> bench;
  auto lanes = B::fork_executors(bench.executor(), 2);
  REQUIRE(lanes.size() == 2);
  CHECK(lanes[0] != nullptr);
  CHECK(lanes[1] != nullptr);
  CHECK(lanes[0].get() != lanes[1].get());
  for (auto& lane : lanes) {
    Completion fence = B::submit(*lane);
    REQUIRE(fence.valid());
    bench.wait(fence);
    CHECK(fence.error() == nullptr);
  }

  CompletionSource gate;
  auto value = std::make_shared<int>(42);
  std::weak_ptr<int> watch = value;
  B::retain_until_complete(bench.executor(), gate.completion(), std::move(value));
  CHECK_FALSE(watch.expired());  // held while the completion is pending
  gate.complete();
  bench.wait(gate.completion());
  CHECK(watch.expired());  // and released once it has completed
}

/// Opens a collective case: a backend that does not claim CollectiveBackend passes it by
/// checking, statically, that its adapter does not claim it either (with a WARN).
#define EREDU_CONFORMANCE_NOT_COLLECTIVE()    \
  STATIC_REQUIRE_FALSE(TestType::collective); \
  WARN(TestType::name << " backend: not a CollectiveBackend: no collectives to run")

TEMPLATE_TEST_CASE("backend conformance – a group of one rank is rank 0 of 1, and all_reduce gives back its input",
                   "[conformance][collective]", EREDU_CONFORMANCE_ADAPTERS) {
  using namespace eredu;
  using B = typename TestType::Backend;
  if constexpr (!engine::CollectiveBackend<B>) {
    EREDU_CONFORMANCE_NOT_COLLECTIVE();
  } else {
    EREDU_CONFORMANCE_REQUIRE_BACKEND();
    test::conformance::Bench<TestType> bench;
    auto& group = bench.env->group();
    REQUIRE(B::group_rank(group) == 0);
    REQUIRE(B::group_size(group) == 1);
    int reduced = 0;
    for (const DType dtype : TestType::reduced_dtypes) {
      INFO(dtype_name(dtype));
      const std::vector<synth::TensorSpec> inputs = test::conformance::tensors_of(dtype);
      REQUIRE_FALSE(inputs.empty());  // every dtype the adapter lists is one the suite reduces
      for (const synth::TensorSpec& spec : inputs)
        for (const engine::ReduceOp op : {engine::ReduceOp::sum, engine::ReduceOp::min, engine::ReduceOp::max}) {
          INFO(spec.name << " " << engine::reduce_op_name(op));
          io::TensorReadRequest request{spec.name};
          auto [out, done] = B::all_reduce(bench.executor(), group, bench.read(request), op);
          bench.wait(done);
          done.get();
          CHECK(TestType::dtype(out) == spec.dtype);
          CHECK(TestType::shape(out) == spec.shape);
          CHECK(TestType::host_bytes(out) == bench.ckpt.bytes(spec.name));
          ++reduced;
        }
    }
    CHECK(reduced >= 3 * static_cast<int>(std::size(TestType::reduced_dtypes)));
  }
}

TEMPLATE_TEST_CASE(
    "backend conformance – all_reduce refuses a dtype the backend does not reduce, at once and through every token",
    "[conformance][collective][refusal]", EREDU_CONFORMANCE_ADAPTERS) {
  using namespace eredu;
  using B = typename TestType::Backend;
  using test::conformance::TokenKind;
  if constexpr (!engine::CollectiveBackend<B>) {
    EREDU_CONFORMANCE_NOT_COLLECTIVE();
  } else {
    EREDU_CONFORMANCE_REQUIRE_BACKEND();
    test::conformance::Bench<TestType> bench;
    auto& group = bench.env->group();
    for (const DType dtype : TestType::refused_dtypes) {
      const std::string dtype_text(dtype_name(dtype));
      INFO(dtype_text);
      const std::vector<synth::TensorSpec> inputs = test::conformance::tensors_of(dtype);
      REQUIRE_FALSE(inputs.empty());
      io::TensorReadRequest request{inputs.front().name};
      auto t = bench.read(request);
      for (const engine::ReduceOp op : {engine::ReduceOp::sum, engine::ReduceOp::min, engine::ReduceOp::max}) {
        INFO(engine::reduce_op_name(op));
        try {
          (void)B::all_reduce(bench.executor(), group, t, op);
          FAIL("all_reduce started on a dtype the backend documents as refused");
        } catch (const Error& e) {
          CHECK(e.kind() == errc::invalid_argument);
          CHECK_THAT(e.what(), Catch::Contains(dtype_text));
        }
        for (const TokenKind kind : test::conformance::token_kinds) {
          INFO(test::conformance::token_name(kind));
          const Error e = test::conformance::failure_with(bench, kind, [&](auto token) {
            return engine::async_all_reduce<B>(bench.executor(), group, t, op, std::move(token));
          });
          CHECK(e.kind() == errc::invalid_argument);
          CHECK_THAT(e.what(), Catch::Contains(dtype_text));
        }
      }
      CHECK(TestType::host_bytes(t) == bench.ckpt.bytes(inputs.front().name));  // nothing touched it
    }
    // A refusal starts nothing: the group still reduces afterwards.
    const synth::TensorSpec spec = test::conformance::tensors_of(TestType::reduced_dtypes[0]).front();
    io::TensorReadRequest request{spec.name};
    auto [out, done] = B::all_reduce(bench.executor(), group, bench.read(request), engine::ReduceOp::sum);
    bench.wait(done);
    done.get();
    CHECK(TestType::host_bytes(out) == bench.ckpt.bytes(spec.name));
  }
}

TEMPLATE_TEST_CASE("backend conformance – all_gather and all_to_all over one rank give their input in a new tensor",
                   "[conformance][collective]", EREDU_CONFORMANCE_ADAPTERS) {
  using namespace eredu;
  using B = typename TestType::Backend;
  if constexpr (!engine::CollectiveBackend<B>) {
    EREDU_CONFORMANCE_NOT_COLLECTIVE();
  } else {
    EREDU_CONFORMANCE_REQUIRE_BACKEND();
    test::conformance::Bench<TestType> bench;
    auto& group = bench.env->group();
    REQUIRE(B::group_size(group) == 1);
    // Bytes move whatever the dtype: FP8 and integers too; 1-D, 2-D, 3-D, larger than a chunk.
    for (const char* name : {"odd", "q", "gate", "cube", "i32", "e4m3", "e8m0", "big"}) {
      const synth::TensorSpec& spec = bench.ckpt.spec(name);
      INFO(name);
      io::TensorReadRequest request{name};
      auto t = bench.read(request);
      {
        auto [out, done] = B::all_gather(bench.executor(), group, t);
        bench.wait(done);
        done.get();
        CHECK(TestType::dtype(out) == spec.dtype);
        CHECK(TestType::shape(out) == test::conformance::gathered_shape(spec.shape, B::group_size(group)));
        CHECK(TestType::host_bytes(out) == bench.ckpt.bytes(name));
        CHECK_FALSE(TestType::same_storage(out, t));
      }
      {
        auto [out, done] = B::all_to_all(bench.executor(), group, t);
        bench.wait(done);
        done.get();
        CHECK(TestType::dtype(out) == spec.dtype);
        CHECK(TestType::shape(out) == spec.shape);
        CHECK(TestType::host_bytes(out) == bench.ckpt.bytes(name));
        CHECK_FALSE(TestType::same_storage(out, t));
      }
      CHECK(TestType::host_bytes(t) == bench.ckpt.bytes(name));  // the input is only read
    }
  }
}

TEMPLATE_TEST_CASE(
    "backend conformance – all_gather_into writes the caller's output and refuses another shape or dtype",
    "[conformance][collective][gather-into]", EREDU_CONFORMANCE_ADAPTERS) {
  using namespace eredu;
  using B = typename TestType::Backend;
  using R = engine::DerivedWeightRecipe;
  using test::conformance::TokenKind;
  if constexpr (!engine::GatherIntoBackend<B>) {
    STATIC_REQUIRE_FALSE(TestType::gather_into);
    WARN(TestType::name << " backend: not a GatherIntoBackend: no caller's output to gather into");
  } else {
    EREDU_CONFORMANCE_REQUIRE_BACKEND();
    test::conformance::Bench<TestType> bench;
    auto& group = bench.env->group();
    io::TensorReadRequest q_request{"q"}, k_request{"k"}, v_request{"v"};
    const std::vector<std::byte> q_bytes = bench.ckpt.bytes("q");
    const Shape q_shape = bench.ckpt.spec("q").shape;
    auto q = bench.read(q_request);

    auto out = bench.read(k_request);  // the output of the right shape and dtype, holding other bytes
    REQUIRE(TestType::host_bytes(out) != q_bytes);
    REQUIRE(TestType::shape(out) == test::conformance::gathered_shape(q_shape, B::group_size(group)));
    Completion done = B::all_gather_into(bench.executor(), group, q, out);
    bench.wait(done);
    done.get();
    CHECK(TestType::dtype(out) == DType::BF16);
    CHECK(TestType::host_bytes(out) == q_bytes);
    CHECK(TestType::host_bytes(q) == q_bytes);

    // Through every token the result is the caller's output, holding the gather.
    for (const TokenKind kind : test::conformance::token_kinds) {
      INFO(test::conformance::token_name(kind));
      auto target = bench.read(v_request);
      bool on_loop = false;
      auto got = test::conformance::complete_with(
          bench, kind,
          [&](auto token) {
            return engine::async_all_gather_into<B>(bench.executor(), group, q, target, std::move(token));
          },
          on_loop);
      CHECK(TestType::same_storage(got, target));
      CHECK(TestType::host_bytes(got) == q_bytes);
      if (kind != TokenKind::future) CHECK(on_loop);
    }

    // In place: over one rank the input is its rank's block of the output, the whole of it.
    auto self = bench.read(v_request);
    Completion in_place = B::all_gather_into(bench.executor(), group, self, self);
    bench.wait(in_place);
    in_place.get();
    CHECK(TestType::host_bytes(self) == bench.ckpt.bytes("v"));

    // The same bytes in another shape, the same shape in another dtype: refused before anything
    // starts, and the output keeps its bytes.
    const std::pair<const char*, R> wrong[] = {{"another shape", R::reshape(R::source("v"), {16, 8})},
                                               {"another dtype", R::cast(R::source("v"), DType::F16)}};
    for (const auto& [why, recipe] : wrong) {
      INFO(why);
      auto bad = bench.run(recipe);
      const std::vector<std::byte> before = TestType::host_bytes(bad);
      const std::string bad_text =
          std::string(dtype_name(TestType::dtype(bad))) + " " + format_shape(TestType::shape(bad));
      try {
        (void)B::all_gather_into(bench.executor(), group, q, bad);
        FAIL("all_gather_into started into an output of " << bad_text);
      } catch (const Error& e) {
        CHECK(e.kind() == errc::invalid_argument);
        CHECK_THAT(e.what(), Catch::Contains(bad_text));
      }
      for (const TokenKind kind : test::conformance::token_kinds) {
        INFO(test::conformance::token_name(kind));
        const Error e = test::conformance::failure_with(bench, kind, [&](auto token) {
          return engine::async_all_gather_into<B>(bench.executor(), group, q, bad, std::move(token));
        });
        CHECK(e.kind() == errc::invalid_argument);
        CHECK_THAT(e.what(), Catch::Contains(bad_text));
      }
      CHECK(TestType::host_bytes(bad) == before);
    }
  }
}

TEMPLATE_TEST_CASE(
    "backend conformance – a collective started right after order_after waits for that completion, as on a stream",
    "[conformance][collective][order]", EREDU_CONFORMANCE_ADAPTERS) {
  using namespace eredu;
  using B = typename TestType::Backend;
  if constexpr (!engine::CollectiveBackend<B>) {
    EREDU_CONFORMANCE_NOT_COLLECTIVE();
  } else {
    EREDU_CONFORMANCE_REQUIRE_BACKEND();
    test::conformance::Bench<TestType> bench;
    io::TensorReadRequest q_request{"q"};
    auto q = bench.read(q_request);
    // No work is submitted between the order and the collective: the executor's order alone
    // must hold it (mpi::Backend once started it at once: its fence covered submitted work only).
    CompletionSource gate;
    B::order_after(gate.completion(), bench.executor());
    auto [gathered, gathered_done] = B::all_gather(bench.executor(), bench.env->group(), q);
    const Completion point = B::submit(bench.executor());  // a submission point after the collective
    for (int i = 0; i < 20; ++i) {
      test::run_ready_handlers(bench.ctx);
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    CHECK_FALSE(gathered_done.ready());
    CHECK_FALSE(point.ready());
    gate.complete();
    bench.wait(gathered_done);
    gathered_done.get();
    bench.wait(point);
    point.get();
    CHECK(TestType::host_bytes(gathered) == bench.ckpt.bytes("q"));
  }
}

TEMPLATE_TEST_CASE(
    "backend conformance – a collective waits for the executor's earlier work, and later work waits for it",
    "[conformance][collective][order]", EREDU_CONFORMANCE_ADAPTERS) {
  using namespace eredu;
  using B = typename TestType::Backend;
  if constexpr (!engine::CollectiveBackend<B>) {
    EREDU_CONFORMANCE_NOT_COLLECTIVE();
  } else {
    EREDU_CONFORMANCE_REQUIRE_BACKEND();
    test::conformance::Bench<TestType> bench;
    io::TensorReadRequest q_request{"q"}, k_request{"k"};
    const std::vector<std::byte> k_bytes = bench.ckpt.bytes("k");
    REQUIRE(k_bytes != bench.ckpt.bytes("q"));
    bool ran = false;
    if constexpr (engine::InPlaceBackend<B>) {
      // The held work overwrites a slot holding q with k; the collectives read the slot.
      auto slot = TestType::parameter(DType::BF16, {8, 16});
      auto q = bench.read(q_request);
      B::validate_bind(slot, q);
      B::bind(slot, std::move(q));
      auto k = bench.read(k_request);
      CompletionSource gate;
      B::order_after(gate.completion(), bench.executor());
      const Completion copied = B::overwrite(bench.executor(), slot, k);
      test::conformance::check_collectives_keep_executor_order(bench, gate, TestType::bound(slot), k_bytes);
      bench.wait(copied);
      ran = true;
    }
    if constexpr (engine::TransferBackend<B>) {
      // The held work promotes k's host copy into new storage; the collectives read it.
      auto k = bench.read(k_request);
      auto [host, demoted] = B::demote(bench.executor(), k);
      bench.wait(demoted);
      demoted.get();
      CompletionSource gate;
      B::order_after(gate.completion(), bench.executor());
      auto [promoted, promoted_done] = B::promote(bench.executor(), host);
      test::conformance::check_collectives_keep_executor_order(bench, gate, promoted, k_bytes);
      bench.wait(promoted_done);
      ran = true;
    }
    if (!ran) WARN(TestType::name << " backend: neither InPlaceBackend nor TransferBackend: no work to order after");
  }
}

TEMPLATE_TEST_CASE(
    "backend conformance – the collectives complete a callback on its executor, a future and a coroutine",
    "[conformance][collective][async]", EREDU_CONFORMANCE_ADAPTERS) {
  using namespace eredu;
  using B = typename TestType::Backend;
  using test::conformance::TokenKind;
  if constexpr (!engine::CollectiveBackend<B>) {
    EREDU_CONFORMANCE_NOT_COLLECTIVE();
  } else {
    EREDU_CONFORMANCE_REQUIRE_BACKEND();
    test::conformance::Bench<TestType> bench;
    auto& group = bench.env->group();
    const synth::TensorSpec reduced = test::conformance::tensors_of(TestType::reduced_dtypes[0]).front();
    const synth::TensorSpec& moved = bench.ckpt.spec("e4m3");
    for (const TokenKind kind : test::conformance::token_kinds) {
      INFO(test::conformance::token_name(kind));
      io::TensorReadRequest reduced_request{reduced.name}, moved_request{moved.name};
      bool on_loop = false;
      auto t = bench.read(reduced_request);
      auto sum = test::conformance::complete_with(
          bench, kind,
          [&](auto token) {
            return engine::async_all_reduce<B>(bench.executor(), group, t, engine::ReduceOp::max, std::move(token));
          },
          on_loop);
      CHECK(TestType::dtype(sum) == reduced.dtype);
      CHECK(TestType::shape(sum) == reduced.shape);
      CHECK(TestType::host_bytes(sum) == bench.ckpt.bytes(reduced.name));
      if (kind != TokenKind::future) CHECK(on_loop);

      auto f8 = bench.read(moved_request);
      auto gathered = test::conformance::complete_with(
          bench, kind,
          [&](auto token) { return engine::async_all_gather<B>(bench.executor(), group, f8, std::move(token)); },
          on_loop);
      CHECK(TestType::shape(gathered) == test::conformance::gathered_shape(moved.shape, B::group_size(group)));
      CHECK(TestType::host_bytes(gathered) == bench.ckpt.bytes(moved.name));
      if (kind != TokenKind::future) CHECK(on_loop);

      auto exchanged = test::conformance::complete_with(
          bench, kind,
          [&](auto token) { return engine::async_all_to_all<B>(bench.executor(), group, f8, std::move(token)); },
          on_loop);
      CHECK(TestType::shape(exchanged) == moved.shape);
      CHECK(TestType::host_bytes(exchanged) == bench.ckpt.bytes(moved.name));
      if (kind != TokenKind::future) CHECK(on_loop);
    }
  }
}
