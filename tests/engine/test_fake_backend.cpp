// The fake backend's own scripting and counters, so that what the engine tests assert with them
// means what it says: a gate holds until opened (or, when asked, until the stop), turns delay
// by exactly that many loop turns, a failure fires only as often as scripted, executor work
// waits for its predecessors, and misuse (finishing early, binding unvalidated) is counted.

#include "support/fake_backend.hpp"

#include <catch2/catch.hpp>
#include <memory>
#include <stop_token>
#include <string>
#include <vector>

#include "eredu/core/error.hpp"
#include "eredu/engine/backend/in_place_backend.hpp"
#include "eredu/engine/backend/parameter_backend.hpp"
#include "eredu/engine/backend/submission_backend.hpp"
#include "eredu/engine/backend/transfer_backend.hpp"
#include "support/checkpoint_fixture.hpp"

using namespace eredu;
using namespace eredu::test;

namespace {

struct Env {
  TestCheckpoint ckpt{{{"a", DType::BF16, {4, 8}}, {"b", DType::F32, {16}}}};
  asio::io_context ctx;
  std::unique_ptr<io::CheckpointSource> source;
  FakeDevice device;

  explicit Env(FakeReads reads = FakeReads::through_pool) : device(ctx.get_executor(), reads) {
    source = io::CheckpointSource::open(ctx.get_executor(), ckpt.path, small_source_options());
  }
  FakeMaterialization start(const std::string& key, std::stop_token stop = {}) {
    io::TensorReadRequest request{key};
    return FakeBackend::materialize(*source, request, device, std::move(stop));
  }
};

}  // namespace

TEST_CASE("fake backend – satisfies every backend concept the engine has", "[engine][fake]") {
  STATIC_REQUIRE(engine::ParameterBackend<FakeBackend>);
  STATIC_REQUIRE(engine::SubmissionBackend<FakeBackend>);
  STATIC_REQUIRE(engine::TransferBackend<FakeBackend>);
  STATIC_REQUIRE(engine::InPlaceBackend<FakeBackend>);
}

TEST_CASE("fake backend – a gate holds a realization and its lease until opened", "[engine][fake]") {
  Env env;
  FakeGate gate = env.device.hold(FakeOp::materialize, "a");
  FakeMaterialization a = env.start("a");
  FakeMaterialization b = env.start("b");
  run_until(env.ctx, [&] { return env.device.stats().waiting == 1 && b.done.ready(); });
  CHECK_FALSE(a.done.ready());
  CHECK(env.source->pool().in_use() > 0);  // a holds its lease while it waits
  CHECK(env.device.stats().in_flight == 1);
  gate.open();
  drive_until(env.ctx, a.done);
  CHECK(to_vector(FakeBackend::finish_materialization(std::move(a)).bytes()) == env.ckpt.bytes("a"));
  CHECK(env.source->pool().in_use() == 0);
  CHECK(env.device.stats().completed_keys == std::vector<std::string>{"b", "a"});
}

TEST_CASE("fake backend – a gate that wakes on the stop ends with cancelled, one that does not, waits",
          "[engine][fake]") {
  Env env;
  FakeGate interruptible = env.device.hold(FakeOp::materialize, "a", true);
  FakeGate firm = env.device.hold(FakeOp::materialize, "b");
  std::stop_source stop;
  FakeMaterialization a = env.start("a", stop.get_token());
  FakeMaterialization b = env.start("b", stop.get_token());
  run_until(env.ctx, [&] { return env.device.stats().waiting == 2; });
  stop.request_stop();
  drive_until(env.ctx, a.done);
  CHECK(is_cancellation(a.done.error()));
  run_ready_handlers(env.ctx);
  CHECK_FALSE(b.done.ready());
  firm.open();
  drive_until(env.ctx, b.done);
  CHECK(is_cancellation(b.done.error()));
  CHECK(env.device.stats().cancelled == 2);
  interruptible.open();
}

