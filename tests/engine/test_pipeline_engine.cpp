// PrefetchPipeline as an engine test, over the fake backend: delivery order under loads that
// finish out of order, the look-ahead, concurrent-load and budget bounds counted exactly,
// failure placement, cancellation and close waiting for loads that cannot stop, and parking
// on the host. The fake reads nothing (FakeReads::bypass), so every step runs on the event
// loop and run_ready_handlers() reaches the same state on every run.

#include <asio/bind_cancellation_slot.hpp>
#include <asio/cancellation_signal.hpp>
#include <asio/use_future.hpp>
#include <catch2/catch.hpp>
#include <future>
#include <string>
#include <vector>

#include "eredu/core/error.hpp"
#include "eredu/engine/serving/prefetch_pipeline.hpp"
#include "support/checkpoint_fixture.hpp"
#include "support/fake_backend.hpp"
#include "support/reference_recipe.hpp"
#include "support/slot_module.hpp"

using namespace eredu;
using namespace eredu::test;
using engine::PipelineUnit;
using engine::WeightBinding;
using engine::WeightBindingPlan;
using R = engine::DerivedWeightRecipe;
using Layer = SlotModule<FakeParameter>;
using Pipeline = engine::PrefetchPipeline<FakeBackend, Layer>;

namespace {

constexpr std::size_t units_n = 6;
constexpr std::uint64_t a_bytes = 16 * 8 * 2;  // "a": BF16 [16, 8], kept
constexpr std::uint64_t b_bytes = 8 * 4 * 4;   // "b": BF16 [8, 4] cast to F32
constexpr std::uint64_t unit_bytes = a_bytes + b_bytes;

std::vector<synth::TensorSpec> layer_specs() {
  std::vector<synth::TensorSpec> specs;
  for (std::size_t i = 0; i < units_n; ++i) {
    specs.push_back({fmt::format("layers.{}.a", i), DType::BF16, {16, 8}});
    specs.push_back({fmt::format("layers.{}.b", i), DType::BF16, {8, 4}});
  }
  return specs;
}

Layer make_layer(std::size_t) {
  return Layer(
      {{"a.weight", DType::BF16, {16, 8}}, {"b.weight", DType::F32, {8, 4}}, {"tied.weight", DType::BF16, {16, 8}}});
}

/// Unit i: a kept matrix, a cast one, and a tied alias of the first.
std::vector<PipelineUnit> units() {
  std::vector<PipelineUnit> out;
  for (std::size_t i = 0; i < units_n; ++i) {
    std::vector<WeightBinding> b{
        WeightBinding::tensor("a.weight", fmt::format("layers.{}.a", i), Selection::all(), a_bytes),
        WeightBinding::from_recipe("b.weight", R::cast(R::source(fmt::format("layers.{}.b", i)), DType::F32), b_bytes),
        WeightBinding::alias("tied.weight", "a.weight", a_bytes),
    };
    out.push_back({fmt::format("layers.{}", i), WeightBindingPlan(std::move(b))});
  }
  return out;
}

struct PipelineEnv {
  TestCheckpoint ckpt{layer_specs()};
  asio::io_context ctx;
  std::unique_ptr<io::CheckpointSource> source;
  FakeDevice device{ctx.get_executor(), FakeReads::bypass};

  PipelineEnv() { source = io::CheckpointSource::open(ctx.get_executor(), ckpt.path, small_source_options()); }

  FakeStats stats() const { return device.stats(); }

  /// The units whose load has started, in start order (one entry per load, from the
  /// realizations of their "a" tensor).
  std::vector<std::size_t> started() const {
    std::vector<std::size_t> out;
    for (const std::string& key : stats().started_keys)
      for (std::size_t i = 0; i < units_n; ++i)
        if (key == fmt::format("layers.{}.a", i)) out.push_back(i);
    return out;
  }

