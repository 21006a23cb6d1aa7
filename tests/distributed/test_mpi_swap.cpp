// The distributed hot-swap under mpirun: a version commits on every rank or on none. Each
// rank loads its tensor-parallel shard; a failure of any kind on one rank only (missing
// tensor, wrong shape, checksum (of a whole tensor or of a shard), a file cut short under the reader, canary,
// cancellation, a checkpoint that does not open, so that rank declines) leaves every rank on the old version, bit for
// bit, with the same error naming that rank; rollback follows the same rule; and a serving loop that takes its version
// per step sees the same generation on every rank at every step while versions are swapped under it.

#include <algorithm>
#include <asio/bind_cancellation_slot.hpp>
#include <asio/cancellation_signal.hpp>
#include <asio/io_context.hpp>
#include <asio/use_future.hpp>
#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <future>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "cpu/cpu_fixture.hpp"
#include "distributed/mpi_fixture.hpp"
#include "distributed/tiny_llama.hpp"
#include "eredu/core/collective_error.hpp"
#include "eredu/engine/backend/collective_backend.hpp"
#include "eredu/engine/description/plan_module.hpp"
#include "eredu/engine/parallel/sharding.hpp"
#include "eredu/engine/serving/distributed_model_slot.hpp"
#include "eredu/io/integrity/sha256.hpp"
#include "eredu/mpi/backend.hpp"
#include "support/vector_source.hpp"

using namespace eredu;
using namespace eredu::test;

namespace {

using Module = engine::PlanModule<cpu::Parameter>;
using Slot = engine::DistributedModelSlot<cpu::Backend, Module, mpi::Backend>;

using namespace eredu::test::tiny_llama;

std::vector<synth::TensorSpec> specs() {
  return {
      {"model.layers.0.input_layernorm.weight", DType::F32, {hidden}},
      {"model.layers.0.self_attn.q_proj.weight", DType::BF16, {heads * head_dim, hidden}},
      {"model.layers.0.self_attn.o_proj.weight", DType::BF16, {hidden, heads * head_dim}},
      {"model.layers.0.mlp.up_proj.weight", DType::F32, {inter, hidden}},
      {"model.layers.0.mlp.down_proj.weight", DType::F32, {hidden, inter}},
  };
}

/// A digest of every slot's bytes: which version a rank holds, bit for bit.
std::string tag(const Module& m) {
  io::Sha256 h;
  for (std::size_t i = 0; i < m.size(); ++i) h.update(m.slot(i).value.bytes());
  return h.hex_digest();
}

/// Every rank's U64 values, gathered over `group` (rank order).
std::vector<std::uint64_t> gather(cpu::Executor& arena, mpi::Communicator& group, std::uint64_t value) {
  cpu::Tensor mine = cpu::Tensor::allocate(cpu::Backend::default_storage(), DType::U64, {1});
  std::memcpy(mine.mutable_bytes().data(), &value, sizeof value);
  auto f = engine::async_all_gather<mpi::Backend>(arena, group, mine, asio::use_future);
  const cpu::Tensor all = get_within(f);
  return {all.as<std::uint64_t>().begin(), all.as<std::uint64_t>().end()};
}

/// One rank's side of the tests: two versions (A, B) of the checkpoint in its own directory
/// (node-local storage; every rank writes the same bytes), its shard plan, a slot voting on
/// its own communicator.
struct SwapEnv {
  mpi::Communicator& world = mpi_world();
  mpi::Communicator vote = world.split(0, world.rank(), "vote");
  const int rank = world.rank();
  const int size = world.size();
  CpuCheckpoint a{specs(), 11};
  CpuCheckpoint b{specs(), 12};
  asio::io_context ctx;
  io::SourceOptions options = [] {
    io::SourceOptions o = small_source_options(std::size_t{1} << 20);
    o.map_resident = false;  // every byte through the reader, so a file cut short fails the read
    return o;
  }();
  std::unique_ptr<io::CheckpointSource> source_a = io::CheckpointSource::open(ctx.get_executor(), a.path, options);
  engine::TensorParallelPlan plan = engine::plan_tensor_parallel(
      source_a->catalog(), engine::ShardingRules::llama({.head_dim = head_dim, .heads = heads, .kv_heads = kv_heads}),
      rank, size);
  cpu::Executor arena{2};
  cpu::MaterializationContext context{arena, cpu::Backend::default_storage()};
  Slot slot;

