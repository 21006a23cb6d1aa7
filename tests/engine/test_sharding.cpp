// Tensor-parallel sharding in one process: glob rules, shard ranges (even, uneven, whole
// heads, replicated key/value heads), the per-rank plans of a Llama-shaped checkpoint, and
// loading every rank's plan on the CPU backend: each rank's slots hold exactly its part of
// the file's bytes, the parts of all ranks put back together are the whole tensor, and the
// reader delivers exactly the bytes the rank's selections select; shard digests check each
// rank's part, and a changed byte fails only the rank that reads it.

#include <algorithm>
#include <asio/io_context.hpp>
#include <asio/use_future.hpp>
#include <catch2/catch.hpp>
#include <cstring>
#include <map>
#include <numeric>

#include "cpu/cpu_fixture.hpp"
#include "eredu/core/error.hpp"
#include "eredu/engine/description/plan_module.hpp"
#include "eredu/engine/orchestration/load.hpp"
#include "eredu/engine/orchestration/materialize.hpp"
#include "eredu/engine/parallel/sharding.hpp"
#include "eredu/io/formats/open_catalog.hpp"
#include "eredu/io/integrity/checksums.hpp"
#include "eredu/io/integrity/sha256.hpp"
#include "eredu/synth/safetensors_writer.hpp"

using namespace eredu;
using namespace eredu::test;
using engine::Shard;
using engine::ShardingRules;

namespace {

constexpr std::uint64_t kHeadDim = 4;
constexpr std::uint64_t kHeads = 4;
constexpr std::uint64_t kKvHeads = 2;
constexpr std::uint64_t kHidden = kHeads * kHeadDim;  // 16
constexpr std::uint64_t kInter = 24;
constexpr std::uint64_t kVocab = 30;  // not a multiple of 4: uneven vocabulary rows

/// A two-layer Llama-shaped checkpoint ([out, in] weights), one layer with a fused qkv_proj.
std::vector<synth::TensorSpec> llama_specs() {
  std::vector<synth::TensorSpec> s;
  s.push_back({"model.embed_tokens.weight", DType::BF16, {kVocab, kHidden}});
  s.push_back({"model.layers.0.input_layernorm.weight", DType::F32, {kHidden}});
  s.push_back({"model.layers.0.self_attn.q_proj.weight", DType::BF16, {kHeads * kHeadDim, kHidden}});
  s.push_back({"model.layers.0.self_attn.k_proj.weight", DType::BF16, {kKvHeads * kHeadDim, kHidden}});
  s.push_back({"model.layers.0.self_attn.v_proj.weight", DType::BF16, {kKvHeads * kHeadDim, kHidden}});
  s.push_back({"model.layers.0.self_attn.o_proj.weight", DType::BF16, {kHidden, kHeads * kHeadDim}});
  s.push_back({"model.layers.0.mlp.gate_proj.weight", DType::F16, {kInter, kHidden}});
  s.push_back({"model.layers.0.mlp.up_proj.weight", DType::F16, {kInter, kHidden}});
  s.push_back({"model.layers.0.mlp.down_proj.weight", DType::F16, {kHidden, kInter}});
  s.push_back({"model.layers.1.self_attn.qkv_proj.weight", DType::F32, {(kHeads + 2 * kKvHeads) * kHeadDim, kHidden}});
  s.push_back({"model.layers.1.mlp.gate_up_proj.weight", DType::F32, {2 * kInter, kHidden}});
  s.push_back({"model.norm.weight", DType::F32, {kHidden}});
  s.push_back({"lm_head.weight", DType::BF16, {kVocab, kHidden}});
  return s;
}

ShardingRules llama_rules() {
  return ShardingRules::llama({.head_dim = kHeadDim, .heads = kHeads, .kv_heads = kKvHeads});
}

/// Rows [start, stop) of dim `dim` of a row-major tensor's bytes.
std::vector<std::byte> slice_bytes(const std::vector<std::byte>& full, const Shape& shape, std::size_t elem,
                                   std::size_t dim, Range r) {
  std::uint64_t outer = 1, inner = elem;
  for (std::size_t d = 0; d < dim; ++d) outer *= shape[d];
  for (std::size_t d = dim + 1; d < shape.size(); ++d) inner *= shape[d];
  std::vector<std::byte> out;
  for (std::uint64_t o = 0; o < outer; ++o) {
    const std::byte* base = full.data() + (o * shape[dim] + r.start) * inner;
    out.insert(out.end(), base, base + r.size() * inner);
  }
  return out;
}

/// What rank `rank` of `size` must hold of tensor `s`, computed from the whole bytes.
std::vector<std::byte> expected_part(const synth::TensorSpec& s, const std::vector<std::byte>& full, const Shard& shard,
                                     int rank, int size) {
  if (shard.kind() == Shard::Kind::replicated) return full;
  const std::size_t elem = dtype_bits(s.dtype) / 8;
  const std::size_t dim = shard.dim();
  std::vector<std::uint64_t> parts = shard.parts();
  if (shard.even_parts() > 0) parts.assign(shard.even_parts(), s.shape[dim] / shard.even_parts());
  if (parts.empty()) parts = {s.shape[dim]};
  // The pieces of each part, concatenated along `dim`: for dim 0 that is appending; for
  // another dim, interleave per outer index (the tests only fuse along dim 0).
  REQUIRE((parts.size() == 1 || dim == 0));
  std::vector<std::byte> out;
  std::uint64_t offset = 0;
  for (const std::uint64_t part : parts) {
    const Range r = engine::shard_range(part, shard.granule(), rank, size, s.name);
    const std::vector<std::byte> piece = slice_bytes(full, s.shape, elem, dim, {offset + r.start, offset + r.stop});
    out.insert(out.end(), piece.begin(), piece.end());
    offset += part;
  }
  return out;
}

}  // namespace

