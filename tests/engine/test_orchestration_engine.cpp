// The materialize/bind orchestration as an engine test, over the fake backend: one realization
// per owner and none for aliases; a failure reported only once every realization in flight
// has finished, naming the root cause, never the cancellations it caused; cancellation; a
// rejected bind publishing nothing; every lease back. Scripted gates make each interleaving
// happen on every run.

#include <asio/bind_cancellation_slot.hpp>
#include <asio/cancellation_signal.hpp>
#include <asio/use_future.hpp>
#include <catch2/catch.hpp>
#include <cerrno>
#include <future>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "eredu/core/error.hpp"
#include "eredu/engine/orchestration/engine_error.hpp"
#include "eredu/engine/orchestration/load.hpp"
#include "eredu/engine/orchestration/materialize.hpp"
#include "support/checkpoint_fixture.hpp"
#include "support/fake_backend.hpp"
#include "support/reference_recipe.hpp"
#include "support/slot_module.hpp"

using namespace eredu;
using namespace eredu::test;
using engine::WeightBinding;
using engine::WeightBindingPlan;
using R = engine::DerivedWeightRecipe;
using Module = SlotModule<FakeParameter>;

namespace {

std::vector<synth::TensorSpec> specs() {
  return {
      {"embed", DType::BF16, {8, 16}}, {"q", DType::BF16, {8, 16}},     {"k", DType::BF16, {8, 16}},
      {"v", DType::BF16, {8, 16}},     {"gate", DType::F32, {4, 6}},    {"up", DType::F32, {4, 10}},
      {"big", DType::BF16, {64, 48}},  {"norm", DType::F16, {3, 5, 7}},
  };
}

/// The module the plan loads: a plain tensor, a fused concat, a concat along columns, a cast,
/// a 3-d tensor, and a tied head.
Module make_module() {
  return Module({
      {"embed.weight", DType::BF16, {8, 16}},
      {"layers.0.attn.qkv.weight", DType::BF16, {24, 16}},
      {"layers.0.mlp.gate_up.weight", DType::F32, {4, 16}},
      {"layers.0.mlp.big.weight", DType::F32, {64, 48}},
      {"layers.0.norm.weight", DType::F16, {3, 5, 7}},
      {"lm_head.weight", DType::BF16, {8, 16}},
  });
}

/// Five owners (in this order) and one alias; the owners' first source keys are embed, q,
/// gate, big, norm.
std::vector<WeightBinding> bindings() {
  return {
      WeightBinding::tensor("embed.weight", "embed", Selection::all(), 256),
      WeightBinding::from_recipe("layers.0.attn.qkv.weight",
                                 R::concat({R::source("q"), R::source("k"), R::source("v")}, 0), 768),
      WeightBinding::from_recipe("layers.0.mlp.gate_up.weight", R::concat({R::source("gate"), R::source("up")}, 1),
                                 256),
      WeightBinding::from_recipe("layers.0.mlp.big.weight", R::cast(R::source("big"), DType::F32), 64 * 48 * 4),
      WeightBinding::tensor("layers.0.norm.weight", "norm", Selection::all(), 210),
      WeightBinding::alias("lm_head.weight", "embed.weight", 256),
  };
}

/// Fails every read that touches [begin, end) of file 0 with EIO.
struct FailRange final : io::FaultInjector {
  std::uint64_t begin = 0, end = 0;
  io::ReadFault on_complete(std::uint32_t, std::uint64_t offset, std::uint64_t length) override {
    if (offset < end && offset + length > begin) return {.error = EIO};
    return {};
  }
};

struct OrchestrationEnv {
  TestCheckpoint ckpt{specs()};
  asio::io_context ctx;
  FailRange faults;
  std::unique_ptr<io::CheckpointSource> source;
  FakeDevice device;
  WeightBindingPlan plan{bindings()};

