// Dequantization, bit for bit as ggml: every quantized type of ggml's fixture against ggml's
// own f32, on both CPU kernel sets and the core reference; the Llama-shaped Q4_K_M model by
// sha256; bf16/f16 as one rounding of those f32; and the CPU backend's paths (mapped, staged
// chunks, layout recipes over blocks, selections of whole rows, dtype-kept loads).
#include "eredu/core/quant_formats.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstring>

#include "cpu/cpu_fixture.hpp"
#include "eredu/core/error.hpp"
#include "eredu/cpu/convert.hpp"
#include "eredu/engine/description/recipe.hpp"
#include "eredu/io/formats/open_catalog.hpp"
#include "gguf/gguf_fixture.hpp"

using namespace eredu;
using engine::DerivedWeightRecipe;
namespace fs = std::filesystem;

namespace {

// Restores the best kernels when a test that picked a set ends.
struct IsaScope {
  explicit IsaScope(cpu::ConvertIsa isa) { cpu::use_convert_isa(isa); }
  ~IsaScope() { cpu::use_convert_isa(cpu::ConvertIsa::best); }
};

std::vector<std::byte> dequantized(DType from, DType to, const std::vector<std::byte>& in, bool parallel) {
  const DTypeBlock block = dtype_block(from);
  std::vector<std::byte> out(in.size() / block.bytes * block.elements * (dtype_bits(to) / 8), std::byte{0x5A});
  parallel ? cpu::convert(from, to, in, out) : cpu::convert_serial(from, to, in, out);
  return out;
}

std::vector<std::byte> rounded(const std::vector<std::byte>& f32, DType to) {
  std::vector<std::byte> out(f32.size() / 2);
  for (std::size_t i = 0; i < f32.size() / 4; ++i) {
    std::uint32_t bits;
    std::memcpy(&bits, f32.data() + 4 * i, 4);
    const std::uint16_t h = to == DType::BF16 ? formats::f32_to_bf16(bits) : formats::f32_to_f16(bits);
    std::memcpy(out.data() + 2 * i, &h, 2);
  }
  return out;
}

// The offset of the first byte where `a` and `b` differ, or -1 when they are equal (a failing
// check then prints one number, not megabytes).
std::ptrdiff_t first_difference(std::span<const std::byte> a, std::span<const std::byte> b) {
  if (a.size() != b.size()) return static_cast<std::ptrdiff_t>(std::min(a.size(), b.size()));
  const auto at = std::mismatch(a.begin(), a.end(), b.begin());
  return at.first == a.end() ? -1 : at.first - a.begin();
}

std::uint64_t grid64(const std::uint8_t* grid, std::size_t i) {
  std::uint64_t v = 0;
  std::memcpy(&v, grid + 8 * i, 8);
  return v;
}
std::uint32_t grid32(const std::uint8_t* grid, std::size_t i) {
  std::uint32_t v = 0;
  std::memcpy(&v, grid + 4 * i, 4);
  return v;
}

}  // namespace

TEST_CASE("dequantize – the IQ codebooks expand to ggml's grids", "[gguf][dequantize]") {
  using namespace quant;
  CHECK(grid64(iq2xxs_grid.data(), 0) == 0x0808080808080808ull);
  CHECK(grid64(iq2xxs_grid.data(), 1) == 0x080808080808082bull);
  CHECK(grid64(iq2xxs_grid.data(), 16) == 0x08080808192b1908ull);
  CHECK(grid64(iq2xxs_grid.data(), 17) == 0x080808082b080808ull);
  CHECK(grid64(iq2xxs_grid.data(), 255) == 0x2b2b2b1908081908ull);
  CHECK(grid64(iq2xs_grid.data(), 7) == 0x080808080819192bull);
  CHECK(grid64(iq2s_grid.data(), 1023) == 0x2b2b2b2b2b2b2b2bull);
  CHECK(grid64(iq1s_grid.data(), 3) == 0xffffffffffff01ffull);
  CHECK(grid64(iq1s_grid.data(), 5) == 0xffffffffff00ff00ull);
  CHECK(grid32(iq3xxs_grid.data(), 5) == 0x04040c3eu);
  CHECK(grid32(iq3xxs_grid.data(), 255) == 0x3e341c04u);
  CHECK(grid32(iq3s_grid.data(), 3) == 0x0101010bu);
  CHECK(grid32(iq3s_grid.data(), 511) == 0x0f0f0101u);
  // ggml's ksigns_iq2xs: parity completes every 7-bit pattern.
  CHECK(iq_signs(0) == 0);
  CHECK(iq_signs(1) == 129);
  CHECK(iq_signs(3) == 3);
  CHECK(iq_signs(127) == 255);
}