TEST_CASE("fake backend – turns delay a realization by exactly that many loop turns", "[engine][fake]") {
  Env env(FakeReads::bypass);
  env.device.delay(FakeOp::materialize, "a", 3);
  FakeMaterialization a = env.start("a");
  FakeMaterialization b = env.start("b");
  std::size_t turns = 0;
  while (!a.done.ready()) {
    env.ctx.restart();
    turns += env.ctx.run_one();
  }
  CHECK(b.done.ready());
  CHECK(turns >= 4);  // one turn every realization takes, plus the three scripted
  CHECK(env.device.stats().completed_keys == std::vector<std::string>{"b", "a"});
  CHECK(to_vector(FakeBackend::finish_materialization(std::move(a)).bytes()) ==
        fake_tensor_bytes(env.source->catalog().at("a")));
}

TEST_CASE("fake backend – a scripted failure fires as often as scripted, typed and named", "[engine][fake]") {
  Env env;
  env.device.fail(FakeOp::materialize, "a", errc::io_error, {.times = 1});
  env.device.fail(FakeOp::materialize, "b", errc::out_of_memory, {.at = FailAt::start, .times = 1});
  FakeMaterialization first = env.start("a");
  drive_until(env.ctx, first.done);
  try {
    std::rethrow_exception(first.done.error());
  } catch (const Error& e) {
    CHECK(e.kind() == errc::io_error);
    CHECK(e.context().tensor == "a");
  }
  FakeMaterialization second = env.start("a");
  drive_until(env.ctx, second.done);
  CHECK(second.done.error() == nullptr);
  CHECK_THROWS_AS(env.start("b"), BackendError);  // out_of_memory: a backend kind
  FakeMaterialization third = env.start("b");
  drive_until(env.ctx, third.done);
  CHECK(third.done.error() == nullptr);
  const FakeStats s = env.device.stats();
  CHECK(s.start_failures == 1);
  CHECK(s.failed == 1);
  CHECK(s.succeeded == 2);
}

TEST_CASE("fake backend – misuse is counted: finishing early, binding a weight never validated", "[engine][fake]") {
  Env env;
  FakeGate gate = env.device.hold(FakeOp::materialize, "a");
  FakeMaterialization a = env.start("a");
  CHECK_THROWS_AS(FakeBackend::finish_materialization(std::move(a)), std::logic_error);
  CHECK(env.device.stats().finish_misuse == 1);
  gate.open();
  drive_until(env.ctx, a.done);
  FakeWeight w = FakeBackend::finish_materialization(std::move(a));

  FakeParameter validated(DType::BF16, {4, 8}), unvalidated(DType::BF16, {4, 8});
  FakeBackend::validate_bind(validated, w);
  FakeBackend::bind(validated, FakeBackend::share_materialized_weight(w));
  CHECK(env.device.stats().unvalidated_binds == 0);
  FakeBackend::bind(unvalidated, FakeBackend::share_materialized_weight(w));
  CHECK(env.device.stats().unvalidated_binds == 1);
  CHECK(env.device.stats().live_weights == 1);  // three handles, one storage
}

TEST_CASE("fake backend – executor work waits for its predecessors, a failed one fails it", "[engine][fake]") {
  Env env;
  FakeMaterialization a = env.start("a");
  drive_until(env.ctx, a.done);
  FakeWeight w = FakeBackend::finish_materialization(std::move(a));
  FakeExecutor ex(env.device);

  CompletionSource before;
  FakeBackend::order_after(before.completion(), ex);
  auto [host, demoted] = FakeBackend::demote(ex, w);
  run_ready_handlers(env.ctx);
  CHECK_FALSE(demoted.ready());
  before.complete();
  drive_until(env.ctx, demoted);
  CHECK(demoted.error() == nullptr);
  CHECK(to_vector(host.bytes()) == env.ckpt.bytes("a"));
  drive_until(env.ctx, FakeBackend::submit(ex));

  FakeExecutor failing(env.device);
  FakeBackend::order_after(Completion::failed(std::make_exception_ptr(Error(errc::backend_failure, {}, "upstream"))),
                           failing);
  auto [back, promoted] = FakeBackend::promote(failing, host);
  drive_until(env.ctx, promoted);
  CHECK(promoted.error() != nullptr);
  CHECK(env.device.stats().executor_ops == 2);
}
