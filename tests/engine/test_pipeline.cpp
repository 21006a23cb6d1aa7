// PrefetchPipeline on the CPU backend: order, bounded memory under a slow consumer and a slow
// reader, repeated passes (read again, or promoted from parked host copies), cancellation
// returning every lease and unit, and a failing unit surfacing exactly where it is.

#include <asio/bind_cancellation_slot.hpp>
#include <asio/cancellation_signal.hpp>
#include <asio/steady_timer.hpp>
#include <asio/use_future.hpp>
#include <atomic>
#include <catch2/catch.hpp>
#include <cerrno>
#include <chrono>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "cpu/cpu_fixture.hpp"
#include "eredu/core/error.hpp"
#include "eredu/cpu/convert.hpp"
#include "eredu/engine/serving/prefetch_pipeline.hpp"
#include "eredu/io/integrity/sha256.hpp"

using namespace eredu;
using namespace eredu::test;
using engine::DerivedWeightRecipe;
using engine::PipelineUnit;
using engine::WeightBinding;
using engine::WeightBindingPlan;

namespace {

constexpr std::size_t kUnits = 6;
constexpr std::uint64_t kWideBytes = 96 * 64 * 2;  // "a": BF16 [96, 64], kept
constexpr std::uint64_t kCastBytes = 40 * 24 * 4;  // "b": BF16 [40, 24] cast to F32
constexpr std::uint64_t kUnitBytes = kWideBytes + kCastBytes;

std::vector<synth::TensorSpec> layer_specs() {
  std::vector<synth::TensorSpec> specs;
  for (std::size_t i = 0; i < kUnits; ++i) {
    specs.push_back({fmt::format("layers.{}.a", i), DType::BF16, {96, 64}});
    specs.push_back({fmt::format("layers.{}.b", i), DType::BF16, {40, 24}});
  }
  return specs;
}

/// One unit's module: the kept matrix, the cast one, and a tied alias of the first.
struct Layer {
  cpu::Parameter a{DType::BF16, {96, 64}};
  cpu::Parameter b{DType::F32, {40, 24}};
  cpu::Parameter tied{DType::BF16, {96, 64}};

  template <class Self, class Fn>
  static void each(Self& self, Fn&& fn) {
    fn("a.weight", self.a);
    fn("b.weight", self.b);
    fn("tied.weight", self.tied);
  }
  void visit_parameters(engine::ParameterVisitor<cpu::Parameter>& v, const std::string& prefix) const {
    visit_slots(*this, v, prefix);
  }
  void visit_parameters_mut(engine::ParameterVisitorMut<cpu::Parameter>& v, const std::string& prefix) {
    visit_slots_mut(*this, v, prefix);
  }
};

std::vector<PipelineUnit> units() {
  std::vector<PipelineUnit> out;
  for (std::size_t i = 0; i < kUnits; ++i) {
    std::vector<WeightBinding> b{
        WeightBinding::tensor("a.weight", fmt::format("layers.{}.a", i), Selection::all(), kWideBytes),
        WeightBinding::from_recipe(
            "b.weight",
            DerivedWeightRecipe::cast(DerivedWeightRecipe::source(fmt::format("layers.{}.b", i)), DType::F32),
            kCastBytes),
        WeightBinding::alias("tied.weight", "a.weight", kWideBytes),
    };
    out.push_back({fmt::format("layers.{}", i), WeightBindingPlan(std::move(b))});
  }
  return out;
}

using Pipeline = engine::PrefetchPipeline<cpu::Backend, Layer>;

struct Env {
  CpuCheckpoint ckpt{layer_specs()};
  asio::io_context ctx;
  struct FailRange final : io::FaultInjector {
    std::atomic<std::uint64_t> begin{0}, end{0};
    io::ReadFault on_complete(std::uint32_t, std::uint64_t offset, std::uint64_t length) override {
      if (offset < end && offset + length > begin) return {.error = EIO};
      return {};
    }
  } faults;
  std::unique_ptr<io::CheckpointSource> source;
  cpu::Executor executor{2};
  cpu::StoragePool storage;
  cpu::MaterializationContext mc{executor, storage};

  Env() {
    auto options = small_source_options(std::size_t{64} << 10);
    options.chunk_bytes = std::size_t{16} << 10;
    options.reader.faults = &faults;
    source = io::CheckpointSource::open(ctx.get_executor(), ckpt.path, options);
  }