TEST_CASE("dequantize – every type of ggml's fixture gives exactly ggml's f32, on every kernel set",
          "[gguf][dequantize][fixtures]") {
  const fs::path dir = test::gguf_quant_dir();
  if (dir.empty()) {
    WARN("no ../shared/data/gguf-quant: skipping");
    return;
  }
  const std::string gguf_path = (dir / "quant-types.gguf").string();
  const std::string ref_path = (dir / "quant-types.dequant.safetensors").string();
  const io::Catalog quantized = io::open_catalog(gguf_path);
  const io::Catalog reference = io::open_catalog(ref_path);
  int types = 0;
  for (const io::TensorInfo& t : quantized.tensors()) {
    INFO(t.name << " " << dtype_name(t.dtype));
    const io::TensorInfo& r = reference.at(t.name);
    REQUIRE(r.dtype == DType::F32);
    REQUIRE(r.shape == t.shape);
    const auto in = test::read_range(gguf_path, t.offset, t.nbytes);
    const auto expected = test::read_range(ref_path, r.offset, r.nbytes);
    if (dtype_is_quantized(t.dtype)) {
      // The core reference, block by block.
      const DTypeBlock block = dtype_block(t.dtype);
      std::vector<float> values(in.size() / block.bytes * block.elements);
      for (std::size_t b = 0; b < in.size() / block.bytes; ++b) {
        REQUIRE(quant::dequantize_block(t.dtype, reinterpret_cast<const std::uint8_t*>(in.data()) + b * block.bytes,
                                        values.data() + b * block.elements, quant::host_quant_grids()));
      }
      CHECK(std::memcmp(values.data(), expected.data(), expected.size()) == 0);
    }
    for (auto isa : {cpu::ConvertIsa::best, cpu::ConvertIsa::avx2, cpu::ConvertIsa::generic}) {
      IsaScope scope(isa);
      INFO(cpu::convert_isa_name());
      for (bool parallel : {false, true}) {
        CHECK(dequantized(t.dtype, DType::F32, in, parallel) == expected);
        CHECK(dequantized(t.dtype, DType::BF16, in, parallel) == rounded(expected, DType::BF16));
        CHECK(dequantized(t.dtype, DType::F16, in, parallel) == rounded(expected, DType::F16));
      }
    }
    types += dtype_is_quantized(t.dtype);
  }
  CHECK(types == 22);
}

TEST_CASE("dequantize – the Llama-shaped Q4_K_M model dequantizes to ggml's sha256, on every kernel set",
          "[gguf][dequantize][fixtures]") {
  const fs::path dir = test::gguf_quant_dir();
  if (dir.empty()) {
    WARN("no ../shared/data/gguf-quant: skipping");
    return;
  }
  const test::JsonFile manifest(dir / "MANIFEST.json");
  const auto entry = *test::member(*test::member(manifest.doc.root(), "files"), "tiny-llama-q4_k_m.gguf");
  const std::string path = (dir / "tiny-llama-q4_k_m.gguf").string();
  const io::Catalog catalog = io::open_catalog(path);
  int checked = 0;
  for (auto isa : {cpu::ConvertIsa::best, cpu::ConvertIsa::avx2, cpu::ConvertIsa::generic}) {
    IsaScope scope(isa);
    for (const auto& t : test::member(entry, "tensors")->items()) {
      const io::TensorInfo& info = catalog.at(test::member(t, "name")->as_string());
      INFO(info.name << " " << cpu::convert_isa_name());
      const auto in = test::read_range(path, info.offset, info.nbytes);
      const auto f32 = info.dtype == DType::F32 ? in : dequantized(info.dtype, DType::F32, in, true);
      CHECK(io::sha256_hex(f32) == test::member(t, "dequant_f32_sha256")->as_string());
      ++checked;
    }
  }
  CHECK(checked == 3 * 39);
}