TEST_CASE("sharding – glob patterns match whole names", "[sharding]") {
  CHECK(engine::glob_match("*.self_attn.[qkv]_proj.weight", "model.layers.3.self_attn.k_proj.weight"));
  CHECK_FALSE(engine::glob_match("*.self_attn.[qkv]_proj.weight", "model.layers.3.self_attn.o_proj.weight"));
  CHECK_FALSE(engine::glob_match("*.self_attn.[qkv]_proj.weight", "model.layers.3.self_attn.q_proj.weight.x"));
  CHECK(engine::glob_match("layer?.w", "layer7.w"));
  CHECK_FALSE(engine::glob_match("layer?.w", "layer17.w"));
  CHECK(engine::glob_match("[!a-c]x", "dx"));
  CHECK_FALSE(engine::glob_match("[!a-c]x", "bx"));
  CHECK(engine::glob_match("a*b*c", "a--b--b--c"));
  CHECK_FALSE(engine::glob_match("a*b*c", "a--b--b--"));
  CHECK(engine::glob_match("*", ""));
  CHECK(engine::glob_match("[x", "[x"));  // no closing bracket: a literal '['
}

TEST_CASE("sharding – shard ranges: even, uneven in rank order, whole heads, replicated units", "[sharding]") {
  CHECK(engine::shard_range(8, 1, 0, 2, "t") == Range{0, 4});
  CHECK(engine::shard_range(8, 1, 1, 2, "t") == Range{4, 8});
  // 10 over 4: 3, 3, 2, 2, contiguous.
  CHECK(engine::shard_range(10, 1, 0, 4, "t") == Range{0, 3});
  CHECK(engine::shard_range(10, 1, 1, 4, "t") == Range{3, 6});
  CHECK(engine::shard_range(10, 1, 2, 4, "t") == Range{6, 8});
  CHECK(engine::shard_range(10, 1, 3, 4, "t") == Range{8, 10});
  // Whole heads of 4: 3 heads over 2 ranks: 2 heads, 1 head.
  CHECK(engine::shard_range(12, 4, 0, 2, "t") == Range{0, 8});
  CHECK(engine::shard_range(12, 4, 1, 2, "t") == Range{8, 12});
  // 2 key/value heads over 4 ranks: each head on 2 consecutive ranks.
  CHECK(engine::shard_range(8, 4, 0, 4, "t") == Range{0, 4});
  CHECK(engine::shard_range(8, 4, 1, 4, "t") == Range{0, 4});
  CHECK(engine::shard_range(8, 4, 2, 4, "t") == Range{4, 8});
  CHECK(engine::shard_range(8, 4, 3, 4, "t") == Range{4, 8});
  // Errors name the tensor.
  auto kind_of = [](auto fn) {
    try {
      fn();
    } catch (const Error& e) {
      CHECK(e.context().tensor == "w");
      return e.kind();
    }
    return errc::unknown_format;  // "did not throw"
  };
  CHECK(kind_of([] { engine::shard_range(10, 4, 0, 2, "w"); }) == errc::invalid_argument);          // not whole heads
  CHECK(kind_of([] { engine::shard_range(12, 4, 0, 2 * 2 + 1, "w"); }) == errc::invalid_argument);  // 3 units, 5 ranks
  CHECK(kind_of([] { engine::shard_range(8, 1, 2, 2, "w"); }) == errc::invalid_argument);           // rank out of range
}

