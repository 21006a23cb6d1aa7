// The CPU backend fed by a source that is not a file: test::VectorSource, a second model of
// io::ByteSource that declares no optional capability. The backend needs no change for it:
// the placement planner sends every weight down the landings such a source serves (read into
// storage, chunk streams), and the bytes arrive exact.

#include <asio/io_context.hpp>
#include <catch2/catch.hpp>
#include <vector>

#include "cpu/cpu_fixture.hpp"
#include "eredu/cpu/backend.hpp"
#include "eredu/cpu/convert.hpp"
#include "io/read_fixture.hpp"
#include "support/vector_source.hpp"

using namespace eredu;
using engine::DerivedWeightRecipe;

namespace {

std::vector<std::byte> bytes_of(const cpu::Tensor& t) { return {t.bytes().begin(), t.bytes().end()}; }

}  // namespace

TEST_CASE("cpu backend: weights from an in-memory byte source, kept, selected, cast and joined") {
  const std::vector<synth::TensorSpec> specs{{"w", DType::F32, {64, 48}}, {"h", DType::BF16, {40, 33}}};
  const std::vector<std::vector<std::byte>> data = test::random_tensor_bytes(specs, 5);
  asio::io_context ctx;
  // Chunks of 1000 bytes: they split elements, so the cast must carry units across chunks.
  test::VectorSource memory(ctx.get_executor(), std::size_t{1} << 20, 1000);
  for (std::size_t i = 0; i < specs.size(); ++i) memory.add(specs[i].name, specs[i].dtype, specs[i].shape, data[i]);
  cpu::Executor executor{2};
  cpu::StoragePool storage;
  cpu::MaterializationContext mc{executor, storage};
  // Everything a file source could do is asked for; this source declares none of it.
  mc.weights = cpu::WeightStorage::mapped;
  mc.copy_resident_on_executor = true;

  SECTION("kept whole: read into storage") {
    const cpu::Tensor w = test::finish(ctx, cpu::Backend::materialize(memory, io::TensorReadRequest{"w"}, mc, {}));
    CHECK(w.dtype() == DType::F32);
    CHECK(w.shape() == Shape{64, 48});
    CHECK(w.storage()->mapping() == nullptr);
    CHECK(bytes_of(w) == data[0]);
  }
  SECTION("kept, a block of rows and columns") {
    const Selection sel{{{3, 40}, {8, 20}}};
    const cpu::Tensor w = test::finish(ctx, cpu::Backend::materialize(memory, io::TensorReadRequest{"w", sel}, mc, {}));
    CHECK(w.shape() == Shape{37, 12});
    CHECK(bytes_of(w) == test::select_bytes(data[0], specs[0].shape, DType::F32, sel));
  }
  SECTION("cast: streamed in chunk leases and converted") {
    const std::size_t before = memory.reads();
    const cpu::Tensor h =
        test::finish(ctx, cpu::Backend::materialize_recipe(
                              memory, DerivedWeightRecipe::cast(DerivedWeightRecipe::source("h"), DType::F32), mc, {}));
    std::vector<std::byte> expected(data[1].size() * 2);
    cpu::convert_serial(DType::BF16, DType::F32, data[1], expected);
    CHECK(bytes_of(h) == expected);
    // 2640 stored bytes in 1000-byte chunks: three leases.
    CHECK(memory.reads() - before == 3);
  }
  SECTION("a recipe joining two reads") {
    const auto recipe = DerivedWeightRecipe::concat({DerivedWeightRecipe::source("w", Selection{{{0, 10}, {0, 48}}}),
                                                     DerivedWeightRecipe::source("w", Selection{{{60, 64}, {0, 48}}})},
                                                    0);
    const cpu::Tensor j = test::finish(ctx, cpu::Backend::materialize_recipe(memory, recipe, mc, {}));
    std::vector<std::byte> expected = test::select_bytes(data[0], specs[0].shape, DType::F32, {{{0, 10}, {0, 48}}});
    for (std::byte b : test::select_bytes(data[0], specs[0].shape, DType::F32, {{{60, 64}, {0, 48}}}))
      expected.push_back(b);
    CHECK(bytes_of(j) == expected);
  }
}
