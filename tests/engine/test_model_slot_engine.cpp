// ModelSlot and InPlaceModelSlot as engine tests, over the fake backend: a failed swap — a
// realization, a rejected bind, the canary, a cancellation, a torn in-place copy — leaves the
// serving version (object, storage, bytes) as it was; a second swap is refused while a held
// one runs; the canary sees the new model before anyone can read it; the in-place copy keeps
// addresses and waits for readers in flight. Gates make each interleaving deterministic.

#include <asio/bind_cancellation_slot.hpp>
#include <asio/bind_executor.hpp>
#include <asio/cancellation_signal.hpp>
#include <catch2/catch.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "eredu/core/error.hpp"
#include "eredu/engine/serving/in_place_model_slot.hpp"
#include "eredu/engine/serving/model_slot.hpp"
#include "support/checkpoint_fixture.hpp"
#include "support/fake_backend.hpp"
#include "support/reference_recipe.hpp"
#include "support/slot_module.hpp"

using namespace eredu;
using namespace eredu::test;
using engine::WeightBinding;
using engine::WeightBindingPlan;
using R = engine::DerivedWeightRecipe;
using Model = SlotModule<FakeParameter>;
using Slot = engine::ModelSlot<FakeBackend, Model>;
using InPlace = engine::InPlaceModelSlot<FakeBackend, Model>;

namespace {

std::vector<synth::TensorSpec> slot_specs() {
  return {{"w", DType::BF16, {16, 12}}, {"b", DType::BF16, {24}}, {"n", DType::F32, {12}}};
}

/// A cast matrix, a kept vector, a kept norm and a tied alias of the vector.
Model make_model() {
  return Model(
      {{"w", DType::F32, {16, 12}}, {"b", DType::BF16, {24}}, {"n", DType::F32, {12}}, {"b_tied", DType::BF16, {24}}});
}

std::vector<WeightBinding> slot_bindings() {
  return {
      WeightBinding::from_recipe("w", R::cast(R::source("w"), DType::F32), 16 * 12 * 4),
      WeightBinding::tensor("b", "b", Selection::all(), 24 * 2),
      WeightBinding::tensor("n", "n", Selection::all(), 12 * 4),
      WeightBinding::alias("b_tied", "b", 24 * 2),
  };
}

/// Every slot's bytes, in declaration order.
std::vector<std::vector<std::byte>> contents(const Model& m) {
  std::vector<std::vector<std::byte>> out;
  m.for_each([&](const std::string&, const FakeParameter& p) { out.push_back(to_vector(p.value.bytes())); });
  return out;
}

/// Every slot's storage address, in declaration order.
std::vector<const std::byte*> addresses(const Model& m) {
  std::vector<const std::byte*> out;
  m.for_each([&](const std::string&, const FakeParameter& p) { out.push_back(p.value.data()); });
  return out;
}

/// What a correct load of `ckpt` puts in each slot.
std::vector<std::vector<std::byte>> expected(const TestCheckpoint& ckpt) {
  return {reference_cast(ckpt.bytes("w"), DType::BF16, DType::F32), ckpt.bytes("b"), ckpt.bytes("n"), ckpt.bytes("b")};
}

struct SlotEnv {
  TestCheckpoint a{slot_specs(), 11};
  TestCheckpoint b{slot_specs(), 12};
  asio::io_context ctx;
  std::unique_ptr<io::CheckpointSource> source_a, source_b;
  FakeDevice device{ctx.get_executor()};
  FakeExecutor background{device};
  WeightBindingPlan plan{slot_bindings()};

  SlotEnv() {
    source_a = io::CheckpointSource::open(ctx.get_executor(), a.path, small_source_options());
    source_b = io::CheckpointSource::open(ctx.get_executor(), b.path, small_source_options());
  }
  FakeStats stats() const { return device.stats(); }