TEST_CASE("sharding – rules pick the first matching pattern, then the fallback", "[sharding]") {
  ShardingRules rules;
  rules.add("*.w", Shard::row_parallel()).add("a.*", Shard::column_parallel());
  CHECK(rules.find("a.w") == Shard::row_parallel());
  CHECK(rules.find("a.b") == Shard::column_parallel());
  CHECK(rules.find("b.b") == Shard::replicated());
  rules.otherwise(std::nullopt);
  CHECK_FALSE(rules.find("b.b").has_value());
  const ShardingRules llama = llama_rules();
  CHECK(llama.find("model.layers.0.self_attn.o_proj.weight") == Shard::row_parallel(kHeadDim));
  CHECK(llama.find("model.layers.9.mlp.down_proj.weight") == Shard::row_parallel());
  CHECK(llama.find("model.layers.9.post_attention_layernorm.weight") == Shard::replicated());
}

TEST_CASE("sharding – every rank loads exactly its part and reads exactly its selections' bytes", "[sharding]") {
  const CpuCheckpoint ckpt(llama_specs(), 11);
  asio::io_context ctx;
  io::SourceOptions options = small_source_options(std::size_t{1} << 20);
  options.map_resident = false;  // every byte through the reader, so its counter is exact
  const ShardingRules rules = llama_rules();
  for (const int size : {1, 2, 4}) {
    std::uint64_t total_read = 0, split_bytes = 0, replicated_bytes = 0;
    std::map<std::string, std::vector<std::byte>> reassembled;
    for (int rank = 0; rank < size; ++rank) {
      CAPTURE(size, rank);
      auto source = io::CheckpointSource::open(ctx.get_executor(), ckpt.path, options);
      const engine::TensorParallelPlan plan = engine::plan_tensor_parallel(source->catalog(), rules, rank, size);
      REQUIRE(plan.tensors.size() == ckpt.specs.size());
      auto model = engine::PlanModule<cpu::Parameter>::from_tensor_parallel(plan);
      cpu::Executor arena(2);
      cpu::MaterializationContext context{arena, cpu::Backend::default_storage()};
      const std::uint64_t before = source->reader().stats().bytes;
      auto done = engine::async_load<cpu::Backend>(model, *source, plan.bindings, context, asio::use_future);
      run_until_ready(ctx, done);
      const std::uint64_t read = source->reader().stats().bytes - before;
      CHECK(read == plan.read_bytes);  // exactly this rank's bytes, never the whole file
      std::uint64_t sum = 0;
      for (std::size_t i = 0; i < plan.tensors.size(); ++i) {
        const engine::ShardedTensor& t = plan.tensors[i];
        const synth::TensorSpec& spec = ckpt.spec(t.key);
        CAPTURE(t.key, t.shard.to_string());
        const cpu::Parameter* p = model.find(t.parameter);
        REQUIRE(p != nullptr);
        REQUIRE(p->bound());
        CHECK(p->value.shape() == t.local_shape);
        const std::vector<std::byte> want = expected_part(spec, ckpt.bytes(t.key), t.shard, rank, size);
        REQUIRE(p->value.nbytes() == want.size());
        CHECK(std::memcmp(p->value.bytes().data(), want.data(), want.size()) == 0);
        sum += t.read_bytes;
        if (t.shard.kind() == Shard::Kind::split && t.shard.dim() == 0) {
          auto& whole = reassembled[t.key];
          whole.insert(whole.end(), p->value.bytes().begin(), p->value.bytes().end());
        }
      }
      CHECK(sum == plan.read_bytes);
      CHECK((plan.read_bytes < synth::total_nbytes(ckpt.specs) || size == 1));
      total_read += plan.read_bytes;
      split_bytes = plan.split_bytes;
      replicated_bytes = plan.replicated_bytes;
    }
    CHECK(split_bytes + replicated_bytes == synth::total_nbytes(ckpt.specs));
    // Splits without replicated units (kv heads on 4 ranks are read twice) add up to the whole.
    for (const auto& [key, bytes] : reassembled)
      if (size <= 2 || (key.find("k_proj") == std::string::npos && key.find("v_proj") == std::string::npos)) {
        CAPTURE(key);
        CHECK(bytes == ckpt.bytes(key));
      }
    if (size <= 2) CHECK(total_read == split_bytes + replicated_bytes * static_cast<std::uint64_t>(size));
  }
}