  /// Checks a delivered unit's weights against what the fake gives unit i.
  void check_unit(const Layer& layer, std::size_t i) const {
    const io::Catalog& catalog = source->catalog();
    CHECK(to_vector(layer.slot("a.weight").value.bytes()) ==
          fake_tensor_bytes(catalog.at(fmt::format("layers.{}.a", i))));
    CHECK(to_vector(layer.slot("b.weight").value.bytes()) ==
          reference_cast(fake_tensor_bytes(catalog.at(fmt::format("layers.{}.b", i))), DType::BF16, DType::F32));
    CHECK(layer.slot("tied.weight").value.shares_storage_with(layer.slot("a.weight").value));
  }

  /// Starts async_next.
  static Outcome<Pipeline::Unit> ask(Pipeline& pipeline) {
    Outcome<Pipeline::Unit> next;
    pipeline.async_next(next.handler());
    return next;
  }

  /// async_next, run until nothing more can happen; the unit (it must be ready by then).
  Pipeline::Unit next(Pipeline& pipeline) {
    Outcome<Pipeline::Unit> f = ask(pipeline);
    run_ready_handlers(ctx);
    REQUIRE(f.ready());
    return f.get();
  }

  /// async_close, run to its end.
  void close(Pipeline& pipeline) {
    Outcome<void> f;
    pipeline.async_close(f.handler());
    run_until_ready(ctx, f);
  }
};

std::vector<std::size_t> seq(std::initializer_list<std::size_t> v) { return v; }

}  // namespace

TEST_CASE("pipeline engine – units arrive in order, pass after pass, and at most K+1 are started",
          "[engine][pipeline][fake]") {
  PipelineEnv env;
  Pipeline pipeline(*env.source, units(), make_layer, env.device, {.lookahead = 2, .passes = 2});
  run_ready_handlers(env.ctx);
  CHECK(env.started() == seq({0, 1, 2}));  // K + 1 units loaded ahead; unit 3 waits
  {
    Pipeline::Unit first = env.next(pipeline);
    CHECK(first.index() == 0);
    env.check_unit(first.module(), 0);
    run_ready_handlers(env.ctx);
    CHECK(env.started() == seq({0, 1, 2}));  // the consumer holds unit 0: still K + 1
  }                                          // released here
  run_ready_handlers(env.ctx);
  CHECK(env.started() == seq({0, 1, 2, 3}));

  std::vector<std::pair<std::size_t, std::size_t>> seen;  // (pass, index)
  for (;;) {
    Pipeline::Unit unit = env.next(pipeline);
    if (!unit) break;
    seen.emplace_back(unit.pass(), unit.index());
    env.check_unit(unit.module(), unit.index());
  }
  std::vector<std::pair<std::size_t, std::size_t>> expected;
  for (std::size_t i = 1; i < units_n; ++i) expected.emplace_back(0, i);
  for (std::size_t i = 0; i < units_n; ++i) expected.emplace_back(1, i);
  CHECK(seen == expected);
  env.close(pipeline);
  const FakeStats s = env.stats();
  CHECK(s.started == 2 * units_n * 2);  // two owners per unit, every unit read again on pass 2
  CHECK(s.live_weights == 0);
  CHECK(pipeline.stats().delivered == 2 * units_n);
  CHECK(pipeline.stats().resident_bytes == 0);
  CHECK(pipeline.stats().resident_high_water <= 3 * unit_bytes);
}

TEST_CASE("pipeline engine – loads finishing out of order are delivered in order, concurrent_loads bounds them",
          "[engine][pipeline][fake]") {
  PipelineEnv env;
  std::vector<FakeGate> gates;
  for (std::size_t i = 0; i < units_n; ++i)
    gates.push_back(env.device.hold(FakeOp::materialize, fmt::format("layers.{}.a", i)));
  Pipeline pipeline(*env.source, units(), make_layer, env.device, {.lookahead = 3, .concurrent_loads = 2});
  run_ready_handlers(env.ctx);
  CHECK(env.started() == seq({0, 1}));  // two loads at once, though the look-ahead allows four
  CHECK(env.stats().waiting == 2);

  Outcome<Pipeline::Unit> first = PipelineEnv::ask(pipeline);
  gates[1].open();  // unit 1 finishes before unit 0
  run_ready_handlers(env.ctx);
  CHECK(env.started() == seq({0, 1, 2}));  // its end made room for the next load ...
  CHECK_FALSE(first.ready());              // ... but the consumer waits for unit 0
  gates[0].open();
  run_ready_handlers(env.ctx);
  REQUIRE(first.ready());
  CHECK(first.get().index() == 0);

  for (auto& g : gates) g.open();
  std::vector<std::size_t> rest;
  while (Pipeline::Unit unit = env.next(pipeline)) rest.push_back(unit.index());
  CHECK(rest == seq({1, 2, 3, 4, 5}));
  env.close(pipeline);
  CHECK(env.stats().live_weights == 0);
}