  /// A rank's side, whose votes wait at most `vote_timeout` for the others.
  explicit SwapEnv(std::chrono::milliseconds vote_timeout = std::chrono::seconds(30))
      : slot([this] { return Module::from_tensor_parallel(plan); }, vote, {.vote_timeout = vote_timeout}) {}

  /// Swaps to `source` (with `options`) and waits, running the io context.
  engine::DistributedSwapReport swap(io::CheckpointSource& source, engine::SwapOptions<Module> o = {}) {
    auto f = slot.async_swap(source, plan.bindings, context, std::move(o), asio::use_future);
    return run_until_ready(ctx, f);
  }

  /// Runs a swap that must fail on every rank, and returns its error.
  CollectiveError failed_swap(io::CheckpointSource& source, engine::SwapOptions<Module> o = {}) {
    try {
      swap(source, std::move(o));
    } catch (const CollectiveError& e) {
      return e;
    }
    throw std::runtime_error("the swap did not fail with CollectiveError");
  }
};

}  // namespace

TEST_CASE("mpi – a swap commits on every rank, with one generation and one activation step", "[mpi][swap]") {
  SwapEnv env;
  const engine::DistributedSwapReport first = env.swap(*env.source_a);
  CHECK(first.generation == 1);
  CHECK(first.ranks == env.size);
  REQUIRE(env.slot.current() != nullptr);
  CHECK(env.slot.previous() == nullptr);
  // The serving loop begins steps 0..4, then a second swap: it starts at step 5 on every rank.
  for (std::uint64_t s = 0; s < 5; ++s) CHECK(env.slot.version_for_step(s)->generation == 1);
  auto source_b = io::CheckpointSource::open(env.ctx.get_executor(), env.b.path, env.options);
  const engine::DistributedSwapReport second = env.swap(*source_b);
  CHECK(second.generation == 2);
  CHECK(second.activation_step == 5);
  CHECK(second.commit_s > 0);
  CHECK(env.slot.current()->generation == 2);
  CHECK(env.slot.previous()->generation == 1);
  // Each rank holds its own shard of B, and every rank agrees on the generation and step.
  for (const engine::ShardedTensor& t : env.plan.tensors) {
    const cpu::Parameter* p = env.slot.current()->model.find(t.parameter);
    REQUIRE(p != nullptr);
    CHECK(p->value.shape() == t.local_shape);
  }
  for (std::uint64_t g : gather(env.arena, env.world, second.generation)) CHECK(g == 2);
  for (std::uint64_t s : gather(env.arena, env.world, second.activation_step)) CHECK(s == 5);
  CHECK(env.slot.version_for_step(5)->generation == 2);
}