  /// Runs `ctx` until `future` is ready, then returns its value.
  template <class T>
  T get(std::future<T>& future) {
    return run_until_ready(ctx, future);
  }

  /// Checks a delivered unit's weights against the checkpoint's bytes.
  void check_unit(const Layer& layer, std::size_t i) const {
    CHECK(to_vector(layer.a.value.bytes()) == ckpt.bytes(fmt::format("layers.{}.a", i)));
    const auto& b = ckpt.bytes(fmt::format("layers.{}.b", i));
    std::vector<std::byte> f32(b.size() * 2);
    cpu::convert_serial(DType::BF16, DType::F32, b, f32);
    CHECK(to_vector(layer.b.value.bytes()) == f32);
    CHECK(layer.tied.value.shares_storage_with(layer.a.value));
  }
};

Layer make_layer(std::size_t) { return Layer{}; }

/// Pulls every unit with `work` between pulls (a timer: the consumer's compute), checking
/// order and contents; returns the indices seen.
asio::awaitable<std::vector<std::size_t>> consume(Pipeline& pipeline, Env& env, std::chrono::microseconds work,
                                                  std::uint64_t* max_live) {
  std::vector<std::size_t> seen;
  asio::steady_timer timer(co_await asio::this_coro::executor);
  while (auto unit = co_await pipeline.async_next(asio::use_awaitable)) {
    seen.push_back(unit.index());
    env.check_unit(unit.module(), unit.index());
    *max_live = std::max(*max_live, env.storage.stats().live_bytes);
    if (work.count() > 0) {
      timer.expires_after(work);
      co_await timer.async_wait(asio::use_awaitable);
    }
  }
  co_await pipeline.async_close(asio::use_awaitable);
  co_return seen;
}

}  // namespace

TEST_CASE("pipeline – units arrive in order, pass after pass, within the budget under a slow consumer",
          "[engine][pipeline]") {
  Env env;
  const std::uint64_t budget = 2 * kUnitBytes;  // look-ahead 3 would allow 4 units: the budget binds
  Pipeline pipeline(*env.source, units(), make_layer, env.mc, {.lookahead = 3, .resident_budget = budget, .passes = 2});
  std::uint64_t max_live = 0;
  auto done =
      asio::co_spawn(env.ctx, consume(pipeline, env, std::chrono::milliseconds(3), &max_live), asio::use_future);
  std::vector<std::size_t> seen = env.get(done);

  std::vector<std::size_t> expected;
  for (int pass = 0; pass < 2; ++pass)
    for (std::size_t i = 0; i < kUnits; ++i) expected.push_back(i);
  CHECK(seen == expected);
  const engine::PipelineStats stats = pipeline.stats();
  CHECK(stats.delivered == 2 * kUnits);
  CHECK(stats.resident_high_water <= budget);
  CHECK(stats.resident_high_water >= kUnitBytes);
  CHECK(stats.resident_bytes == 0);
  // Storage is rounded to pages per tensor: allow that much over the unit bytes.
  CHECK(max_live <= budget + 2 * 2 * 4096);
  CHECK(env.source->pool().in_use() == 0);
  CHECK(env.source->pool().high_water() <= env.source->pool().budget());
  CHECK(env.storage.stats().live_bytes == 0);
}

TEST_CASE("pipeline – a fast consumer waits for a slow reader and the look-ahead still bounds memory",
          "[engine][pipeline]") {
  Env env;
  Pipeline pipeline(*env.source, units(), make_layer, env.mc, {.lookahead = 1});
  std::uint64_t max_live = 0;
  auto done =
      asio::co_spawn(env.ctx, consume(pipeline, env, std::chrono::microseconds(0), &max_live), asio::use_future);
  CHECK(env.get(done).size() == kUnits);
  const engine::PipelineStats stats = pipeline.stats();
  CHECK(stats.budget == 2 * kUnitBytes);  // default: (K + 1) × the largest unit
  CHECK(stats.resident_high_water <= 2 * kUnitBytes);
  CHECK(stats.units.size() == kUnits);
  CHECK(stats.stall_s > 0);  // the consumer did wait for reads
  for (const auto& u : stats.units) CHECK_FALSE(u.from_host);
}