TEST_CASE("dequantize – every kernel gives the reference's bits on random blocks, NaN and infinite scales included",
          "[gguf][dequantize]") {
  // Random bytes make every f16 scale a NaN or an infinity about once in 32 blocks and a
  // subnormal as often, and hit every integer pattern; the AVX2 kernels skip their NaN check
  // only for blocks whose scales are finite, so both of their paths run.
  std::uint64_t state = 0x9E37'79B9'7F4A'7C15ull;
  auto next = [&state] {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return state;
  };
  int types = 0;
  using D = DType;
  for (DType t : {D::Q4_0,  D::Q4_1,  D::Q5_0,   D::Q5_1,    D::Q8_0,   D::Q2_K,  D::Q3_K,    D::Q4_K,
                  D::Q5_K,  D::Q6_K,  D::Q8_K,   D::IQ2_XXS, D::IQ2_XS, D::IQ2_S, D::IQ3_XXS, D::IQ3_S,
                  D::IQ1_S, D::IQ1_M, D::IQ4_NL, D::IQ4_XS,  D::TQ1_0,  D::TQ2_0, D::MXFP4}) {
    REQUIRE(quant::has_dequantization(t));
    INFO(dtype_name(t));
    const DTypeBlock block = dtype_block(t);
    const std::size_t blocks = 2048;
    std::vector<std::byte> in(blocks * block.bytes);
    for (auto& b : in) b = static_cast<std::byte>(next() >> 56);
    std::vector<std::byte> expected(blocks * block.elements * 4);
    for (std::size_t k = 0; k < blocks; ++k) {
      REQUIRE(quant::dequantize_block(t, reinterpret_cast<const std::uint8_t*>(in.data()) + k * block.bytes,
                                      reinterpret_cast<float*>(expected.data()) + k * block.elements,
                                      quant::host_quant_grids()));
    }
    for (auto isa : {cpu::ConvertIsa::best, cpu::ConvertIsa::avx2, cpu::ConvertIsa::generic}) {
      IsaScope scope(isa);
      INFO(cpu::convert_isa_name());
      for (DType to : {DType::F32, DType::BF16, DType::F16}) {
        INFO(dtype_name(to));
        const auto want = to == DType::F32 ? expected : rounded(expected, to);
        // Streaming stores into an aligned output, and the plain fallback at 16 bytes past it.
        std::vector<std::byte> storage(want.size() + 128);
        auto* base =
            reinterpret_cast<std::byte*>((reinterpret_cast<std::uintptr_t>(storage.data()) + 63) & ~std::uintptr_t{63});
        for (std::size_t skew : {0, 16}) {
          const std::span<std::byte> out(base + skew, want.size());
          std::fill(out.begin(), out.end(), std::byte{0x5A});
          cpu::convert_serial(t, to, in, out, cpu::ConvertStores::streaming);
          CHECK(first_difference(out, want) == -1);
        }
        CHECK(first_difference(dequantized(t, to, in, true), want) == -1);
      }
    }
    ++types;
  }
  CHECK(types == 23);  // the fixture's 22 and Q8_K
}

TEST_CASE("dequantize – casts the float formats do not define are refused before anything is written",
          "[gguf][dequantize][errors]") {
  std::vector<std::byte> in(36), out(128, std::byte{0x5A});
  for (DType to : {DType::F32, DType::BF16}) {
    CHECK_FALSE(is_supported_cast(DType::Q8_1, to));
    CHECK_FALSE(cpu::convert_supported(DType::Q8_1, to));
    try {
      cpu::convert(DType::Q8_1, to, in, out);
      FAIL("converted");
    } catch (const Error& e) {
      CHECK(e.kind() == errc::recipe_unsupported_cast);
    }
  }
  CHECK_FALSE(is_supported_cast(DType::Q4_K, DType::I32));
  CHECK_FALSE(is_supported_cast(DType::F32, DType::Q4_K));
  CHECK(is_supported_cast(DType::Q4_K, DType::Q4_K));
  // Buffers that are not whole blocks.
  std::vector<std::byte> partial(144 + 7), f32(1024 + 28);
  CHECK_THROWS_AS(cpu::convert(DType::Q4_K, DType::F32, partial, f32), Error);
  CHECK(std::all_of(out.begin(), out.end(), [](std::byte b) { return b == std::byte{0x5A}; }));
}