TEST_CASE("mpi – a failure on one rank leaves every rank on the old version, bit for bit", "[mpi][swap]") {
  SwapEnv env;
  env.swap(*env.source_a);
  const std::string before = tag(env.slot.current()->model);
  const int victim = env.size - 1;  // the last rank fails; the others succeed
  const bool me = env.rank == victim;
  errc expected = errc::backend_failure;
  CollectiveError error(errc::collective_error, {}, "not run");

  SECTION("a tensor is missing from the new version") {
    std::vector<synth::TensorSpec> fewer = specs();
    fewer.pop_back();
    CpuCheckpoint partial(fewer, 12);
    auto source = io::CheckpointSource::open(env.ctx.get_executor(), me ? partial.path : env.b.path, env.options);
    expected = errc::recipe_unknown_key;
    error = env.failed_swap(*source);
  }
  SECTION("a tensor has the wrong shape") {
    std::vector<synth::TensorSpec> other = specs();
    other[0].shape = {hidden * 2};
    CpuCheckpoint wrong(other, 12);
    auto source = io::CheckpointSource::open(env.ctx.get_executor(), me ? wrong.path : env.b.path, env.options);
    expected = errc::byte_mismatch;  // the shard's binding declares the bytes of the planned shape
    error = env.failed_swap(*source);
  }
  SECTION("a checksum does not match") {
    auto source = io::CheckpointSource::open(env.ctx.get_executor(), env.b.path, env.options);
    io::Checksums sums;
    for (const synth::TensorSpec& s : specs())
      sums.add(s.name, io::sha256_hex(me ? env.a.bytes(s.name) : env.b.bytes(s.name)));  // the victim's: A's
    expected = errc::checksum_mismatch;
    error = env.failed_swap(*source, {.checksums = sums});
  }
  SECTION("a shard's checksum does not match (digests of the split tensors only)") {
    // Each rank checks the digests of its own shards: the victim's are of A's bytes.
    auto source = io::CheckpointSource::open(env.ctx.get_executor(), env.b.path, env.options);
    io::Checksums sums;
    for (const engine::ShardedTensor& t : env.plan.tensors)
      if (t.shard.kind() != engine::Shard::Kind::replicated)
        for (const Selection& piece : t.pieces)
          sums.add_shard(t.key, piece, io::DigestKind::sha256,
                         io::sha256_hex((me ? env.a : env.b).selected_bytes(t.key, piece)));
    REQUIRE(sums.shard_count() > 0);
    expected = errc::checksum_mismatch;
    error = env.failed_swap(*source, {.checksums = sums});
  }
  SECTION("the file is cut short under the reader") {
    auto source = io::CheckpointSource::open(env.ctx.get_executor(), env.b.path, env.options);
    if (me) std::filesystem::resize_file(env.b.path, std::filesystem::file_size(env.b.path) / 2);
    error = env.failed_swap(*source);
    expected = error.failures().empty() ? errc::backend_failure : error.failures()[0].kind;
    CHECK((expected == errc::unexpected_eof || expected == errc::file_changed));
  }
  SECTION("the canary rejects the new version") {
    auto source = io::CheckpointSource::open(env.ctx.get_executor(), env.b.path, env.options);
    expected = errc::canary_failed;
    error = env.failed_swap(*source, {.canary = [me](const Module&) -> asio::awaitable<void> {
      if (me) throw std::runtime_error("probe output is NaN");
      co_return;
    }});
  }
  SECTION("the new version does not open on one rank, which declines") {
    // The victim never gets a source to swap from: it votes no with the open's error, and the
    // others fail at once with that cause (not at their 30 s vote timeout). Every rank tries
    // the missing path, to know the kind the victim's ballot carries.
    std::exception_ptr cause;
    try {
      io::CheckpointSource::open(env.ctx.get_executor(), env.b.path.string() + ".gone", env.options);
      FAIL("a missing checkpoint opened");
    } catch (const Error& e) {
      expected = e.kind();
      if (me) cause = std::current_exception();
    }
    std::unique_ptr<io::CheckpointSource> source;
    if (!me) source = io::CheckpointSource::open(env.ctx.get_executor(), env.b.path, env.options);
    const auto t = std::chrono::steady_clock::now();
    auto f = me ? env.slot.async_decline(cause, env.ctx.get_executor(), asio::use_future)
                : env.slot.async_swap(*source, env.plan.bindings, env.context, asio::use_future);
    try {
      run_until_ready(env.ctx, f);
      FAIL("the swap did not fail");
    } catch (const CollectiveError& e) {
      error = e;
    }
    CHECK(std::chrono::steady_clock::now() - t < std::chrono::seconds(10));
  }
  SECTION("the swap is cancelled") {
    auto source = io::CheckpointSource::open(env.ctx.get_executor(), env.b.path, env.options);
    asio::cancellation_signal cancel;
    auto f = env.slot.async_swap(*source, env.plan.bindings, env.context, {},
                                 asio::bind_cancellation_slot(cancel.slot(), asio::use_future));
    if (me) cancel.emit(asio::cancellation_type::terminal);
    expected = errc::cancelled;
    try {
      run_until_ready(env.ctx, f);
      FAIL("the swap did not fail");
    } catch (const CollectiveError& e) {
      error = e;
    }
  }

  CAPTURE(error.what());
  CHECK(error.kind() == errc::rank_failed);
  CHECK(error.ranks() == std::vector<int>{victim});
  REQUIRE(error.failures().size() == 1);
  CHECK(error.failures()[0].rank == victim);
  CHECK(error.failures()[0].kind == expected);
  CHECK(std::string(error.what()).find(fmt::format("rank {} failed", victim)) != std::string::npos);
  CHECK(std::string(error.what()).find("every rank keeps generation 1") != std::string::npos);
  CHECK(env.slot.current()->generation == 1);
  CHECK(tag(env.slot.current()->model) == before);
  CHECK(env.slot.version_for_step(0)->generation == 1);
  CHECK_FALSE(env.slot.swapping());
  // The group is still usable, and the next good swap commits everywhere.
  auto good = io::CheckpointSource::open(env.ctx.get_executor(), env.a.path, env.options);
  CHECK(env.swap(*good).generation == 2);
}