TEST_CASE("pipeline – keep_on_host parks released units and promotes them on the next pass", "[engine][pipeline]") {
  Env env;
  cpu::Executor park{1};
  Pipeline pipeline(*env.source, units(), make_layer, env.mc, {.lookahead = 1, .passes = 3}, engine::KeepOnHost{park});
  std::uint64_t max_live = 0;
  auto done =
      asio::co_spawn(env.ctx, consume(pipeline, env, std::chrono::microseconds(200), &max_live), asio::use_future);
  CHECK(env.get(done).size() == 3 * kUnits);
  const engine::PipelineStats stats = pipeline.stats();
  std::size_t promoted = 0;
  for (const auto& u : stats.units) promoted += u.from_host ? 1 : 0;
  // The first pass reads everything; later passes promote whatever was parked by then.
  CHECK(promoted >= kUnits);
  for (std::size_t i = 0; i < kUnits; ++i) CHECK_FALSE(stats.units[i].from_host);
  CHECK(stats.parked_bytes == kUnits * kUnitBytes);
  CHECK(stats.resident_high_water <= 2 * kUnitBytes);
}

TEST_CASE("pipeline – cancelling async_next mid-stream returns every lease and frees every unit",
          "[engine][pipeline]") {
  Env env;
  // Look-ahead 1 while the consumer holds two units: the third waits, deterministically.
  Pipeline pipeline(*env.source, units(), make_layer, env.mc, {.lookahead = 1, .passes = 0});
  asio::cancellation_signal cancel;
  std::atomic<int> got{0};
  auto consumer = [&]() -> asio::awaitable<void> {
    auto first = co_await pipeline.async_next(asio::use_awaitable);
    auto second = co_await pipeline.async_next(asio::use_awaitable);
    got = 2;
    // Holding two units, ask for a third and cancel the wait.
    auto third = co_await pipeline.async_next(asio::bind_cancellation_slot(cancel.slot(), asio::use_awaitable));
    got = 3;
  };
  auto done = asio::co_spawn(env.ctx, consumer(), asio::use_future);
  while (got.load() < 2) {
    env.ctx.restart();
    env.ctx.run_one_for(std::chrono::milliseconds(5));
  }
  // Let the third request start waiting, then cancel it.
  env.ctx.restart();
  env.ctx.poll();
  cancel.emit(asio::cancellation_type::terminal);
  try {
    env.get(done);
    FAIL("the cancelled async_next succeeded");
  } catch (const Error& e) {
    CHECK(e.kind() == errc::cancelled);
  }
  CHECK(got.load() == 2);
  CHECK(env.source->pool().in_use() == 0);      // every lease back
  CHECK(env.storage.stats().live_bytes == 0);   // the held units were released when the coroutine ended
  CHECK(pipeline.stats().resident_bytes == 0);  // every reservation returned
  auto again = asio::co_spawn(env.ctx, pipeline.async_next(asio::use_awaitable), asio::use_future);
  CHECK_THROWS_AS(env.get(again), Error);
  auto closed = pipeline.async_close(asio::use_future);
  env.get(closed);
}

TEST_CASE("pipeline – closing while loads are in flight stops them and returns everything", "[engine][pipeline]") {
  Env env;
  // Slow reads (every completed read sleeps on the loop thread) keep loads in flight.
  struct Slow final : io::FaultInjector {
    io::ReadFault on_complete(std::uint32_t, std::uint64_t, std::uint64_t) override {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      return {};
    }
  } slow;
  auto options = small_source_options(std::size_t{64} << 10);
  options.chunk_bytes = std::size_t{8} << 10;
  options.reader.faults = &slow;
  env.source = io::CheckpointSource::open(env.ctx.get_executor(), env.ckpt.path, options);
  Pipeline pipeline(*env.source, units(), make_layer, env.mc, {.lookahead = 4, .passes = 0});
  for (int i = 0; i < 3; ++i) {
    env.ctx.restart();
    env.ctx.run_one_for(std::chrono::milliseconds(2));
  }
  auto closed = pipeline.async_close(asio::use_future);
  env.get(closed);
  CHECK(env.source->pool().in_use() == 0);
  CHECK(env.storage.stats().live_bytes == 0);
  CHECK(pipeline.stats().resident_bytes == 0);
  auto next = asio::co_spawn(env.ctx, pipeline.async_next(asio::use_awaitable), asio::use_future);
  try {
    env.get(next);
    FAIL("async_next after close succeeded");
  } catch (const Error& e) {
    CHECK(e.kind() == errc::cancelled);
  }
}

