// The orchestration fed by a source that is not a file: engine::async_load of a small model
// from test::VectorSource (an in-memory io::ByteSource) into the CPU backend and into the
// fake backend, and a PrefetchPipeline of units over the same source. The engine reaches the
// bytes only through the ByteSource concept, so the weights bound must be exactly the stored
// bytes, selected, cast, joined and tied as planned.

#include <asio/io_context.hpp>
#include <asio/use_future.hpp>
#include <catch2/catch.hpp>
#include <cstddef>
#include <vector>

#include "cpu/cpu_fixture.hpp"
#include "eredu/core/error.hpp"
#include "eredu/cpu/backend.hpp"
#include "eredu/cpu/convert.hpp"
#include "eredu/engine/orchestration/load.hpp"
#include "eredu/engine/orchestration/materialize.hpp"
#include "eredu/engine/serving/prefetch_pipeline.hpp"
#include "eredu/io/integrity/digest.hpp"
#include "io/read_fixture.hpp"
#include "support/checkpoint_fixture.hpp"
#include "support/fake_backend.hpp"
#include "support/slot_module.hpp"
#include "support/vector_source.hpp"

using namespace eredu;
using engine::WeightBinding;
using engine::WeightBindingPlan;
using R = engine::DerivedWeightRecipe;

static_assert(engine::ParameterBackend<cpu::Backend, test::VectorSource>);
static_assert(engine::ParameterBackend<test::FakeBackend, test::VectorSource>);

namespace {

const std::vector<synth::TensorSpec> source_specs{
    {"embed", DType::BF16, {8, 16}}, {"q", DType::BF16, {8, 16}},  {"k", DType::BF16, {8, 16}},
    {"big", DType::BF16, {60, 33}},  {"norm", DType::F16, {3, 5}},
};

/// The slots the plan below loads, their dtype and shape as bound.
std::vector<test::SlotDeclaration> slots() {
  return {{"embed.weight", DType::BF16, {8, 16}},
          {"qk.weight", DType::BF16, {16, 16}},
          {"big.weight", DType::F32, {60, 33}},
          {"norm.rows.weight", DType::F16, {2, 5}},
          {"lm_head.weight", DType::BF16, {8, 16}}};
}

/// Kept whole, concatenated, cast, selected, and tied.
WeightBindingPlan plan() {
  return WeightBindingPlan({
      WeightBinding::tensor("embed.weight", "embed", Selection::all(), 256),
      WeightBinding::from_recipe("qk.weight", R::concat({R::source("q"), R::source("k")}, 0), 512),
      WeightBinding::from_recipe("big.weight", R::cast(R::source("big"), DType::F32), 60 * 33 * 4),
      WeightBinding::tensor("norm.rows.weight", "norm", Selection{{{1, 3}, {0, 5}}}, 20),
      WeightBinding::alias("lm_head.weight", "embed.weight", 256),
  });
}

/// The stored bytes, and the source serving them in chunks that split elements.
struct Memory {
  std::vector<std::vector<std::byte>> data = test::random_tensor_bytes(source_specs, 11);
  asio::io_context ctx;
  test::VectorSource source{ctx.get_executor(), std::size_t{1} << 20, 1000};

  Memory() {
    for (std::size_t i = 0; i < source_specs.size(); ++i)
      source.add(source_specs[i].name, source_specs[i].dtype, source_specs[i].shape, data[i]);
  }
  /// The bytes each slot must hold once the plan is loaded, dtype as bound.
  std::vector<std::byte> expected(const std::string& slot) const {
    if (slot == "embed.weight" || slot == "lm_head.weight") return data[0];
    if (slot == "qk.weight") {
      std::vector<std::byte> qk = data[1];
      qk.insert(qk.end(), data[2].begin(), data[2].end());
      return qk;
    }
    if (slot == "big.weight") {
      std::vector<std::byte> f32(data[3].size() * 2);
      cpu::convert_serial(DType::BF16, DType::F32, data[3], f32);
      return f32;
    }
    return test::select_bytes(data[4], source_specs[4].shape, DType::F16, Selection{{{1, 3}, {0, 5}}});
  }
};

template <class P>
std::vector<std::byte> bytes_of(const P& parameter) {
  return {parameter.value.bytes().begin(), parameter.value.bytes().end()};
}

/// Every slot of `model` holds exactly the bytes `memory` serves for it.
template <class P>
void check_exact_bytes(test::SlotModule<P>& model, const Memory& memory) {
  for (const auto& slot : slots()) {
    INFO(slot.name);
    CHECK(bytes_of(model.slot(slot.name)) == memory.expected(slot.name));
  }
}

}  // namespace