TEST_CASE("mpi – rollback switches every rank back, or none", "[mpi][swap]") {
  SwapEnv env;
  auto source_b = io::CheckpointSource::open(env.ctx.get_executor(), env.b.path, env.options);
  env.swap(*env.source_a);
  const std::string tag_a = tag(env.slot.current()->model);
  env.swap(*source_b);
  const std::string tag_b = tag(env.slot.current()->model);
  REQUIRE(tag_a != tag_b);
  const auto rollback = [&] {
    auto f = env.slot.async_rollback(env.ctx.get_executor(), asio::use_future);
    return run_until_ready(env.ctx, f);
  };
  CHECK(rollback().generation == 1);
  CHECK(tag(env.slot.current()->model) == tag_a);
  CHECK(rollback().generation == 2);  // the version rolled back from was kept: forward again
  CHECK(tag(env.slot.current()->model) == tag_b);

  // One rank lets its previous version go: the next rollback fails on every rank.
  if (env.rank == 0) env.slot.release_previous();
  try {
    rollback();
    FAIL("the rollback did not fail");
  } catch (const CollectiveError& e) {
    CAPTURE(e.what());
    CHECK(e.kind() == errc::rank_failed);
    CHECK(e.ranks() == std::vector<int>{0});
    CHECK(std::string(e.what()).find("no previous version is kept") != std::string::npos);
  }
  CHECK(env.slot.current()->generation == 2);
  CHECK(tag(env.slot.current()->model) == tag_b);
}

TEST_CASE("mpi – every step runs one version on every rank while versions are swapped", "[mpi][swap]") {
  SwapEnv env;
  auto source_b = io::CheckpointSource::open(env.ctx.get_executor(), env.b.path, env.options);
  env.swap(*env.source_a);
  // The serving loop: each step takes its version, then the ranks compare generations (the
  // collective a tensor-parallel forward would make, on its own communicator and thread).
  mpi::Communicator serve = env.world.split(0, env.rank, "serve");
  cpu::Executor serve_arena(1);
  constexpr std::uint64_t swaps = 6;
  std::atomic<bool> swapped{false};  // this rank's swaps are done
  std::atomic<bool> mixed{false};
  std::atomic<std::uint64_t> steps{0}, switches{0};
  std::thread server([&] {
    // Steps until every rank's swaps are done, decided from the gathered flags: every rank
    // runs the same number of steps, as the collectives of a forward require.
    std::uint64_t seen = 0;
    for (std::uint64_t s = 0;; ++s) {
      const std::uint64_t g = env.slot.version_for_step(s)->generation;
      if (g != seen) ++switches;
      seen = g;
      const std::vector<std::uint64_t> all = gather(serve_arena, serve, g << 1 | (swapped.load() ? 1 : 0));
      bool done = true;
      for (std::uint64_t other : all) {
        if (other >> 1 != g) mixed = true;
        done = done && (other & 1);
      }
      steps = s + 1;
      if (done) break;
    }
  });
  for (std::uint64_t i = 0; i < swaps; ++i) env.swap(i % 2 ? *env.source_a : *source_b);
  swapped = true;
  server.join();
  CHECK_FALSE(mixed.load());
  CHECK(env.slot.generation() == 1 + swaps);
  CHECK(env.slot.version_for_step(steps)->generation == 1 + swaps);
  WARN("steps served: " << steps.load() << ", versions seen by the serving loop: " << switches.load());
}

// Run only by its own ctest ("[dead_voter]", under mpirun --enable-recovery, which keeps the
// survivors alive), which passes on the line printed below: rank 1 dies while the others load,
// and their vote fails with a typed error within the vote timeout instead of waiting forever.
TEST_CASE("mpi – a rank killed during a swap fails the others' vote within its timeout, on the old version",
          "[mpi][dead_voter]") {
  SwapEnv env(std::chrono::milliseconds(3000));
  REQUIRE(env.size >= 2);
  env.swap(*env.source_a);
  const std::string before = tag(env.slot.current()->model);
  auto ready = env.world.async_barrier(asio::use_future);
  get_within(ready);
  if (env.rank == 1) {
    wait_until_past(env.world);  // everyone left the barrier (see say_past)
    std::raise(SIGKILL);
  }
  say_past(env.world, 1);

  auto source_b = io::CheckpointSource::open(env.ctx.get_executor(), env.b.path, env.options);
  const auto start = std::chrono::steady_clock::now();
  try {
    env.swap(*source_b);
    FAIL("the swap committed without rank 1");
  } catch (const CollectiveError& e) {
    const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start);
    CAPTURE(e.what());
    CHECK(e.kind() == errc::collective_error);
    CHECK(e.operation() == "swap vote");
    CHECK(waited < std::chrono::seconds(10));
    CHECK(env.slot.generation() == 1);
    CHECK(tag(env.slot.current()->model) == before);
    const bool names_rank_1 = std::find(e.ranks().begin(), e.ranks().end(), 1) != e.ranks().end();
    CHECK(names_rank_1);
    if (env.rank == 0 && names_rank_1 && env.slot.generation() == 1 && tag(env.slot.current()->model) == before)
      std::printf("dead-voter: rank 0 kept generation 1 and got collective_error naming rank 1 after %lld ms: %s\n",
                  static_cast<long long>(waited.count()), e.what());
    std::fflush(stdout);
  }
}