TEST_CASE("pipeline – an I/O error in unit 2 surfaces at unit 2, typed and named, and stays", "[engine][pipeline]") {
  Env env;
  const auto& t = env.source->catalog().at("layers.2.a");
  // Mid-tensor: an aligned window around a neighbour's read must not reach it.
  env.faults.begin = t.offset + 6000;
  env.faults.end = t.offset + 6001;
  Pipeline pipeline(*env.source, units(), make_layer, env.mc, {.lookahead = 4});
  std::vector<std::size_t> delivered;
  std::exception_ptr failure, again;
  auto consumer = [&]() -> asio::awaitable<void> {
    try {
      while (auto unit = co_await pipeline.async_next(asio::use_awaitable)) {
        env.check_unit(unit.module(), unit.index());
        delivered.push_back(unit.index());
      }
    } catch (...) {
      failure = std::current_exception();
    }
    try {
      co_await pipeline.async_next(asio::use_awaitable);
    } catch (...) {
      again = std::current_exception();
    }
    co_await pipeline.async_close(asio::use_awaitable);
  };
  auto done = asio::co_spawn(env.ctx, consumer(), asio::use_future);
  env.get(done);
  CHECK(delivered == std::vector<std::size_t>{0, 1});
  REQUIRE(failure);
  try {
    std::rethrow_exception(failure);
  } catch (const Error& e) {
    CHECK(e.kind() == errc::io_error);
    CHECK(e.context().parameter == "layers.2.a.weight");
    CHECK(std::string(e.what()).find(env.ckpt.path.string()) != std::string::npos);
  }
  REQUIRE(again);
  try {
    std::rethrow_exception(again);
  } catch (const Error& e) {
    CHECK(e.kind() == errc::io_error);
  }
  CHECK(env.source->pool().in_use() == 0);
  CHECK(env.storage.stats().live_bytes == 0);
}

TEST_CASE("pipeline – a bad configuration is refused before any read", "[engine][pipeline]") {
  Env env;
  CHECK_THROWS_AS(Pipeline(*env.source, units(), make_layer, env.mc, {.lookahead = 0}), Error);
  CHECK_THROWS_AS(Pipeline(*env.source, units(), make_layer, env.mc, {.resident_budget = kUnitBytes - 1}), Error);
  auto bad = units();
  bad[3].plan = WeightBindingPlan({WeightBinding::tensor("a.weight", "layers.3.a", Selection::all(), 1)});
  try {
    Pipeline p(*env.source, std::move(bad), make_layer, env.mc);
    FAIL("a plan with wrong declared bytes was accepted");
  } catch (const Error& e) {
    CHECK(e.kind() == errc::byte_mismatch);
    CHECK(e.context().parameter == "layers.3.a.weight");
  }
  CHECK(env.source->pool().high_water() == 0);
}

TEST_CASE("pipeline – one consumer: a second concurrent async_next is refused, timings stay bounded",
          "[engine][pipeline]") {
  Env env;
  Pipeline pipeline(*env.source, units(), make_layer, env.mc, {.lookahead = 1, .passes = 2, .timing_history = 4});
  auto first = asio::co_spawn(env.ctx, pipeline.async_next(asio::use_awaitable), asio::use_future);
  auto second = asio::co_spawn(env.ctx, pipeline.async_next(asio::use_awaitable), asio::use_future);
  try {
    env.get(second);
    FAIL("two async_next ran at once");
  } catch (const Error& e) {
    CHECK(e.kind() == errc::invalid_argument);
  }
  CHECK(env.get(first).index() == 0);
  std::uint64_t max_live = 0;
  auto rest =
      asio::co_spawn(env.ctx, consume(pipeline, env, std::chrono::microseconds(0), &max_live), asio::use_future);
  CHECK(env.get(rest).size() == 2 * kUnits - 1);
  const engine::PipelineStats stats = pipeline.stats();
  CHECK(stats.delivered == 2 * kUnits);
  REQUIRE(stats.units.size() == 4);  // only the most recent timings are kept
  CHECK(stats.units.back().index == kUnits - 1);
  CHECK(stats.units.back().pass == 1);
}