  explicit OrchestrationEnv(FakeReads reads = FakeReads::through_pool) : device(ctx.get_executor(), reads) {
    io::SourceOptions options = small_source_options();
    options.reader.faults = &faults;
    source = io::CheckpointSource::open(ctx.get_executor(), ckpt.path, options);
  }
  /// Starts async_load of `plan` into `module`.
  Outcome<void> start_load(Module& module, const WeightBindingPlan& p) {
    Outcome<void> done;
    engine::async_load<FakeBackend>(module, *source, p, device, done.handler());
    return done;
  }
  /// Loads `plan` into `module`; rethrows the failure.
  void load(Module& module, const WeightBindingPlan& p) {
    auto done = start_load(module, p);
    run_until_ready(ctx, done);
  }
  FakeStats stats() const { return device.stats(); }
  /// The bytes a correct load gives each slot.
  std::vector<std::byte> expected(const std::string& slot) const {
    auto cat = [&](std::initializer_list<const char*> names) {
      std::vector<std::byte> out;
      for (const char* n : names) out.insert(out.end(), ckpt.bytes(n).begin(), ckpt.bytes(n).end());
      return out;
    };
    if (slot == "embed.weight" || slot == "lm_head.weight") return ckpt.bytes("embed");
    if (slot == "layers.0.attn.qkv.weight") return cat({"q", "k", "v"});
    if (slot == "layers.0.mlp.gate_up.weight")
      return reference_concat({{ckpt.bytes("gate"), {4, 6}}, {ckpt.bytes("up"), {4, 10}}}, 1, 4);
    if (slot == "layers.0.mlp.big.weight") return reference_cast(ckpt.bytes("big"), DType::BF16, DType::F32);
    return ckpt.bytes("norm");
  }
};

/// True when no slot of `module` holds a weight.
bool nothing_bound(const Module& module) {
  bool any = false;
  module.for_each([&](const std::string&, const FakeParameter& p) { any = any || p.bound(); });
  return !any;
}

}  // namespace

TEST_CASE("orchestration engine – a unit loads whole: one realization per owner, none for an alias",
          "[engine][orchestration][fake]") {
  OrchestrationEnv env;
  Module model = make_module();
  env.load(model, env.plan);
  const FakeStats s = env.stats();
  CHECK(s.started == 5);
  CHECK(s.succeeded == 5);
  CHECK(s.finished == 5);
  CHECK(s.in_flight == 0);
  CHECK(s.finish_misuse == 0);  // the engine took each weight only once its completion was ready
  CHECK(s.started_keys == std::vector<std::string>{"embed", "q", "gate", "big", "norm"});
  CHECK(s.reads_of("embed") == 1);  // the tied head was neither read again ...
  CHECK(s.shares == 1);             // ... nor realized: it shares the owner's storage
  CHECK(s.live_weights == 5);
  CHECK(s.validations == 6);
  CHECK(s.binds == 6);
  CHECK(s.unvalidated_binds == 0);  // every bind was of a weight validate_bind had accepted
  CHECK(model.slot("lm_head.weight").value.shares_storage_with(model.slot("embed.weight").value));
  model.for_each([&](const std::string& name, const FakeParameter& p) {
    INFO(name);
    CHECK(to_vector(p.value.bytes()) == env.expected(name));
  });
  CHECK(env.source->pool().in_use() == 0);
}