  Outcome<engine::SwapReport> start_swap(Slot& slot, io::CheckpointSource& source) {
    Outcome<engine::SwapReport> r;
    slot.async_swap(source, plan, device, r.handler());
    return r;
  }
  engine::SwapReport swap(Slot& slot, io::CheckpointSource& source) {
    Outcome<engine::SwapReport> r = start_swap(slot, source);
    return run_until_ready(ctx, r);
  }
  Outcome<engine::SwapReport> start_swap(InPlace& slot, io::CheckpointSource& source) {
    Outcome<engine::SwapReport> r;
    slot.async_swap(source, plan, device, background, r.handler());
    return r;
  }
  engine::SwapReport swap(InPlace& slot, io::CheckpointSource& source) {
    Outcome<engine::SwapReport> r = start_swap(slot, source);
    return run_until_ready(ctx, r);
  }
  /// The serving model's contents, read through async_read (delivered on the loop).
  std::vector<std::vector<std::byte>> read(InPlace& slot) {
    Outcome<InPlace::Reader> r;
    slot.async_read(asio::bind_executor(ctx, r.handler()));
    return contents(run_until_ready(ctx, r).model());
  }
};

/// A canary that rejects every version.
asio::awaitable<void> reject(const Model&) {
  throw std::runtime_error("the probe output is NaN");
  co_return;
}

}  // namespace

TEST_CASE("model slot engine – a swap publishes a whole version, a reader keeps the old one until it lets go",
          "[engine][swap][fake]") {
  SlotEnv env;
  Slot slot(make_model);
  CHECK(env.swap(slot, *env.source_a).generation == 1);
  std::shared_ptr<const Slot::Version> v1 = slot.current();
  REQUIRE(v1);
  CHECK(contents(v1->model) == expected(env.a));
  CHECK(v1->model.slot("b_tied").value.shares_storage_with(v1->model.slot("b").value));
  CHECK(env.stats().live_weights == 3);

  CHECK(env.swap(slot, *env.source_b).generation == 2);
  CHECK(contents(slot.current()->model) == expected(env.b));
  CHECK(contents(v1->model) == expected(env.a));  // the reader's version is whole
  CHECK(env.stats().live_weights == 6);           // and alive while it is held
  v1.reset();
  CHECK(env.stats().live_weights == 3);
  CHECK(env.stats().unvalidated_binds == 0);
}

TEST_CASE("model slot engine – a failed swap leaves the serving version: same object, storage and bytes",
          "[engine][swap][fake]") {
  SlotEnv env;
  Slot slot(make_model);
  env.swap(slot, *env.source_a);
  const std::shared_ptr<const Slot::Version> before = slot.current();
  const std::vector<const std::byte*> where = addresses(before->model);
  errc expected_kind{};
  Outcome<engine::SwapReport> r;
  asio::cancellation_signal cancel;  // outlives the swap it may cancel

  SECTION("a realization fails") {
    env.device.fail(FakeOp::materialize, "n", errc::io_error);
    expected_kind = errc::io_error;
    r = env.start_swap(slot, *env.source_b);
  }
  SECTION("validate_bind rejects a weight") {
    env.device.fail(FakeOp::validate_bind, "b", errc::bind_dtype_mismatch);
    expected_kind = errc::bind_dtype_mismatch;
    r = env.start_swap(slot, *env.source_b);
  }
  SECTION("the canary rejects the new model") {
    expected_kind = errc::canary_failed;
    slot.async_swap(*env.source_b, env.plan, env.device, {.canary = reject}, r.handler());
  }
  SECTION("the swap is cancelled while a realization is held") {
    FakeGate w = env.device.hold(FakeOp::materialize, "w");
    slot.async_swap(*env.source_b, env.plan, env.device, asio::bind_cancellation_slot(cancel.slot(), r.handler()));
    run_until(env.ctx, [&] { return env.stats().waiting == 1; });
    cancel.emit(asio::cancellation_type::terminal);
    run_ready_handlers(env.ctx);
    CHECK_FALSE(r.ready());  // the held realization has not returned
    CHECK(slot.swapping());
    w.open();
    expected_kind = errc::cancelled;
  }
  CHECK(failure_of(env.ctx, r).kind() == expected_kind);
  CHECK(slot.current() == before);
  CHECK(addresses(slot.current()->model) == where);
  CHECK(contents(slot.current()->model) == expected(env.a));
  CHECK(slot.generation() == 1);
  CHECK_FALSE(slot.swapping());
  CHECK(env.stats().in_flight == 0);
  CHECK(env.stats().live_weights == 3);  // only the serving version's weights
  CHECK(env.source_b->pool().in_use() == 0);

  env.device.clear_script();  // and a good swap still works
  CHECK(env.swap(slot, *env.source_b).generation == 2);
  CHECK(contents(slot.current()->model) == expected(env.b));
}