TEST_CASE("pipeline – with verification on, every unit read is checked and a bad digest fails its unit",
          "[engine][pipeline][verify]") {
  Env env;
  io::Checksums sums;
  for (const auto& s : env.ckpt.specs) sums.add(s.name, io::sha256_hex(env.ckpt.bytes(s.name)));
  SECTION("every digest right: all units delivered, all tensors counted, each pass") {
    Pipeline pipeline(
        *env.source, units(), make_layer, env.mc,
        {.lookahead = 2, .passes = 2, .verify = {.mode = engine::VerifyMode::require, .checksums = sums}});
    std::uint64_t max_live = 0;
    auto done =
        asio::co_spawn(env.ctx, consume(pipeline, env, std::chrono::microseconds(0), &max_live), asio::use_future);
    CHECK(env.get(done).size() == 2 * kUnits);
    const engine::PipelineStats stats = pipeline.stats();
    CHECK(stats.tensors_verified == 2 * 2 * kUnits);  // a and b of every unit, each pass
    CHECK(stats.bytes_verified == 2 * env.source->catalog().total_bytes());
  }
  SECTION("unit 3's kept tensor has a wrong digest: units 0-2 arrive, then checksum_mismatch") {
    sums.add("layers.3.a", io::sha256_hex(env.ckpt.bytes("layers.2.a")));
    Pipeline pipeline(*env.source, units(), make_layer, env.mc,
                      {.lookahead = 2, .verify = {.mode = engine::VerifyMode::on, .checksums = sums}});
    std::vector<std::size_t> delivered;
    std::exception_ptr failure;
    auto consumer = [&]() -> asio::awaitable<void> {
      try {
        while (auto unit = co_await pipeline.async_next(asio::use_awaitable)) delivered.push_back(unit.index());
      } catch (...) {
        failure = std::current_exception();
      }
      co_await pipeline.async_close(asio::use_awaitable);
    };
    auto done = asio::co_spawn(env.ctx, consumer(), asio::use_future);
    env.get(done);
    CHECK(delivered == std::vector<std::size_t>{0, 1, 2});
    REQUIRE(failure);
    try {
      std::rethrow_exception(failure);
    } catch (const Error& e) {
      CHECK(e.kind() == errc::checksum_mismatch);
      CHECK(e.context().tensor == "layers.3.a");
    }
  }
  SECTION("require with a tensor that has no digest: refused by the constructor") {
    io::Checksums partial;
    partial.add("layers.0.a", io::sha256_hex(env.ckpt.bytes("layers.0.a")));
    CHECK_THROWS_AS(Pipeline(*env.source, units(), make_layer, env.mc,
                             {.verify = {.mode = engine::VerifyMode::require, .checksums = partial}}),
                    Error);
  }
  CHECK(env.source->pool().in_use() == 0);
  CHECK(env.storage.stats().live_bytes == 0);
}

TEST_CASE("pipeline – options out of range are invalid_argument naming the option and its range",
          "[engine][pipeline][options]") {
  Env env;
  struct Case {
    engine::PrefetchOptions options;
    const char* says;
  };
  const Case cases[] = {
      {{.lookahead = 0}, "PrefetchOptions::lookahead is 0; it must be 1..4096"},
      {{.lookahead = SIZE_MAX}, "PrefetchOptions::lookahead"},
      {{.concurrent_loads = 0}, "PrefetchOptions::concurrent_loads is 0"},
      {{.concurrent_loads = 100000}, "PrefetchOptions::concurrent_loads is 100000; it must be 1..256"},
      {{.timing_history = SIZE_MAX}, "PrefetchOptions::timing_history"},
      {{.verify = {.mode = static_cast<engine::VerifyMode>(7)}}, "VerifyOptions::mode is 7"},
      {{.verify = {.preferred = static_cast<io::DigestKind>(9)}}, "VerifyOptions::preferred is 9"},
  };
  for (const Case& c : cases) {
    try {
      Pipeline pipeline(*env.source, units(), make_layer, env.mc, c.options);
      FAIL("accepted");
    } catch (const Error& e) {
      CHECK(e.kind() == errc::invalid_argument);
      CHECK_THAT(e.what(), Catch::Contains(c.says));
    }
  }
  CHECK(env.source->pool().in_use() == 0);
}