TEST_CASE("orchestration engine – a failure is reported only once every realization in flight has finished",
          "[engine][orchestration][fake]") {
  OrchestrationEnv env;
  Module model = make_module();
  // Every owner reads and waits, holding its last lease; then gate_up fails while the four
  // others are still held.
  std::vector<FakeGate> gates;
  for (const char* key : {"embed", "q", "big", "norm"}) gates.push_back(env.device.hold(FakeOp::materialize, key));
  FakeGate gate_up = env.device.hold(FakeOp::materialize, "gate");
  env.device.fail(FakeOp::materialize, "gate", errc::io_error);
  auto done = env.start_load(model, env.plan);
  run_until(env.ctx, [&] { return env.stats().waiting == 5; });
  gate_up.open();
  run_until(env.ctx, [&] { return env.stats().failed == 1; });
  run_ready_handlers(env.ctx);
  CHECK_FALSE(done.ready());  // four realizations are still in flight: nothing is reported yet
  CHECK(env.stats().in_flight == 4);
  CHECK(env.source->pool().in_use() > 0);  // and they still hold their leases

  for (std::size_t i = 0; i < 3; ++i) gates[i].open();
  run_until(env.ctx, [&] { return env.stats().in_flight == 1; });
  run_ready_handlers(env.ctx);
  CHECK_FALSE(done.ready());  // one is still in flight

  gates[3].open();
  const Error e = failure_of(env.ctx, done);
  CHECK(e.kind() == errc::io_error);
  CHECK(e.context().parameter == "layers.0.mlp.gate_up.weight");
  CHECK(e.context().tensor == "gate");
  const FakeStats s = env.stats();
  CHECK(s.failed == 1);
  CHECK(s.cancelled == 4);  // each held realization saw the stop when it resumed
  CHECK(s.succeeded == 0);
  CHECK(s.in_flight == 0);
  CHECK(s.binds == 0);
  CHECK(s.live_weights == 0);  // the unit's weights were dropped
  CHECK(env.source->pool().in_use() == 0);
  CHECK(nothing_bound(model));
}

TEST_CASE("orchestration engine – the root cause is reported, not the cancellations it caused",
          "[engine][orchestration][fake]") {
  OrchestrationEnv env;
  Module model = make_module();

  SECTION("the first owner stops because a later one failed") {
    // embed (owner 0) waits interruptibly; big (owner 3) fails: embed completes cancelled
    // first in plan order, and the error must still be big's.
    FakeGate embed = env.device.hold(FakeOp::materialize, "embed", /*wake_on_stop=*/true);
    env.device.fail(FakeOp::materialize, "big", errc::out_of_memory);
    auto done = env.start_load(model, env.plan);
    const Error e = failure_of(env.ctx, done);
    CHECK(e.kind() == errc::out_of_memory);
    CHECK(e.family() == error_family::backend);
    CHECK(e.context().parameter == "layers.0.mlp.big.weight");
    CHECK_FALSE(embed.is_open());  // embed was woken by the stop, not by its gate
    CHECK(env.stats().cancelled >= 1);
    CHECK(env.stats().failed == 1);
    embed.open();
  }
  SECTION("an owner fails to start: those already started are stopped and awaited") {
    env.device.fail(FakeOp::materialize, "norm", errc::out_of_memory, {.at = FailAt::start});
    auto done = env.start_load(model, env.plan);
    const Error e = failure_of(env.ctx, done);
    CHECK(e.kind() == errc::out_of_memory);
    CHECK(e.context().parameter == "layers.0.norm.weight");
    const FakeStats s = env.stats();
    CHECK(s.start_failures == 1);
    CHECK(s.started == 4);    // owners 0-3 had started before norm's start failed
    CHECK(s.cancelled == 4);  // and every one of them was stopped at its first step
    CHECK(s.in_flight == 0);
  }
  CHECK(env.stats().live_weights == 0);
  CHECK(env.stats().binds == 0);
  CHECK(env.source->pool().in_use() == 0);
  CHECK(nothing_bound(model));
}

TEST_CASE("orchestration engine – cancellation stops every realization, waits for each, and publishes nothing",
          "[engine][orchestration][fake][cancel]") {
  OrchestrationEnv env;
  Module model = make_module();
  asio::cancellation_signal cancel;

  SECTION("realizations that cannot be interrupted are awaited") {
    FakeGate all = env.device.hold(FakeOp::materialize, "");
    Outcome<void> done;
    engine::async_load<FakeBackend>(model, *env.source, env.plan, env.device,
                                    asio::bind_cancellation_slot(cancel.slot(), done.handler()));
    run_until(env.ctx, [&] { return env.stats().waiting == 5; });
    cancel.emit(asio::cancellation_type::terminal);
    run_ready_handlers(env.ctx);
    CHECK_FALSE(done.ready());  // the cancellation waits for the realizations it stopped
    CHECK(env.stats().in_flight == 5);
    all.open();
    const Error e = failure_of(env.ctx, done);
    CHECK(e.kind() == errc::cancelled);
  }
  SECTION("waits that wake on the stop end at once") {
    FakeGate all = env.device.hold(FakeOp::materialize, "", /*wake_on_stop=*/true);
    Outcome<void> done;
    engine::async_load<FakeBackend>(model, *env.source, env.plan, env.device,
                                    asio::bind_cancellation_slot(cancel.slot(), done.handler()));
    run_until(env.ctx, [&] { return env.stats().waiting == 5; });
    cancel.emit(asio::cancellation_type::terminal);
    const Error e = failure_of(env.ctx, done);
    CHECK(e.kind() == errc::cancelled);
    CHECK_FALSE(all.is_open());
    all.open();
  }
  const FakeStats s = env.stats();
  CHECK(s.cancelled == 5);
  CHECK(s.in_flight == 0);
  CHECK(s.live_weights == 0);
  CHECK(s.binds == 0);
  CHECK(env.source->pool().in_use() == 0);
  CHECK(nothing_bound(model));
}