TEST_CASE("pipeline engine – the resident budget holds loads back before the look-ahead does",
          "[engine][pipeline][fake]") {
  PipelineEnv env;
  Pipeline pipeline(*env.source, units(), make_layer, env.device,
                    {.lookahead = 4, .resident_budget = 2 * unit_bytes, .concurrent_loads = 4});
  run_ready_handlers(env.ctx);
  CHECK(env.started() == seq({0, 1}));  // the look-ahead would allow five
  {
    Pipeline::Unit first = env.next(pipeline);
    run_ready_handlers(env.ctx);
    CHECK(env.started() == seq({0, 1}));  // held: its bytes still count
  }
  run_ready_handlers(env.ctx);
  CHECK(env.started() == seq({0, 1, 2}));
  while (env.next(pipeline)) {}
  env.close(pipeline);
  CHECK(pipeline.stats().resident_high_water <= 2 * unit_bytes);
  CHECK(pipeline.stats().delivered == units_n);
}

TEST_CASE("pipeline engine – a failed unit is reported when the consumer reaches it: those before arrive, none after",
          "[engine][pipeline][fake]") {
  PipelineEnv env;
  FakeGate unit0 = env.device.hold(FakeOp::materialize, "layers.0.a");
  env.device.fail(FakeOp::materialize, "layers.2.b", errc::io_error);
  Pipeline pipeline(*env.source, units(), make_layer, env.device, {.lookahead = 3, .concurrent_loads = 4});
  run_ready_handlers(env.ctx);
  CHECK(env.stats().failed == 1);             // unit 2 has failed ...
  CHECK(env.stats().in_flight == 1);          // ... while unit 0 is still loading
  CHECK(env.started() == seq({0, 1, 2, 3}));  // and nothing starts after a failure

  Outcome<Pipeline::Unit> f0 = PipelineEnv::ask(pipeline);
  run_ready_handlers(env.ctx);
  CHECK_FALSE(f0.ready());
  unit0.open();
  run_ready_handlers(env.ctx);
  REQUIRE(f0.ready());
  Pipeline::Unit u0 = f0.get();
  CHECK(u0.index() == 0);
  env.check_unit(u0.module(), 0);
  Pipeline::Unit u1 = env.next(pipeline);
  CHECK(u1.index() == 1);

  Outcome<Pipeline::Unit> f2 = PipelineEnv::ask(pipeline);
  const Error e = failure_of(env.ctx, f2);
  CHECK(e.kind() == errc::io_error);
  CHECK(e.context().parameter == "layers.2.b.weight");
  Outcome<Pipeline::Unit> again = PipelineEnv::ask(pipeline);
  CHECK(failure_of(env.ctx, again).kind() == errc::io_error);  // the error stays

  env.check_unit(u0.module(), 0);  // units handed out before stay valid
  u0.release();
  u1.release();
  env.close(pipeline);
  CHECK(env.stats().in_flight == 0);
  CHECK(env.stats().live_weights == 0);
  CHECK(pipeline.stats().resident_bytes == 0);
}

