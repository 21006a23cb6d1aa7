// Tensor-parallel loading under mpirun: every rank plans and loads its part of a Llama-shaped
// checkpoint, reads exactly the bytes its selections select (the reader's counter), and the
// parts all-gathered over the group put back together are the whole tensors, byte for byte;
// the ranks' bytes read add up to split bytes + N × replicated bytes. Under
// ReplicatedReads::gather, the replicated tensors read 1/N per rank and all-gathered are the
// whole tensors, read once in total; a rank whose read fails fails every rank's gather at once.

#include <asio/io_context.hpp>
#include <asio/use_future.hpp>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <filesystem>

#include <fmt/format.h>

#include "cpu/cpu_fixture.hpp"
#include "distributed/mpi_fixture.hpp"
#include "eredu/core/collective_error.hpp"
#include "eredu/engine/backend/collective_backend.hpp"
#include "eredu/engine/description/plan_module.hpp"
#include "eredu/engine/orchestration/load.hpp"
#include "eredu/engine/orchestration/materialize.hpp"
#include "eredu/engine/parallel/gather_replicated.hpp"
#include "eredu/engine/parallel/sharding.hpp"
#include "eredu/mpi/backend.hpp"

using namespace eredu;
using namespace eredu::test;

TEST_CASE("mpi – each rank reads only its bytes, and the gathered parts are the whole tensors", "[mpi]") {
  mpi::Communicator& world = mpi_world();
  const int size = world.size();
  const int rank = world.rank();
  // Dims divisible by 4 ranks, heads included (2 kv heads on 4 ranks would read them twice).
  const std::uint64_t head_dim = 4, heads = 8, kv_heads = 4, hidden = heads * head_dim, inter = 48, vocab = 64;
  const std::vector<synth::TensorSpec> specs = {
      {"model.embed_tokens.weight", DType::BF16, {vocab, hidden}},
      {"model.layers.0.input_layernorm.weight", DType::F32, {hidden}},
      {"model.layers.0.self_attn.q_proj.weight", DType::BF16, {heads * head_dim, hidden}},
      {"model.layers.0.self_attn.k_proj.weight", DType::BF16, {kv_heads * head_dim, hidden}},
      {"model.layers.0.self_attn.v_proj.weight", DType::BF16, {kv_heads * head_dim, hidden}},
      {"model.layers.0.self_attn.o_proj.weight", DType::BF16, {hidden, heads * head_dim}},
      {"model.layers.0.mlp.gate_proj.weight", DType::F32, {inter, hidden}},
      {"model.layers.0.mlp.up_proj.weight", DType::F32, {inter, hidden}},
      {"model.layers.0.mlp.down_proj.weight", DType::F32, {hidden, inter}},
      {"model.norm.weight", DType::F32, {hidden}},
      {"lm_head.weight", DType::BF16, {vocab, hidden}},
  };
  // Every rank writes the same bytes (same seed) to its own file: node-local storage.
  const CpuCheckpoint ckpt(specs, 5);
  asio::io_context ctx;
  io::SourceOptions options = small_source_options(std::size_t{1} << 20);
  options.map_resident = false;  // every byte through the reader, so its counter is exact
  auto source = io::CheckpointSource::open(ctx.get_executor(), ckpt.path, options);
  const engine::ShardingRules rules =
      engine::ShardingRules::llama({.head_dim = head_dim, .heads = heads, .kv_heads = kv_heads});
  const engine::TensorParallelPlan plan = engine::plan_tensor_parallel(source->catalog(), rules, rank, size);
  auto model = engine::PlanModule<cpu::Parameter>::from_tensor_parallel(plan);
  cpu::Executor arena(2);
  cpu::MaterializationContext context{arena, cpu::Backend::default_storage()};
  auto done = engine::async_load<cpu::Backend>(model, *source, plan.bindings, context, asio::use_future);
  run_until_ready(ctx, done);
  const std::uint64_t read = source->reader().stats().bytes;
  CHECK(read == plan.read_bytes);
  CHECK(plan.read_bytes == plan.split_bytes / static_cast<std::uint64_t>(size) + plan.replicated_bytes);

  // Everyone's bytes read, gathered: their sum is split + N × replicated.
  cpu::Tensor mine = cpu::Tensor::allocate(cpu::Backend::default_storage(), DType::U64, {1});
  std::memcpy(mine.mutable_bytes().data(), &read, sizeof read);
  auto g = engine::async_all_gather<mpi::Backend>(arena, world, mine, asio::use_future);
  const cpu::Tensor reads = get_within(g);
  std::uint64_t total = 0;
  for (std::uint64_t r : reads.as<std::uint64_t>()) total += r;
  CHECK(total == plan.split_bytes + static_cast<std::uint64_t>(size) * plan.replicated_bytes);

  // Row-split parts (dim 0) all-gathered in rank order are the whole tensor; column splits
  // (dim 1) are checked against the file's columns directly.
  for (const engine::ShardedTensor& t : plan.tensors) {
    CAPTURE(t.key, rank, size);
    const cpu::Parameter* p = model.find(t.parameter);
    REQUIRE(p != nullptr);
    REQUIRE(p->bound());
    const std::vector<std::byte>& whole = ckpt.bytes(t.key);
    if (t.shard.kind() == engine::Shard::Kind::replicated) {
      CHECK(to_vector(p->value.bytes()) == whole);
    } else if (t.shard.dim() == 0) {
      auto h = engine::async_all_gather<mpi::Backend>(arena, world, p->value, asio::use_future);
      const cpu::Tensor gathered = get_within(h);
      CHECK(gathered.shape() == t.full_shape);
      CHECK(to_vector(gathered.bytes()) == whole);
    } else {
      const std::size_t eb = dtype_bits(t.dtype) / 8;
      const std::uint64_t rows = t.full_shape[0], cols = t.full_shape[1], local = t.local_shape[1];
      const Range r = engine::shard_range(cols, t.shard.granule(), rank, size, t.key);
      REQUIRE(local == r.size());
      for (std::uint64_t row = 0; row < rows; ++row)
        REQUIRE(std::memcmp(p->value.bytes().data() + row * local * eb, whole.data() + (row * cols + r.start) * eb,
                            local * eb) == 0);
    }
  }
}