TEST_CASE("orchestration engine – a cancellation after the start window filled starts nothing more",
          "[engine][orchestration][fake][cancel]") {
  // More owners than the window of realizations in flight: the orchestration waits for room
  // between starts, and Asio clears the coroutine's cancellation slot after every such wait.
  // A cancellation then must still stop the unit, and the owners not started stay unstarted
  // (a unit of 100 000 tiny tensors ended only once every one had been read).
  constexpr std::size_t owners = engine::detail::max_realizations_in_flight * 3;
  std::vector<synth::TensorSpec> tensors;
  std::vector<SlotDeclaration> slots;
  std::vector<WeightBinding> plan_bindings;
  for (std::size_t i = 0; i < owners; ++i) {
    const std::string key = fmt::format("t{}", i);
    tensors.push_back({key, DType::F32, {2}});
    slots.push_back({key + ".weight", DType::F32, {2}});
    plan_bindings.push_back(WeightBinding::tensor(key + ".weight", key, Selection::all(), 8));
  }
  TestCheckpoint ckpt{tensors};
  asio::io_context ctx;
  auto source = io::CheckpointSource::open(ctx.get_executor(), ckpt.path, small_source_options());
  FakeDevice device(ctx.get_executor(), FakeReads::bypass);
  device.delay(FakeOp::materialize, "", 3);  // each realization takes a few turns of the loop
  Module model(slots);
  asio::cancellation_signal cancel;
  Outcome<void> done;
  engine::async_load<FakeBackend>(model, *source, WeightBindingPlan(plan_bindings), device,
                                  asio::bind_cancellation_slot(cancel.slot(), done.handler()));
  // Past the first window: the orchestration has waited for room at least once.
  run_until(ctx, [&] { return device.stats().started > engine::detail::max_realizations_in_flight + 8; });
  REQUIRE_FALSE(done.ready());
  cancel.emit(asio::cancellation_type::terminal);
  const Error e = failure_of(ctx, done);
  CHECK(e.kind() == errc::cancelled);
  const FakeStats s = device.stats();
  CHECK(s.started < owners);
  CHECK(s.in_flight == 0);
  CHECK(s.live_weights == 0);
  CHECK(s.binds == 0);
  CHECK(nothing_bound(model));
}

TEST_CASE("orchestration engine – a weight validate_bind rejects publishes nothing: the module keeps its weights",
          "[engine][orchestration][fake]") {
  OrchestrationEnv env;
  Module model = make_module();
  env.load(model, env.plan);
  std::vector<const std::byte*> before;
  model.for_each([&](const std::string&, const FakeParameter& p) { before.push_back(p.value.data()); });
  const std::size_t binds = env.stats().binds;

  env.device.fail(FakeOp::validate_bind, "norm", errc::bind_shape_mismatch);
  auto done = env.start_load(model, env.plan);
  const Error e = failure_of(env.ctx, done);
  CHECK(e.kind() == errc::bind_shape_mismatch);
  CHECK(e.context().parameter == "layers.0.norm.weight");
  std::vector<const std::byte*> after;
  model.for_each([&](const std::string&, const FakeParameter& p) { after.push_back(p.value.data()); });
  CHECK(after == before);             // every slot still holds its first weight
  CHECK(env.stats().binds == binds);  // nothing was bound at all
  CHECK(env.stats().rejections == 1);
  CHECK(env.stats().live_weights == 5);  // the second unit's weights are gone
  CHECK(env.source->pool().in_use() == 0);
}