// The cases every slot shares (conformance/slot_conformance.hpp), for DistributedModelSlot from
// a checkpoint and from memory: every rank runs the same case, so each failure is every
// rank's, and each rank's error names them all with the kind this rank voted.
namespace eredu::test {

/// DistributedModelSlot over the world's ranks, each with its tensor-parallel shard.
struct DistributedSlot {
  static constexpr const char* name = "DistributedModelSlot";
  using Model = Module;
  using Report = engine::DistributedSwapReport;
  SwapEnv env;
  std::unique_ptr<io::CheckpointSource> b = io::CheckpointSource::open(env.ctx.get_executor(), env.b.path, env.options);

  io::CheckpointSource& source_a() { return *env.source_a; }
  io::CheckpointSource& source_b() { return *b; }
  const CpuCheckpoint& checkpoint_a() const { return env.a; }
  const CpuCheckpoint& checkpoint_b() const { return env.b; }
  static std::vector<std::string> tensors() {
    std::vector<std::string> out;
    for (const synth::TensorSpec& s : specs()) out.push_back(s.name);
    return out;
  }
  template <class Source, class Token>
  auto async_swap(Source& source, engine::SwapOptions<Module> options, Token&& token) {
    return env.slot.async_swap(source, env.plan.bindings, env.context, std::move(options), std::forward<Token>(token));
  }
  template <class T>
  T run(std::future<T>& f) {
    return run_until_ready(env.ctx, f);
  }
  void poll_one() {
    env.ctx.restart();
    env.ctx.poll_one();
  }
  std::uint64_t generation() const { return env.slot.generation(); }
  bool swapping() const { return env.slot.swapping(); }
  std::string tag() const {
    auto v = env.slot.current();
    return v ? ::tag(v->model) : std::string();
  }
  static std::string tag_of(const Module& m) { return ::tag(m); }
  /// The kind this rank voted with, from the error every rank reports alike.
  static errc cause(const Error& e) {
    if (const auto* c = dynamic_cast<const CollectiveError*>(&e); c && c->kind() == errc::rank_failed) {
      for (const RankFailure& f : c->failures())
        if (f.rank == mpi_world().rank()) return f.kind;
      return errc::collective_error;  // this rank's failure is missing from the error
    }
    return e.kind();
  }
};

/// The same, its versions served from memory on every rank (test::VectorSource, no file): each
/// rank reads its shards through the io::ByteSource concept alone.
struct DistributedSlotFromMemory : DistributedSlot {
  static constexpr const char* name = "DistributedModelSlot, from an in-memory source";
  VectorSource memory_a{env.ctx.get_executor(), std::size_t{1} << 20, 1000};
  VectorSource memory_b{env.ctx.get_executor(), std::size_t{1} << 20, 1000};

  DistributedSlotFromMemory() {
    for (std::size_t i = 0; i < env.a.specs.size(); ++i) {
      memory_a.add(env.a.specs[i].name, env.a.specs[i].dtype, env.a.specs[i].shape, env.a.data[i]);
      memory_b.add(env.b.specs[i].name, env.b.specs[i].dtype, env.b.specs[i].shape, env.b.data[i]);
    }
  }
  VectorSource& source_a() { return memory_a; }
  VectorSource& source_b() { return memory_b; }
};

}  // namespace eredu::test

#define EREDU_SLOT_ADAPTERS eredu::test::DistributedSlot, eredu::test::DistributedSlotFromMemory
#include "conformance/slot_conformance.hpp"