namespace {

/// A Llama-shaped checkpoint whose embedding is replicated (a large replicated tensor), with
/// replicated tensors the gather rule reads whole at some sizes: 6 rows (2 ranks divide them,
/// 4 do not) and 5 rows (neither).
std::vector<synth::TensorSpec> gather_specs() {
  const std::uint64_t head_dim = 4, heads = 8, kv_heads = 4, hidden = heads * head_dim, vocab = 64;
  return {
      {"model.embed_tokens.weight", DType::BF16, {vocab, hidden}},
      {"model.layers.0.input_layernorm.weight", DType::F32, {hidden}},
      {"model.layers.0.self_attn.q_proj.weight", DType::BF16, {heads * head_dim, hidden}},
      {"model.layers.0.self_attn.k_proj.weight", DType::BF16, {kv_heads * head_dim, hidden}},
      {"model.layers.0.extra_six.weight", DType::F16, {6, 3}},
      {"model.layers.0.extra_five.weight", DType::F32, {5, 2}},
      {"model.norm.weight", DType::F32, {hidden}},
  };
}

engine::ShardingRules gather_rules() {
  return engine::ShardingRules::llama({.head_dim = 4, .heads = 8, .kv_heads = 4, .vocab_parallel = false});
}

}  // namespace

TEST_CASE("mpi – replicated tensors read 1/N per rank and all-gathered are the whole tensors, read once in total",
          "[mpi][gather]") {
  mpi::Communicator& world = mpi_world();
  const int size = world.size();
  const int rank = world.rank();
  const std::vector<synth::TensorSpec> specs = gather_specs();
  const CpuCheckpoint ckpt(specs, 9);  // the same bytes on every rank, each its own file
  asio::io_context ctx;
  io::SourceOptions options = small_source_options(std::size_t{1} << 20);
  options.map_resident = false;  // every byte through the reader, so its counter is exact
  auto source = io::CheckpointSource::open(ctx.get_executor(), ckpt.path, options);
  const engine::TensorParallelPlan plan =
      engine::plan_tensor_parallel(source->catalog(), gather_rules(), rank, size, engine::ReplicatedReads::gather);
  REQUIRE(plan.gathered_tensors >= 3);  // the embedding and both norms, at least
  auto model = engine::PlanModule<cpu::Parameter>::from_tensor_parallel(plan);
  cpu::Executor arena(2);
  cpu::MaterializationContext context{arena, cpu::Backend::default_storage()};
  auto m = engine::async_materialize<mpi::Backend>(*source, plan.bindings, context, asio::use_future);
  engine::MaterializedUnit<mpi::Backend> unit = run_until_ready(ctx, m);
  const std::uint64_t read = source->reader().stats().bytes;
  CHECK(read == plan.read_bytes);  // exactly this rank's selections
  auto g = engine::async_gather_replicated<mpi::Backend>(ctx.get_executor(), arena, world, plan, std::move(unit), model,
                                                         asio::use_future);
  run_until_ready(ctx, g);

  // Every slot is bound; every replicated tensor, gathered or read whole, is the file's bytes.
  std::uint64_t replicated_read = 0;
  for (const engine::ShardedTensor& t : plan.tensors) {
    CAPTURE(t.key, rank, size);
    const cpu::Parameter* p = model.find(t.parameter);
    REQUIRE(p != nullptr);
    REQUIRE(p->bound());
    CHECK(p->value.shape() == t.local_shape);
    if (t.shard.kind() != engine::Shard::Kind::replicated) continue;
    replicated_read += t.read_bytes;
    CHECK(t.gathered == (t.full_shape[0] % static_cast<std::uint64_t>(size) == 0));
    CHECK(to_vector(p->value.bytes()) == ckpt.bytes(t.key));
  }
  CHECK(model.find("model.layers.0.extra_five.weight") != nullptr);
  CHECK_FALSE(plan.tensors[5].gathered);  // 5 rows: read whole at 2 and 4 ranks
  CHECK(plan.tensors[4].gathered == (size == 2));

  // Over the ranks, the gathered bytes are read once and the others once per rank.
  cpu::Tensor mine = cpu::Tensor::allocate(cpu::Backend::default_storage(), DType::U64, {1});
  std::memcpy(mine.mutable_bytes().data(), &replicated_read, sizeof replicated_read);
  auto h = engine::async_all_gather<mpi::Backend>(arena, world, mine, asio::use_future);
  const cpu::Tensor reads = get_within(h);
  std::uint64_t total = 0;
  for (std::uint64_t r : reads.as<std::uint64_t>()) total += r;
  CHECK(total ==
        plan.gathered_bytes + static_cast<std::uint64_t>(size) * (plan.replicated_bytes - plan.gathered_bytes));
  CHECK(plan.gather_received_bytes * static_cast<std::uint64_t>(size) ==
        plan.gathered_bytes * static_cast<std::uint64_t>(size - 1));
}