TEST_CASE("sharding – under ReplicatedReads::gather each rank reads 1/N of the replicated tensors it can gather",
          "[sharding][gather]") {
  // Replicated: rows that 2 and 4 ranks divide; rows that 2 divides but 4 does not; one row
  // (fewer than the ranks); a scalar; a sub-byte dtype. Split: one row-split weight.
  const CpuCheckpoint ckpt({{"a.w", DType::BF16, {8, 3}},
                            {"b.w", DType::F32, {6}},
                            {"c.w", DType::F32, {1, 4}},
                            {"d.w", DType::F32, {}},
                            {"e.w", DType::F4, {8}},
                            {"s.w", DType::F32, {8, 2}}},
                           3);
  asio::io_context ctx;
  io::SourceOptions options = small_source_options(std::size_t{1} << 20);
  options.map_resident = false;  // every byte through the reader, so its counter is exact
  ShardingRules rules;
  rules.add("s.w", Shard::column_parallel());
  const std::uint64_t replicated = synth::total_nbytes(ckpt.specs) - ckpt.bytes("s.w").size();
  for (const int size : {1, 2, 4}) {
    // Which tensors the rule gathers at this size (dim 0 divisible, whole bytes, not a scalar).
    const std::map<std::string, bool> gathered_at = {{"a.w", size > 1}, {"b.w", size == 2}, {"c.w", false},
                                                     {"d.w", false},    {"e.w", false},     {"s.w", false}};
    std::uint64_t replicated_read = 0;  // over the ranks
    for (int rank = 0; rank < size; ++rank) {
      CAPTURE(size, rank);
      auto source = io::CheckpointSource::open(ctx.get_executor(), ckpt.path, options);
      // The default is unchanged: every replicated tensor whole on every rank.
      const engine::TensorParallelPlan every = engine::plan_tensor_parallel(source->catalog(), rules, rank, size);
      CHECK(every.replicated_reads == engine::ReplicatedReads::every_rank);
      CHECK(every.gathered_tensors == 0);
      CHECK(every.whole_replicated_tensors == 5);
      CHECK(every.read_bytes == replicated + every.split_bytes / static_cast<std::uint64_t>(size));

      const engine::TensorParallelPlan plan =
          engine::plan_tensor_parallel(source->catalog(), rules, rank, size, engine::ReplicatedReads::gather);
      CHECK(plan.replicated_bytes == replicated);
      std::uint64_t gathered = 0, own_gathered = 0, sum = 0;
      std::size_t gathered_count = 0;
      for (const engine::ShardedTensor& t : plan.tensors) {
        CAPTURE(t.key);
        CHECK(t.gathered == gathered_at.at(t.key));
        CHECK(t.local_shape == (t.key == "s.w" ? Shape{8 / static_cast<std::uint64_t>(size), 2} : t.full_shape));
        sum += t.read_bytes;
        if (t.shard.kind() == Shard::Kind::replicated) replicated_read += t.read_bytes;
        if (!t.gathered) continue;
        ++gathered_count;
        gathered += ckpt.bytes(t.key).size();
        own_gathered += t.read_bytes;
        REQUIRE(t.pieces.size() == 1);
        const Range rows = engine::shard_range(t.full_shape[0], 1, rank, size, t.key);
        CHECK(t.pieces.front().ranges.front() == rows);
        CHECK(t.read_bytes * static_cast<std::uint64_t>(size) == ckpt.bytes(t.key).size());
      }
      CHECK(sum == plan.read_bytes);
      CHECK(plan.gathered_tensors == gathered_count);
      CHECK(plan.whole_replicated_tensors == 5 - gathered_count);
      CHECK(plan.gathered_bytes == gathered);
      CHECK(plan.gather_received_bytes == gathered - own_gathered);
      CHECK(plan.bound_bytes == every.bound_bytes);  // a gathered slot holds the whole tensor

      // The reader delivers exactly the plan's bytes, and each rank's rows are its slice.
      auto model = engine::PlanModule<cpu::Parameter>::from_tensor_parallel(plan);
      for (const engine::ShardedTensor& t : plan.tensors) CHECK(model.find(t.parameter)->shape == t.local_shape);
      cpu::Executor arena(2);
      cpu::MaterializationContext context{arena, cpu::Backend::default_storage()};
      const std::uint64_t before = source->reader().stats().bytes;
      auto done = engine::async_materialize<cpu::Backend>(*source, plan.bindings, context, asio::use_future);
      const engine::MaterializedUnit<cpu::Backend> unit = run_until_ready(ctx, done);
      CHECK(source->reader().stats().bytes - before == plan.read_bytes);
      for (const engine::ShardedTensor& t : plan.tensors) {
        if (!t.gathered) continue;
        CAPTURE(t.key);
        const cpu::Tensor* rows = unit.find(engine::ParameterId(t.parameter));
        REQUIRE(rows != nullptr);
        const std::uint64_t row_bytes = ckpt.bytes(t.key).size() / t.full_shape[0];
        const Range r = t.pieces.front().ranges.front();
        REQUIRE(rows->nbytes() == r.size() * row_bytes);
        CHECK(std::memcmp(rows->bytes().data(), ckpt.bytes(t.key).data() + r.start * row_bytes, rows->nbytes()) == 0);
      }
    }
    // The gathered tensors are read once over the ranks; the others once per rank.
    std::uint64_t once = 0, per_rank = 0;
    for (const synth::TensorSpec& spec : ckpt.specs)
      if (spec.name != "s.w") (gathered_at.at(spec.name) ? once : per_rank) += ckpt.bytes(spec.name).size();
    CHECK(replicated_read == once + per_rank * static_cast<std::uint64_t>(size));
  }
}