TEST_CASE("model slot engine – a second swap while one is held is refused, and the first still publishes",
          "[engine][swap][fake]") {
  SlotEnv env;
  Slot slot(make_model);
  env.swap(slot, *env.source_a);
  FakeGate w = env.device.hold(FakeOp::materialize, "w");
  Outcome<engine::SwapReport> first = env.start_swap(slot, *env.source_b);
  run_until(env.ctx, [&] { return env.stats().waiting == 1; });
  CHECK(slot.swapping());
  Outcome<engine::SwapReport> second = env.start_swap(slot, *env.source_a);
  CHECK(failure_of(env.ctx, second).kind() == errc::swap_in_progress);
  CHECK_FALSE(first.ready());
  w.open();
  CHECK(run_until_ready(env.ctx, first).generation == 2);
  CHECK(contents(slot.current()->model) == expected(env.b));
}

TEST_CASE("model slot engine – the canary sees the new model while the old one still serves", "[engine][swap][fake]") {
  SlotEnv env;
  Slot slot(make_model);
  env.swap(slot, *env.source_a);
  std::optional<std::uint64_t> serving_during_canary;
  bool saw_new_model = false;
  Outcome<engine::SwapReport> r;
  slot.async_swap(*env.source_b, env.plan, env.device,
                  {.origin = "b",
                   .canary = [&](const Model& m) -> asio::awaitable<void> {
                     serving_during_canary = slot.generation();
                     saw_new_model = contents(m) == expected(env.b);
                     co_return;
                   }},
                  r.handler());
  CHECK(run_until_ready(env.ctx, r).generation == 2);
  CHECK(serving_during_canary == 1u);
  CHECK(saw_new_model);
  CHECK(slot.current()->origin == "b");
}

TEST_CASE("in-place slot engine – a swap copies each owner into the serving storage: addresses kept",
          "[engine][swap][in-place][fake]") {
  SlotEnv env;
  InPlace slot(make_model);
  env.swap(slot, *env.source_a);  // the first swap binds
  CHECK(env.stats().overwrites == 0);
  CHECK(env.read(slot) == expected(env.a));
  std::vector<const std::byte*> where;
  {
    auto reader = slot.try_read();
    REQUIRE(reader);
    where = addresses(reader->model());
  }
  CHECK(env.swap(slot, *env.source_b).generation == 2);
  CHECK(env.stats().overwrites == 3);  // the three owners; the alias follows its owner's storage
  auto reader = slot.try_read();
  REQUIRE(reader);
  CHECK(addresses(reader->model()) == where);
  CHECK(contents(reader->model()) == expected(env.b));
  CHECK(reader->model().slot("b_tied").value.shares_storage_with(reader->model().slot("b").value));
  CHECK(env.stats().live_weights == 3);  // the staged set is gone
}

TEST_CASE("in-place slot engine – a failure before the copy changes no byte and copies nothing",
          "[engine][swap][in-place][fake]") {
  SlotEnv env;
  InPlace slot(make_model);
  env.swap(slot, *env.source_a);
  Outcome<engine::SwapReport> r;
  SECTION("a realization fails") {
    env.device.fail(FakeOp::materialize, "w", errc::unexpected_eof);
    r = env.start_swap(slot, *env.source_b);
    CHECK(failure_of(env.ctx, r).kind() == errc::unexpected_eof);
  }
  SECTION("validate_bind rejects a weight") {
    env.device.fail(FakeOp::validate_bind, "n", errc::bind_shape_mismatch);
    r = env.start_swap(slot, *env.source_b);
    CHECK(failure_of(env.ctx, r).kind() == errc::bind_shape_mismatch);
  }
  SECTION("the canary rejects the staged model") {
    slot.async_swap(*env.source_b, env.plan, env.device, env.background, {.canary = reject}, r.handler());
    CHECK(failure_of(env.ctx, r).kind() == errc::canary_failed);
  }
  CHECK(env.stats().overwrites == 0);
  CHECK(env.read(slot) == expected(env.a));
  CHECK(slot.generation() == 1);
  CHECK(env.stats().in_flight == 0);
  CHECK(env.stats().live_weights == 3);
}