TEST_CASE("orchestration – async_load from an in-memory byte source binds the exact bytes on the CPU backend",
          "[engine][orchestration][byte_source]") {
  Memory memory;
  cpu::Executor executor{2};
  cpu::StoragePool storage;
  cpu::MaterializationContext mc{executor, storage};
  test::SlotModule<cpu::Parameter> model(slots());

  auto done = engine::async_load<cpu::Backend>(model, memory.source, plan(), mc, asio::use_future);
  test::run_until_ready(memory.ctx, done);

  check_exact_bytes(model, memory);
  CHECK(model.slot("lm_head.weight").value.shares_storage_with(model.slot("embed.weight").value));
  CHECK(memory.source.reads() > 0);
}

TEST_CASE("orchestration – async_load from an in-memory byte source binds the exact bytes on the fake backend",
          "[engine][orchestration][byte_source]") {
  Memory memory;
  test::FakeDevice device(memory.ctx.get_executor(), test::FakeReads::through_pool);
  test::SlotModule<test::FakeParameter> model(slots());

  auto done = engine::async_load<test::FakeBackend>(model, memory.source, plan(), device, asio::use_future);
  test::run_until_ready(memory.ctx, done);

  check_exact_bytes(model, memory);
  CHECK(memory.source.reads() > 0);
}

TEST_CASE(
    "orchestration – a load from an in-memory byte source that needs a re-read to verify is refused before "
    "any read",
    "[engine][orchestration][byte_source]") {
  Memory memory;
  cpu::Executor executor{2};
  cpu::StoragePool storage;
  cpu::MaterializationContext mc{executor, storage};
  test::SlotModule<cpu::Parameter> model(slots());
  io::Checksums sums;
  for (std::size_t i = 0; i < source_specs.size(); ++i)
    sums.add(source_specs[i].name, io::DigestKind::sha256, io::digest_hex(io::DigestKind::sha256, memory.data[i]));
  engine::MaterializeOptions options{.verify = {.mode = engine::VerifyMode::on, .checksums = sums}};

  auto done = engine::async_load<cpu::Backend>(model, memory.source, plan(), mc, options, asio::use_future);
  try {
    test::run_until_ready(memory.ctx, done);
    FAIL("the load was not refused");
  } catch (const Error& e) {
    CHECK(e.kind() == errc::invalid_argument);
  }
  CHECK(memory.source.reads() == 0);
  CHECK(model.slot("embed.weight").value.bytes().empty());  // nothing bound
}

TEST_CASE("pipeline – units prefetched from an in-memory byte source bind the exact bytes, pass after pass",
          "[engine][pipeline][byte_source]") {
  Memory memory;
  cpu::Executor executor{2};
  cpu::StoragePool storage;
  cpu::MaterializationContext mc{executor, storage};
  using Module = test::SlotModule<cpu::Parameter>;
  // Two units: the model of the cases above, and one tensor cast on its own.
  std::vector<engine::PipelineUnit> units;
  units.push_back({"model", plan()});
  units.push_back({"big", WeightBindingPlan({WeightBinding::from_recipe(
                              "big.weight", R::cast(R::source("big"), DType::F32), 60 * 33 * 4)})});
  auto make = [](std::size_t index) {
    return index == 0 ? Module(slots()) : Module({{"big.weight", DType::F32, {60, 33}}});
  };
  engine::PrefetchPipeline<cpu::Backend, Module, test::VectorSource> pipeline(memory.source, std::move(units), make, mc,
                                                                              {.lookahead = 1, .passes = 2});
  std::size_t delivered = 0;
  for (;;) {
    auto next = pipeline.async_next(asio::use_future);
    auto unit = test::run_until_ready(memory.ctx, next);
    if (!unit) break;
    INFO(unit.name() << " pass " << unit.pass());
    CHECK(unit.index() == delivered % 2);
    unit.module().for_each([&](const std::string& name, const cpu::Parameter& p) {
      INFO(name);
      CHECK(bytes_of(p) == memory.expected(name));
    });
    ++delivered;
  }
  CHECK(delivered == 4);
  auto closed = pipeline.async_close(asio::use_future);
  test::run_until_ready(memory.ctx, closed);
}