TEST_CASE("pipeline engine – cancelling async_next waits for a load that cannot stop, and held units stay valid",
          "[engine][pipeline][fake][cancel]") {
  PipelineEnv env;
  FakeGate unit2 = env.device.hold(FakeOp::materialize, "layers.2.a");
  Pipeline pipeline(*env.source, units(), make_layer, env.device, {.lookahead = 2, .passes = 0});
  run_ready_handlers(env.ctx);
  CHECK(env.started() == seq({0, 1, 2}));
  Pipeline::Unit u0 = env.next(pipeline);
  Pipeline::Unit u1 = env.next(pipeline);

  asio::cancellation_signal cancel;
  Outcome<Pipeline::Unit> f;
  pipeline.async_next(asio::bind_cancellation_slot(cancel.slot(), f.handler()));
  run_ready_handlers(env.ctx);
  CHECK_FALSE(f.ready());  // unit 2 is held
  cancel.emit(asio::cancellation_type::terminal);
  run_ready_handlers(env.ctx);
  CHECK_FALSE(f.ready());  // the stopped load of unit 2 has not returned yet
  CHECK(env.stats().in_flight == 1);
  unit2.open();
  CHECK(failure_of(env.ctx, f).kind() == errc::cancelled);
  CHECK(env.stats().in_flight == 0);
  CHECK(env.stats().cancelled == 1);  // unit 2's held realization saw the stop
  CHECK(env.started() == seq({0, 1, 2}));

  env.check_unit(u0.module(), 0);  // the consumer's units are still whole
  env.check_unit(u1.module(), 1);
  CHECK(env.stats().live_weights == 4);
  u0.release();
  u1.release();
  CHECK(env.stats().live_weights == 0);
  env.close(pipeline);
}

TEST_CASE("pipeline engine – a cancellation after async_next has waited once still stops the pipeline",
          "[engine][pipeline][fake][cancel]") {
  // async_next waits for a unit to start (the look-ahead is full), then for its load. Asio
  // clears the coroutine's cancellation slot when the first wait completes; a cancellation
  // during the second must still stop the pipeline (it used to be lost: the consumer was told
  // nothing until the held load finished on its own, and a consumer gone by then left the
  // producer waiting for budget for ever).
  PipelineEnv env;
  FakeGate unit2 = env.device.hold(FakeOp::materialize, "layers.2.a", /*wake_on_stop=*/true);
  Pipeline pipeline(*env.source, units(), make_layer, env.device, {.lookahead = 1, .passes = 0});
  run_ready_handlers(env.ctx);
  CHECK(env.started() == seq({0, 1}));
  Pipeline::Unit u0 = env.next(pipeline);
  Pipeline::Unit u1 = env.next(pipeline);

  asio::cancellation_signal cancel;
  Outcome<Pipeline::Unit> f;
  pipeline.async_next(asio::bind_cancellation_slot(cancel.slot(), f.handler()));
  run_ready_handlers(env.ctx);
  CHECK_FALSE(f.ready());  // nothing started: the consumer holds K + 1 units
  u0.release();            // room for unit 2, which the gate holds
  run_ready_handlers(env.ctx);
  CHECK(env.started() == seq({0, 1, 2}));
  CHECK_FALSE(f.ready());
  cancel.emit(asio::cancellation_type::terminal);
  run_ready_handlers(env.ctx);
  REQUIRE(f.ready());  // the held load woke on the stop and returned
  CHECK(failure_of(env.ctx, f).kind() == errc::cancelled);
  CHECK_FALSE(unit2.is_open());
  CHECK(env.stats().in_flight == 0);
  unit2.open();
  env.check_unit(u1.module(), 1);
  u1.release();
  env.close(pipeline);
}

TEST_CASE("pipeline engine – closing stops held loads and completes only once every one has returned",
          "[engine][pipeline][fake][cancel]") {
  PipelineEnv env;
  FakeGate all = env.device.hold(FakeOp::materialize, "");
  Pipeline pipeline(*env.source, units(), make_layer, env.device, {.lookahead = 2, .concurrent_loads = 3});
  run_ready_handlers(env.ctx);
  CHECK(env.started() == seq({0, 1, 2}));
  CHECK(env.stats().waiting == 6);
  Outcome<void> closed;
  pipeline.async_close(closed.handler());
  run_ready_handlers(env.ctx);
  CHECK_FALSE(closed.ready());
  all.open();
  run_until_ready(env.ctx, closed);
  CHECK(env.stats().cancelled == 6);
  CHECK(env.stats().in_flight == 0);
  CHECK(env.stats().live_weights == 0);
  CHECK(pipeline.stats().resident_bytes == 0);
  Outcome<Pipeline::Unit> next = PipelineEnv::ask(pipeline);
  CHECK(failure_of(env.ctx, next).kind() == errc::cancelled);
}