TEST_CASE("sharding – a ReplicatedReads outside its enumerators is a typed error", "[sharding][gather]") {
  const CpuCheckpoint ckpt({{"a.w", DType::F32, {4}}});
  const io::Catalog catalog = io::open_catalog(ckpt.path);
  try {
    engine::plan_tensor_parallel(catalog, ShardingRules(), 0, 2, static_cast<engine::ReplicatedReads>(7));
    FAIL("expected an error");
  } catch (const Error& e) {
    CHECK(e.kind() == errc::invalid_argument);
    CHECK_THAT(e.what(), Catch::Contains("ReplicatedReads"));
  }
  CHECK(std::string(engine::replicated_reads_name(engine::ReplicatedReads::gather)) == "gather");
  CHECK(std::string(engine::replicated_reads_name(engine::ReplicatedReads::every_rank)) == "read");
}

TEST_CASE("sharding – a rule that cannot apply is a typed error naming the tensor", "[sharding]") {
  const CpuCheckpoint ckpt({{"a.w", DType::F32, {6, 4}}, {"b.w", DType::F32, {5}}, {"c.w", DType::F4, {8}}});
  asio::io_context ctx;
  auto source = io::CheckpointSource::open(ctx.get_executor(), ckpt.path, small_source_options());
  auto error_of = [&](const ShardingRules& rules, int rank, int size) -> Error {
    try {
      engine::plan_tensor_parallel(source->catalog(), rules, rank, size);
    } catch (const Error& e) {
      return e;
    }
    FAIL("expected an error");
    throw;
  };
  {
    ShardingRules r;
    r.add("a.w", Shard::split(2));  // dim outside the tensor
    const Error e = error_of(r, 0, 2);
    CHECK(e.kind() == errc::invalid_argument);
    CHECK(e.context().tensor == "a.w");
  }
  {
    ShardingRules r;
    r.add("a.w", Shard::fused(0, {4, 1}));  // parts add up to 5, not 6
    CHECK(error_of(r, 0, 2).context().tensor == "a.w");
  }
  {
    ShardingRules r;
    r.otherwise(std::nullopt);  // no rule and no fallback
    CHECK(error_of(r, 0, 2).context().tensor == "a.w");
  }
  {
    ShardingRules r;
    r.add("c.w", Shard::split(0));  // sub-byte dtype
    CHECK(error_of(r, 0, 2).context().tensor == "c.w");
  }
  CHECK(error_of(ShardingRules(), 2, 2).kind() == errc::invalid_argument);  // rank out of range
}