TEST_CASE("mpi – a rank whose read fails fails every rank's gather at once, typed and naming it", "[mpi][gather]") {
  mpi::Communicator& world = mpi_world();
  const int size = world.size();
  const int rank = world.rank();
  const CpuCheckpoint ckpt(gather_specs(), 9);
  asio::io_context ctx;
  io::SourceOptions options = small_source_options(std::size_t{1} << 20);
  options.map_resident = false;
  auto source = io::CheckpointSource::open(ctx.get_executor(), ckpt.path, options);
  const engine::TensorParallelPlan plan =
      engine::plan_tensor_parallel(source->catalog(), gather_rules(), rank, size, engine::ReplicatedReads::gather);
  // The last rank's file loses its data after open: its read fails.
  const int victim = size - 1;
  if (rank == victim) std::filesystem::resize_file(ckpt.path, 8);
  auto model = engine::PlanModule<cpu::Parameter>::from_tensor_parallel(plan);
  cpu::Executor arena(2);
  cpu::MaterializationContext context{arena, cpu::Backend::default_storage()};
  engine::MaterializedUnit<mpi::Backend> unit;  // empty where the read failed
  auto m = engine::async_materialize<mpi::Backend>(*source, plan.bindings, context, asio::use_future);
  try {
    unit = run_until_ready(ctx, m);
    CHECK(rank != victim);
  } catch (const Error& e) {
    CHECK(rank == victim);
    CHECK(e.kind() != errc::collective_error);  // the read's own error
  }
  const auto start = std::chrono::steady_clock::now();
  auto g = engine::async_gather_replicated<mpi::Backend>(ctx.get_executor(), arena, world, plan, std::move(unit), model,
                                                         {.timeout = std::chrono::seconds(30), .group = "world"},
                                                         asio::use_future);
  try {
    run_until_ready(ctx, g);
    FAIL("expected rank_failed");
  } catch (const CollectiveError& e) {
    CHECK(e.kind() == errc::rank_failed);
    CHECK(e.operation() == "gather_replicated");
    CHECK(e.ranks() == std::vector<int>{victim});
    CHECK_THAT(e.what(), Catch::Contains(fmt::format("rank {}", victim)));
    if (rank == victim) CHECK(e.context().tensor == "model.embed_tokens.weight");
  }
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(10));         // at once, not a timeout
  for (std::size_t i = 0; i < model.size(); ++i) CHECK_FALSE(model.slot(i).bound());  // nothing bound
  CHECK(world.usable());
}