TEST_CASE("pipeline engine – keep_on_host promotes released units on the next pass instead of reading them",
          "[engine][pipeline][fake][transfer]") {
  PipelineEnv env;
  FakeExecutor park(env.device);
  {
    Pipeline pipeline(*env.source, units(), make_layer, env.device, {.lookahead = 1, .passes = 2},
                      engine::KeepOnHost<FakeExecutor>{park});
    std::vector<std::size_t> seen;
    while (Pipeline::Unit unit = env.next(pipeline)) {
      seen.push_back(unit.index());
      env.check_unit(unit.module(), unit.index());
    }
    CHECK(seen.size() == 2 * units_n);
    env.close(pipeline);
    const FakeStats s = env.stats();
    for (std::size_t i = 0; i < units_n; ++i) {
      CHECK(s.reads_of(fmt::format("layers.{}.a", i)) == 1);  // read on the first pass only
      CHECK(s.reads_of(fmt::format("layers.{}.b", i)) == 1);
    }
    CHECK(s.demotes == 2 * units_n);
    CHECK(s.promotes == 2 * units_n);
    CHECK(s.live_host_buffers == 2 * units_n);  // parked while the pipeline lives
    const engine::PipelineStats ps = pipeline.stats();
    REQUIRE(ps.units.size() == 2 * units_n);
    for (std::size_t k = 0; k < 2 * units_n; ++k) CHECK(ps.units[k].from_host == (k >= units_n));
    CHECK(ps.parked_bytes == units_n * unit_bytes);
  }
  CHECK(env.stats().live_host_buffers == 0);
  CHECK(env.stats().live_weights == 0);
}

TEST_CASE("pipeline engine – a failed transfer surfaces at that unit on the later pass", "[engine][pipeline][fake]") {
  PipelineEnv env;
  FakeExecutor park(env.device);
  SECTION("promote") { env.device.fail(FakeOp::promote, "layers.3.a", errc::backend_failure); }
  SECTION("demote") { env.device.fail(FakeOp::demote, "layers.3.a", errc::out_of_memory); }
  Pipeline pipeline(*env.source, units(), make_layer, env.device, {.lookahead = 1, .passes = 2},
                    engine::KeepOnHost<FakeExecutor>{park});
  std::vector<std::pair<std::size_t, std::size_t>> seen;
  std::exception_ptr failure;
  for (;;) {
    Outcome<Pipeline::Unit> f = PipelineEnv::ask(pipeline);
    try {
      Pipeline::Unit unit = run_until_ready(env.ctx, f);
      if (!unit) break;
      seen.emplace_back(unit.pass(), unit.index());
    } catch (...) {
      failure = std::current_exception();
      break;
    }
  }
  std::vector<std::pair<std::size_t, std::size_t>> expected;
  for (std::size_t i = 0; i < units_n; ++i) expected.emplace_back(0, i);
  for (std::size_t i = 0; i < 3; ++i) expected.emplace_back(1, i);
  CHECK(seen == expected);
  REQUIRE(failure);
  try {
    std::rethrow_exception(failure);
  } catch (const Error& e) {
    CHECK((e.kind() == errc::backend_failure || e.kind() == errc::out_of_memory));
    CHECK_THAT(e.context().parameter, Catch::StartsWith("layers.3"));
    CHECK(e.context().tensor == "layers.3.a");
  }
  env.close(pipeline);
  CHECK(env.stats().in_flight == 0);
  CHECK(env.stats().live_weights == 0);
}