namespace {

/// Shard digests of every piece of every rank of `size`, and whole digests of the replicated
/// tensors: what `eredu checksum --tensor-parallel size` records.
io::Checksums shard_checksums(const CpuCheckpoint& ckpt, const ShardingRules& rules, int size) {
  io::Checksums sums;
  const io::Catalog catalog = io::open_catalog(ckpt.path);
  for (int rank = 0; rank < size; ++rank)
    for (const engine::ShardedTensor& t : engine::plan_tensor_parallel(catalog, rules, rank, size).tensors) {
      if (t.shard.kind() == Shard::Kind::replicated) {
        sums.add(t.key, io::sha256_hex(ckpt.bytes(t.key)));
        continue;
      }
      for (const Selection& piece : t.pieces)
        sums.add_shard(t.key, piece, io::DigestKind::sha256, io::sha256_hex(ckpt.selected_bytes(t.key, piece)));
    }
  return sums;
}

}  // namespace

TEST_CASE("sharding – shard digests verify each rank's part, a changed byte fails only the rank that reads it",
          "[sharding][checksums]") {
  const CpuCheckpoint good(llama_specs(), 11);
  const ShardingRules rules = llama_rules();
  const io::Checksums sums = shard_checksums(good, rules, 2);
  // The sidecar keeps them: what a load reads back is what was recorded.
  synth::write_text_file(io::Checksums::sidecar_path(good.path), sums.to_json());
  const io::Checksums read_back = io::Checksums::discover(good.path, io::open_catalog(good.path));
  REQUIRE(read_back.shard_count() == sums.shard_count());
  CHECK(read_back.shards() == sums.shards());

  // Loads rank `rank` of 2 of `ckpt` under require; returns the load's error, if any.
  asio::io_context ctx;
  auto load = [&](const CpuCheckpoint& ckpt, int rank, engine::MaterializeProgress& progress) -> std::exception_ptr {
    io::SourceOptions source_options = small_source_options(std::size_t{1} << 20);
    source_options.map_resident = false;  // every byte through the reader, so its counter is exact
    auto source = io::CheckpointSource::open(ctx.get_executor(), ckpt.path, source_options);
    const engine::TensorParallelPlan plan = engine::plan_tensor_parallel(source->catalog(), rules, rank, 2);
    auto model = engine::PlanModule<cpu::Parameter>::from_tensor_parallel(plan);
    cpu::Executor arena(2);
    cpu::MaterializationContext context{arena, cpu::Backend::default_storage()};
    engine::MaterializeOptions options{.progress = &progress,
                                       .verify = {.mode = engine::VerifyMode::require, .checksums = read_back}};
    // What verification reads again: the pieces of the fused tensors (a concat recipe), whole.
    const std::uint64_t reread =
        engine::verification_reread_bytes<cpu::Backend>(options.verify, source->catalog(), plan.bindings);
    std::uint64_t fused_pieces = 0;
    for (const engine::ShardedTensor& t : plan.tensors)
      if (t.pieces.size() > 1) fused_pieces += t.read_bytes;
    CHECK(fused_pieces > 0);
    if (&ckpt == &good) CHECK(reread == fused_pieces);
    auto done = engine::async_load<cpu::Backend>(model, *source, plan.bindings, context, options, asio::use_future);
    try {
      run_until_ready(ctx, done);  // rethrows the load's error
    } catch (const std::exception& e) {
      UNSCOPED_INFO("the load failed: " << e.what());
      return std::current_exception();
    }
    // The plan's bytes and those read again, exactly, once the bytes a direct-read window
    // reads around a small piece (of its neighbours) are set apart.
    CAPTURE(plan.read_bytes, reread, fused_pieces, source->alignment_bytes());
    CHECK(source->reader().stats().bytes - source->alignment_bytes() == plan.read_bytes + reread);
    return nullptr;
  };
  std::uint64_t pieces = 0;
  for (int rank = 0; rank < 2; ++rank) {
    CAPTURE(rank);
    engine::MaterializeProgress progress;
    CHECK_FALSE(load(good, rank, progress));
    // Every tensor and every piece of a fused one was checked: in place, or read again.
    std::uint64_t expected = 0;
    for (const engine::ShardedTensor& t :
         engine::plan_tensor_parallel(io::open_catalog(good.path), rules, rank, 2).tensors)
      expected += t.shard.kind() == Shard::Kind::replicated ? 1 : t.pieces.size();
    CHECK(progress.tensors_verified == expected);
    CHECK(progress.tensors_unverified == 0);
    pieces += expected;
  }
  CHECK(pieces > good.specs.size());

  // The middle piece of a fused tensor without its digest (checked neither first nor alone):
  // require refuses before any read, although the tensor's other pieces have theirs.
  {
    const std::string fused = "model.layers.1.self_attn.qkv_proj.weight";
    const engine::TensorParallelPlan plan = engine::plan_tensor_parallel(io::open_catalog(good.path), rules, 1, 2);
    const auto t = std::find_if(plan.tensors.begin(), plan.tensors.end(),
                                [&](const engine::ShardedTensor& s) { return s.key == fused; });
    REQUIRE(t != plan.tensors.end());
    REQUIRE(t->pieces.size() == 3);
    io::Checksums partial;
    for (const auto& [tensor, digests] : read_back.digests()) partial.add(tensor, digests.sha256);
    for (const auto& [tensor, shards] : read_back.shards())
      for (const auto& [text, shard] : shards)
        if (tensor != fused || !(shard.selection == t->pieces[1]))
          partial.add_shard(tensor, shard.selection, io::DigestKind::sha256, shard.digests.sha256);
    auto source = io::CheckpointSource::open(ctx.get_executor(), good.path, small_source_options(std::size_t{1} << 20));
    auto model = engine::PlanModule<cpu::Parameter>::from_tensor_parallel(plan);
    cpu::Executor arena(2);
    cpu::MaterializationContext context{arena, cpu::Backend::default_storage()};
    engine::MaterializeOptions options{.verify = {.mode = engine::VerifyMode::require, .checksums = partial}};
    auto done = engine::async_load<cpu::Backend>(model, *source, plan.bindings, context, options, asio::use_future);
    try {
      run_until_ready(ctx, done);
      FAIL("require passed with a piece of a fused tensor unverifiable");
    } catch (const Error& e) {
      CHECK(e.kind() == errc::invalid_argument);
      CHECK(e.context().tensor == fused);
      CHECK_THAT(std::string(e.what()), Catch::Contains(t->pieces[1].to_string()));
    }
    CHECK(source->reader().stats().bytes == 0);
  }

  // One byte changed in rank 1's columns of a row-parallel weight (checked where it lands),
  // then in rank 1's query rows of a fused qkv_proj (a concat recipe: checked by reading again).
  struct Case {
    const char* tensor;
    std::size_t byte;  // within the tensor's stored bytes
    const char* shard;
  };
  const Case cases[] = {
      {"model.layers.0.mlp.down_proj.weight", 20 * 2, "[0:16, 12:24]"},               // row 0, column 20 (f16)
      {"model.layers.1.self_attn.qkv_proj.weight", 9 * kHidden * 4, "[8:16, 0:16]"},  // row 9 (f32)
  };
  for (const Case& c : cases) {
    CAPTURE(c.tensor);
    std::vector<std::vector<std::byte>> contents = good.data;
    for (std::size_t i = 0; i < good.specs.size(); ++i)
      if (good.specs[i].name == c.tensor) contents[i][c.byte] ^= std::byte{0x40};
    const CpuCheckpoint bad(llama_specs(), std::move(contents));
    engine::MaterializeProgress progress;
    CHECK_FALSE(load(bad, 0, progress));  // rank 0 does not read the changed byte
    std::exception_ptr e = load(bad, 1, progress);
    REQUIRE(e);
    try {
      std::rethrow_exception(e);
    } catch (const Error& error) {
      CHECK(error.kind() == errc::checksum_mismatch);
      CHECK(error.context().tensor == c.tensor);
      CHECK(error.context().file == bad.path.string());
      CHECK_THAT(std::string(error.what()), Catch::Contains(fmt::format("shard {}", c.shard)));
    }
  }
}