namespace {

// A CPU backend over ggml's Llama-shaped fixture.
struct GgufEnv {
  asio::io_context ctx;
  std::unique_ptr<io::CheckpointSource> source;
  cpu::Executor executor{2};
  cpu::StoragePool storage;
  cpu::MaterializationContext mc{executor, storage};
  std::string path;

  GgufEnv(const fs::path& file, io::SourceOptions options) : path(file.string()) {
    source = io::CheckpointSource::open(ctx.get_executor(), file, options);
  }
  cpu::Tensor run(const DerivedWeightRecipe& recipe) {
    return test::finish(ctx, cpu::Backend::materialize_recipe(*source, recipe, mc, {}));
  }
  cpu::Tensor read(const io::TensorReadRequest& request) {
    return test::finish(ctx, cpu::Backend::materialize(*source, request, mc, {}));
  }
  std::vector<std::byte> stored(const std::string& name) const {
    const io::TensorInfo& t = source->catalog().at(name);
    return test::read_range(path, t.offset, t.nbytes);
  }
  std::vector<std::byte> f32(const std::string& name) const {
    const io::TensorInfo& t = source->catalog().at(name);
    return dequantized(t.dtype, DType::F32, stored(name), false);
  }
};

// Rows [begin, end) of a row-major matrix of `row_bytes` rows.
std::vector<std::byte> rows(const std::vector<std::byte>& m, std::size_t row_bytes, std::size_t begin,
                            std::size_t end) {
  return {m.begin() + static_cast<std::ptrdiff_t>(begin * row_bytes),
          m.begin() + static_cast<std::ptrdiff_t>(end * row_bytes)};
}

}  // namespace

TEST_CASE("dequantize – the CPU backend casts GGUF tensors from the page cache and in bounded chunks",
          "[gguf][dequantize][cpu]") {
  const fs::path dir = test::gguf_quant_dir();
  if (dir.empty()) {
    WARN("no ../shared/data/gguf-quant: skipping");
    return;
  }
  for (bool mapped : {true, false}) {
    INFO((mapped ? "mapped" : "staged chunks"));
    io::SourceOptions options = test::small_source_options(std::size_t{64} << 10);
    options.chunk_bytes = 10000;  // not a multiple of any block: blocks split across chunks
    options.map_resident = mapped;
    GgufEnv env(dir / "tiny-llama-q4_k_m.gguf", options);
    for (const char* name : {"token_embd.weight", "blk.1.ffn_down.weight", "output.weight", "blk.0.attn_norm.weight"}) {
      INFO(name);
      for (DType to : {DType::F32, DType::BF16}) {
        cpu::Tensor t = env.run(DerivedWeightRecipe::cast(DerivedWeightRecipe::source(name), to));
        CHECK(t.dtype() == to);
        CHECK(t.shape() == env.source->catalog().at(name).shape);
        const auto expected = to == DType::F32 ? env.f32(name) : rounded(env.f32(name), DType::BF16);
        CHECK(test::to_vector(t.bytes()) == expected);
      }
    }
    CHECK(env.source->pool().high_water() <= env.source->pool().budget());
    CHECK(env.source->pool().in_use() == 0);
  }
}

TEST_CASE("dequantize – kept-dtype loads deliver the blocks byte for byte, whole rows read only their blocks",
          "[gguf][dequantize][cpu]") {
  const fs::path dir = test::gguf_quant_dir();
  if (dir.empty()) {
    WARN("no ../shared/data/gguf-quant: skipping");
    return;
  }
  GgufEnv env(dir / "tiny-llama-q4_k_m.gguf", test::small_source_options());
  const std::string name = "blk.2.ffn_gate.weight";  // Q4_K [512, 256]: one block per row
  const io::TensorInfo& info = env.source->catalog().at(name);
  REQUIRE(info.dtype == DType::Q4_K);
  cpu::Tensor whole = env.read({name});
  CHECK(whole.dtype() == DType::Q4_K);
  CHECK(test::to_vector(whole.bytes()) == env.stored(name));
  const Selection some = Selection::rows(info.shape, 100, 164);
  CHECK(env.source->selected_bytes({name, some}) == 64 * 144);
  cpu::Tensor part = env.read({name, some});
  CHECK(part.shape() == Shape{64, 256});
  CHECK(test::to_vector(part.bytes()) == rows(env.stored(name), 144, 100, 164));
  // A column range cuts the rows' blocks.
  try {
    env.source->selected_bytes({name, Selection::columns(info.shape, 0, 128)});
    FAIL("accepted");
  } catch (const Error& e) {
    CHECK(e.kind() == errc::invalid_selection);
    CHECK_THAT(e.what(), Catch::Contains("cuts Q4_K blocks of 256"));
  }
  // The same through recipe inference.
  try {
    DerivedWeightRecipe::source(name, Selection::columns(info.shape, 0, 128)).infer(env.source->catalog());
    FAIL("accepted");
  } catch (const Error& e) {
    CHECK(e.kind() == errc::recipe_cuts_block);
  }
}