TEST_CASE("in-place slot engine – a failed copy tears the slot: reads fail until a swap succeeds",
          "[engine][swap][in-place][fake]") {
  SlotEnv env;
  InPlace slot(make_model);
  env.swap(slot, *env.source_a);
  env.device.fail(FakeOp::overwrite, "w", errc::backend_failure, {.times = 1});
  Outcome<engine::SwapReport> r = env.start_swap(slot, *env.source_b);
  CHECK(failure_of(env.ctx, r).kind() == errc::backend_failure);
  CHECK(env.stats().executor_ops == 3);  // every copy was awaited, the failed one included
  try {
    slot.try_read();
    FAIL("a torn slot served a read");
  } catch (const Error& e) {
    CHECK(e.kind() == errc::backend_failure);
  }
  Outcome<InPlace::Reader> read;
  slot.async_read(asio::bind_executor(env.ctx, read.handler()));
  CHECK(failure_of(env.ctx, read).kind() == errc::backend_failure);

  CHECK(env.swap(slot, *env.source_b).generation == 2);  // the script allowed one failure
  CHECK(env.read(slot) == expected(env.b));
}

TEST_CASE("in-place slot engine – the copy waits for a reader in flight, and new reads wait for the copy",
          "[engine][swap][in-place][fake]") {
  SlotEnv env;
  InPlace slot(make_model);
  env.swap(slot, *env.source_a);
  std::optional<InPlace::Reader> held = slot.try_read();
  REQUIRE(held);
  FakeGate copies = env.device.hold(FakeOp::overwrite, "");
  Outcome<engine::SwapReport> r = env.start_swap(slot, *env.source_b);
  run_until(env.ctx, [&] { return env.stats().started == 6 && env.stats().in_flight == 0; });
  run_ready_handlers(env.ctx);
  CHECK_FALSE(slot.try_read().has_value());  // the gate is closed to new readers ...
  CHECK(env.stats().overwrites == 0);        // ... but nothing is copied under a reader in flight
  CHECK(contents(held->model()) == expected(env.a));

  held.reset();  // the request ends: the copy starts, and holds at the script's gate
  run_until(env.ctx, [&] { return env.stats().waiting == 3; });
  Outcome<InPlace::Reader> waiting_read;
  slot.async_read(asio::bind_executor(env.ctx, waiting_read.handler()));
  run_ready_handlers(env.ctx);
  CHECK_FALSE(waiting_read.ready());  // a new read waits for the copy
  CHECK_FALSE(r.ready());
  copies.open();
  CHECK(run_until_ready(env.ctx, r).generation == 2);
  InPlace::Reader after = run_until_ready(env.ctx, waiting_read);
  CHECK(after.generation() == 2);
  CHECK(contents(after.model()) == expected(env.b));
}

TEST_CASE("in-place slot engine – a second swap while one is held is refused", "[engine][swap][in-place][fake]") {
  SlotEnv env;
  InPlace slot(make_model);
  env.swap(slot, *env.source_a);
  FakeGate w = env.device.hold(FakeOp::materialize, "w");
  Outcome<engine::SwapReport> first = env.start_swap(slot, *env.source_b);
  run_until(env.ctx, [&] { return env.stats().waiting == 1; });
  Outcome<engine::SwapReport> second = env.start_swap(slot, *env.source_a);
  CHECK(failure_of(env.ctx, second).kind() == errc::swap_in_progress);
  w.open();
  CHECK(run_until_ready(env.ctx, first).generation == 2);
  CHECK(env.read(slot) == expected(env.b));
}