TEST_CASE("orchestration engine – a plan that contradicts the catalog is refused before the backend is asked",
          "[engine][orchestration][fake]") {
  OrchestrationEnv env;
  Module model = make_module();
  auto b = bindings();
  b[3] = WeightBinding::from_recipe("layers.0.mlp.big.weight", R::cast(R::source("big"), DType::F32), 1234);
  WeightBindingPlan wrong(std::move(b));
  auto done = env.start_load(model, wrong);
  const Error e = failure_of(env.ctx, done);
  CHECK(e.kind() == errc::byte_mismatch);
  CHECK(env.stats().started == 0);
  CHECK(env.stats().read_keys.empty());
  CHECK(env.source->pool().high_water() == 0);
}

TEST_CASE("orchestration engine – realizations completing in any order give the same unit",
          "[engine][orchestration][fake]") {
  OrchestrationEnv env(FakeReads::bypass);
  env.device.delay(FakeOp::materialize, "embed", 6);
  env.device.delay(FakeOp::materialize, "q", 3);
  env.device.delay(FakeOp::materialize, "norm", 1);
  Module model = make_module();
  env.load(model, env.plan);
  const FakeStats s = env.stats();
  CHECK(s.started_keys == std::vector<std::string>{"embed", "q", "gate", "big", "norm"});
  CHECK(s.completed_keys == std::vector<std::string>{"gate", "big", "norm", "q", "embed"});

  FakeDevice plain(env.ctx.get_executor(), FakeReads::bypass);
  Module reference = make_module();
  auto done = engine::async_load<FakeBackend>(reference, *env.source, env.plan, plain, asio::use_future);
  run_until_ready(env.ctx, done);
  CHECK(plain.stats().completed_keys == plain.stats().started_keys);
  model.for_each([&](const std::string& name, const FakeParameter& p) {
    INFO(name);
    CHECK(to_vector(p.value.bytes()) == to_vector(reference.slot(name).value.bytes()));
  });
}

TEST_CASE("orchestration engine – async_materialize hands back every binding, dropping the unit frees them",
          "[engine][orchestration][fake]") {
  OrchestrationEnv env;
  {
    auto done = engine::async_materialize<FakeBackend>(*env.source, env.plan, env.device, asio::use_future);
    engine::MaterializedUnit<FakeBackend> unit = run_until_ready(env.ctx, done);
    CHECK(unit.size() == 6);
    const FakeWeight* embed = unit.find(engine::ParameterId("embed.weight"));
    const FakeWeight* head = unit.find(engine::ParameterId("lm_head.weight"));
    REQUIRE(embed);
    REQUIRE(head);
    CHECK(head->shares_storage_with(*embed));
    CHECK(env.stats().live_weights == 5);
  }
  CHECK(env.stats().live_weights == 0);
  CHECK(env.stats().binds == 0);
}

TEST_CASE("orchestration engine – an I/O error on the real read path fails the unit, file and parameter named",
          "[engine][orchestration][fake]") {
  OrchestrationEnv env;
  const io::TensorInfo& big = env.source->catalog().at("big");
  env.faults.begin = big.offset + big.nbytes / 2;
  env.faults.end = env.faults.begin + 1;
  Module model = make_module();
  auto done = env.start_load(model, env.plan);
  const Error e = failure_of(env.ctx, done);
  CHECK(e.kind() == errc::io_error);
  CHECK(e.context().parameter == "layers.0.mlp.big.weight");
  CHECK_THAT(e.what(), Catch::Contains(env.ckpt.path.string()));
  CHECK(env.stats().in_flight == 0);
  CHECK(env.stats().live_weights == 0);
  CHECK(env.source->pool().in_use() == 0);
  CHECK(nothing_bound(model));
}