TEST_CASE("dequantize – layout recipes move whole blocks and refuse to cut one", "[gguf][dequantize][recipe]") {
  const fs::path dir = test::gguf_quant_dir();
  if (dir.empty()) {
    WARN("no ../shared/data/gguf-quant: skipping");
    return;
  }
  GgufEnv env(dir / "tiny-llama-q4_k_m.gguf", test::small_source_options());
  using R = DerivedWeightRecipe;
  const std::string q = "blk.0.attn_q.weight", k = "blk.0.attn_k.weight";  // Q4_K [256, 256], [128, 256]
  const auto qs = env.stored(q), ks = env.stored(k);
  // A fused QKV-style concat of quantized rows, dtype kept: the blocks, in order.
  cpu::Tensor fused = env.run(R::concat({R::source(q), R::source(k)}, 0));
  std::vector<std::byte> joined = qs;
  joined.insert(joined.end(), ks.begin(), ks.end());
  CHECK(fused.dtype() == DType::Q4_K);
  CHECK(fused.shape() == Shape{384, 256});
  CHECK(test::to_vector(fused.bytes()) == joined);
  // A slice of rows, then a dequantizing cast.
  cpu::Tensor sliced = env.run(R::cast(R::slice(R::source(q), 0, {8, 24}), DType::F32));
  CHECK(test::to_vector(sliced.bytes()) == rows(env.f32(q), 256 * 4, 8, 24));
  // Along the last dimension on block boundaries, and a permute that keeps the last dim last
  // (a reshape to rank 3 first), through temporaries.
  const std::string wide = "blk.0.ffn_down.weight";  // Q6_K [256, 512]: two blocks per row
  cpu::Tensor right = env.run(R::cast(R::slice(R::reshape(R::source(wide), {256, 512}), 1, {256, 512}), DType::F32));
  std::vector<std::byte> expected;
  const auto full = env.f32(wide);
  for (std::size_t r = 0; r < 256; ++r)
    expected.insert(expected.end(), full.begin() + static_cast<std::ptrdiff_t>(r * 2048 + 1024),
                    full.begin() + static_cast<std::ptrdiff_t>(r * 2048 + 2048));
  CHECK(test::to_vector(right.bytes()) == expected);
  cpu::Tensor swapped = env.run(R::cast(R::permute(R::reshape(R::source(wide), {2, 128, 512}), {1, 0, 2}), DType::F32));
  std::vector<std::byte> expected_swap;
  for (std::size_t i = 0; i < 128; ++i)
    for (std::size_t j = 0; j < 2; ++j) {
      const std::size_t row = j * 128 + i;
      expected_swap.insert(expected_swap.end(), full.begin() + static_cast<std::ptrdiff_t>(row * 2048),
                           full.begin() + static_cast<std::ptrdiff_t>((row + 1) * 2048));
    }
  CHECK(test::to_vector(swapped.bytes()) == expected_swap);
  // What would cut a block fails before any read, with its kind.
  const io::Catalog& c = env.source->catalog();
  for (const R& bad : {R::transpose(R::source(q)), R::slice(R::source(wide), 1, {0, 100}),
                       R::reshape(R::source(q), {512, 128}), R::reshape(R::source(q), {65536})}) {
    INFO(bad.to_string());
    if (bad.kind() == R::Kind::reshape && bad.shape().size() == 1) {
      CHECK_NOTHROW(bad.infer(c));  // 65536 values: whole blocks in one row
      continue;
    }
    try {
      bad.infer(c);
      FAIL("accepted");
    } catch (const Error& e) {
      CHECK(e.kind() == errc::recipe_cuts_block);
      CHECK_THAT(e.what(), Catch::Contains("Q"));
    }
  }
}
