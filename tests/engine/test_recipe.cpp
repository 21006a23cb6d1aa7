// Derived-weight recipes: metadata inference of every node kind on a real safetensors file,
// every RecipeError kind with its message, sharing and structural equality.

#include "eredu/engine/description/recipe.hpp"

#include <catch2/catch.hpp>

#include <cstddef>
#include <filesystem>
#include <limits>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "eredu/core/error.hpp"
#include "eredu/engine/orchestration/engine_error.hpp"
#include "eredu/io/formats/open_catalog.hpp"
#include "eredu/synth/safetensors_writer.hpp"
#include "support/temp_dir.hpp"

using namespace eredu;
using namespace eredu::engine;
using R = DerivedWeightRecipe;

namespace {

// A small checkpoint written to a temporary directory and opened as a catalog.
class Checkpoint {
 public:
  Checkpoint() {
    const std::vector<synth::TensorSpec> specs{
        {"q", DType::BF16, {8, 16}},      {"k", DType::BF16, {4, 16}},   {"v", DType::BF16, {4, 16}},
        {"gate", DType::BF16, {32, 16}},  {"up", DType::BF16, {32, 16}}, {"w3", DType::F32, {2, 3, 4}},
        {"f8", DType::F8_E4M3, {16, 16}}, {"f4", DType::F4, {4, 8}},     {"i32", DType::I32, {4}},
        {"h", DType::F16, {4, 16}},
    };
    std::vector<std::vector<std::byte>> data;
    std::vector<std::span<const std::byte>> views;
    for (const auto& s : specs) data.emplace_back(synth::tensor_nbytes(s), std::byte{0x3c});
    for (const auto& d : data) views.emplace_back(d);
    path_ = dir_ / "model.safetensors";
    synth::write_safetensors(path_, specs, views);
    catalog_ = io::open_catalog(path_);
  }
  const io::Catalog& catalog() const noexcept { return catalog_; }
  std::string file() const { return catalog_.files().front().path; }

 private:
  test::TempDir dir_;
  std::filesystem::path path_;
  io::Catalog catalog_;
};

// One file for the whole run: written once, removed at exit.
const Checkpoint& shared_checkpoint() {
  static const Checkpoint checkpoint;
  return checkpoint;
}

InferredWeight infer(const R& r) { return r.infer(shared_checkpoint().catalog()); }

// Infers `r`, expecting RecipeError of `kind` whose message holds every fragment.
void require_error(const R& r, errc kind, std::initializer_list<std::string> fragments) {
  INFO("recipe: " << r.to_string());
  try {
    (void)r.infer(shared_checkpoint().catalog());
    FAIL("inference succeeded");
  } catch (const RecipeError& e) {
    INFO("message: " << e.what());
    CHECK(errc_name(e.kind()) == std::string(errc_name(kind)));
    CHECK(e.family() == error_family::recipe);
    for (const auto& f : fragments) CHECK_THAT(e.what(), Catch::Contains(f));
  }
}

R src(const char* key) { return R::source(key); }

}  // namespace

TEST_CASE("recipe – a source infers its tensor's dtype, shape and bytes", "[engine][recipe]") {
  CHECK(infer(src("q")) == InferredWeight{DType::BF16, {8, 16}, 256});
  CHECK(infer(src("w3")) == InferredWeight{DType::F32, {2, 3, 4}, 96});
  CHECK(infer(src("f4")) == InferredWeight{DType::F4, {4, 8}, 16});
  // A tensor-parallel shard: rows 2..6, then the last 8 columns.
  CHECK(infer(R::source("q", Selection::rows({8, 16}, 2, 6))) == InferredWeight{DType::BF16, {4, 16}, 128});
  CHECK(infer(R::source("q", Selection::columns({8, 16}, 8, 16))) == InferredWeight{DType::BF16, {8, 8}, 128});
  CHECK(infer(R::source("q", Selection::rows({8, 16}, 3, 3))) == InferredWeight{DType::BF16, {0, 16}, 0});
}

TEST_CASE("recipe – slice keeps a range of one dimension", "[engine][recipe]") {
  CHECK(infer(R::slice(src("q"), 0, {2, 6})) == InferredWeight{DType::BF16, {4, 16}, 128});
  CHECK(infer(R::slice(src("w3"), 2, {1, 4})) == InferredWeight{DType::F32, {2, 3, 3}, 72});
  CHECK(infer(R::slice(src("q"), 1, {16, 16})).bytes == 0);
}

TEST_CASE("recipe – fused QKV and gate+up concatenations", "[engine][recipe]") {
  const R qkv = R::concat({src("q"), src("k"), src("v")}, 0);
  CHECK(infer(qkv) == InferredWeight{DType::BF16, {16, 16}, 512});
  CHECK(qkv.inputs().size() == 3);
  CHECK(qkv.dim() == 0);
  const R gate_up = R::concat({src("gate"), src("up")}, 0);
  CHECK(infer(gate_up) == InferredWeight{DType::BF16, {64, 16}, 2048});
  // Along the inner dimension, and of a single input.
  CHECK(infer(R::concat({src("k"), src("v"), src("k")}, 1)).shape == Shape{4, 48});
  CHECK(infer(R::concat({src("q")}, 1)) == infer(src("q")));
}

TEST_CASE("recipe – transpose swaps the last two dimensions", "[engine][recipe]") {
  const R t = R::transpose(src("q"));
  CHECK(t.kind() == R::Kind::permute);
  CHECK(infer(t) == InferredWeight{DType::BF16, {16, 8}, 256});
  // A whole-tensor source has no rank until the catalog is known: resolved at use.
  CHECK(t.swaps_last_two());
  CHECK(std::vector<std::size_t>(t.order().begin(), t.order().end()) == std::vector<std::size_t>{1, 0});
  CHECK(t.permutation(2) == std::vector<std::size_t>{1, 0});
  CHECK(t.permutation(3) == std::vector<std::size_t>{0, 2, 1});
  CHECK(infer(R::transpose(src("w3"))).shape == Shape{2, 4, 3});
  CHECK(infer(R::transpose(R::transpose(src("w3")))).shape == Shape{2, 3, 4});
  // Where the rank is known statically, transpose is an explicit permute.
  const R shard = R::transpose(R::source("w3", Selection{{{0, 2}, {0, 3}, {1, 3}}}));
  CHECK_FALSE(shard.swaps_last_two());
  CHECK(std::vector<std::size_t>(shard.order().begin(), shard.order().end()) == std::vector<std::size_t>{0, 2, 1});
  CHECK(infer(shard).shape == Shape{2, 2, 3});
  CHECK(R::transpose(R::reshape(src("q"), {4, 32})) == R::permute(R::reshape(src("q"), {4, 32}), {1, 0}));
}

TEST_CASE("recipe – permute reorders dimensions", "[engine][recipe]") {
  CHECK(infer(R::permute(src("w3"), {2, 0, 1})) == InferredWeight{DType::F32, {4, 2, 3}, 96});
  CHECK(infer(R::permute(src("w3"), {0, 1, 2})).shape == Shape{2, 3, 4});
  CHECK(infer(R::permute(src("i32"), {0})).shape == Shape{4});
}

TEST_CASE("recipe – reshape keeps the elements and bytes", "[engine][recipe]") {
  CHECK(infer(R::reshape(src("w3"), {6, 4})) == InferredWeight{DType::F32, {6, 4}, 96});
  CHECK(infer(R::reshape(src("q"), {128})) == InferredWeight{DType::BF16, {128}, 256});
  CHECK(infer(R::reshape(src("f4"), {32})) == InferredWeight{DType::F4, {32}, 16});  // no data moves
  CHECK(infer(R::reshape(R::slice(src("q"), 0, {0, 1}), {1, 1, 16})).shape == Shape{1, 1, 16});
}

TEST_CASE("recipe – cast changes the dtype and the bytes with it", "[engine][recipe]") {
  const auto bf16 = infer(src("q"));
  const auto f32 = infer(R::cast(src("q"), DType::F32));
  CHECK(f32 == InferredWeight{DType::F32, {8, 16}, 512});
  CHECK(f32.bytes == 2 * bf16.bytes);
  CHECK(infer(R::cast(src("f8"), DType::BF16)) == InferredWeight{DType::BF16, {16, 16}, 512});
  CHECK(infer(R::cast(src("w3"), DType::F16)).bytes == 48);
  CHECK(infer(R::cast(src("f4"), DType::F4)).bytes == 16);  // identity casts are always supported
  CHECK(infer(R::cast(R::concat({src("q"), src("k")}, 0), DType::F32)).bytes == 768);
}

TEST_CASE("recipe – the supported casts are exactly the CPU kernels' set", "[engine][recipe]") {
  const DType floats[] = {DType::F16, DType::BF16, DType::F32};
  const DType f8s[] = {DType::F8_E4M3, DType::F8_E5M2, DType::F8_E8M0};
  for (auto a : floats) {
    for (auto b : floats) CHECK(is_supported_cast(a, b));
  }
  for (auto a : f8s) {
    CHECK(is_supported_cast(a, DType::BF16));
    CHECK(is_supported_cast(a, DType::F32));
    CHECK_FALSE(is_supported_cast(a, DType::F16));
    CHECK_FALSE(is_supported_cast(DType::F32, a));  // no narrowing to f8
  }
  CHECK(is_supported_cast(DType::I32, DType::I32));
  CHECK_FALSE(is_supported_cast(DType::I32, DType::F32));
  CHECK_FALSE(is_supported_cast(DType::F64, DType::F32));
  CHECK_FALSE(is_supported_cast(DType::F8_E4M3FNUZ, DType::F32));
  CHECK_FALSE(is_supported_cast(DType::F8_E4M3, DType::F8_E5M2));
  CHECK_FALSE(is_supported_cast(DType::F4, DType::F32));
  int supported = 0;
  for (std::size_t a = 0; a < dtype_count; ++a) {
    for (std::size_t b = 0; b < dtype_count; ++b) supported += is_supported_cast(DType(a), DType(b)) ? 1 : 0;
  }
  // Identities, 16/32-bit floats, f8 widenings, and 23 quantized types (all but Q8_1) to 3 floats.
  CHECK(supported == int(dtype_count) + 6 + 6 + 23 * 3);
}

TEST_CASE("recipe – unknown keys name the key, the path and the file", "[engine][recipe]") {
  const std::string file = shared_checkpoint().file();
  require_error(src("nope"), errc::recipe_unknown_key, {"source 'nope'", "no tensor 'nope'", file, "10 tensors"});
  require_error(R::concat({src("q"), src("k_proj")}, 0), errc::recipe_unknown_key,
                {"recipe concat[1] > source 'k_proj':", "tensor 'k_proj'"});
  require_error(R::concat({src("q"), R::cast(src("missing"), DType::F32)}, 0), errc::recipe_unknown_key,
                {"recipe concat[1] > cast > source 'missing':"});
  require_error(R::transpose(R::slice(src("gone"), 0, {0, 1})), errc::recipe_unknown_key,
                {"recipe transpose > slice > source 'gone':"});
}

TEST_CASE("recipe – a selection that does not fit is recipe_invalid_selection", "[engine][recipe]") {
  const std::string file = shared_checkpoint().file();
  require_error(R::source("q", Selection::rows({8, 16}, 2, 9)), errc::recipe_invalid_selection,
                {file, "tensor 'q'", "[2:9, 0:16]", "[8, 16]", "range 2:9 of dimension 0 does not fit its size 8"});
  require_error(R::source("q", Selection{{{0, 4}}}), errc::recipe_invalid_selection,
                {"1 ranges but the tensor has rank 2"});
  require_error(R::source("q", Selection{{{5, 4}, {0, 16}}}), errc::recipe_invalid_selection, {"5:4"});
}

TEST_CASE("recipe – rank mismatches are recipe_rank_mismatch", "[engine][recipe]") {
  require_error(R::concat({src("q"), R::reshape(src("k"), {64})}, 0), errc::recipe_rank_mismatch,
                {"recipe concat:", "input 1 has shape [64] (rank 1) but input 0 has [8, 16] (rank 2)", "tensor 'k'"});
  require_error(R::permute(src("w3"), {1, 0}), errc::recipe_rank_mismatch,
                {"recipe permute:", "order [1, 0] has 2 entries", "[2, 3, 4] (rank 3)", "tensor 'w3'"});
  require_error(R::transpose(src("i32")), errc::recipe_rank_mismatch,
                {"recipe transpose:", "needs rank 2 or more", "[4] (rank 1)"});
}

TEST_CASE("recipe – shape mismatches are recipe_shape_mismatch", "[engine][recipe]") {
  const std::string file = shared_checkpoint().file();
  require_error(R::concat({src("q"), src("gate")}, 1), errc::recipe_shape_mismatch,
                {"recipe concat:", "input 1 has shape [32, 16] but input 0 has [8, 16]", "dim 0 differs (32 vs 8)",
                 "only dim 1 may", "tensor 'gate'", file});
  require_error(R::reshape(src("q"), {3, 5}), errc::recipe_shape_mismatch,
                {"recipe reshape:", "cannot reshape [8, 16] (128 elements) to [3, 5] (15 elements)", "tensor 'q'"});
  const std::uint64_t big = std::uint64_t{1} << 63;
  require_error(R::reshape(src("q"), {big, 4}), errc::recipe_shape_mismatch, {"more than 2^64 elements"});
  require_error(R::concat({}, 0), errc::recipe_shape_mismatch, {"concat of no inputs"});
}

TEST_CASE("recipe – dims and ranges outside the shape are recipe_bad_dim", "[engine][recipe]") {
  require_error(R::slice(src("q"), 2, {0, 1}), errc::recipe_bad_dim,
                {"recipe slice:", "dim 2 is out of range for the input's shape [8, 16] (rank 2)", "tensor 'q'"});
  require_error(R::slice(src("q"), 1, {4, 17}), errc::recipe_bad_dim, {"range 4:17 does not fit dim 1 of size 16"});
  require_error(R::slice(src("q"), 1, {5, 4}), errc::recipe_bad_dim, {"range 5:4"});
  require_error(R::concat({src("k"), src("v")}, 2), errc::recipe_bad_dim,
                {"dim 2 is out of range for inputs of rank 2"});
  require_error(R::permute(src("w3"), {0, 0, 1}), errc::recipe_bad_dim,
                {"order [0, 0, 1] is not a permutation of 0..2", "entry 0 repeats"});
  require_error(R::permute(src("w3"), {0, 3, 1}), errc::recipe_bad_dim, {"entry 3 is out of range"});
}

TEST_CASE("recipe – concat inputs of different dtypes are recipe_dtype_mismatch", "[engine][recipe]") {
  require_error(R::concat({src("k"), src("h")}, 0), errc::recipe_dtype_mismatch,
                {"recipe concat:", "input 1 is F16 but input 0 is BF16", "tensor 'h'"});
  // A cast makes them agree.
  CHECK(infer(R::concat({src("k"), R::cast(src("h"), DType::BF16)}, 0)).shape == Shape{8, 16});
}

TEST_CASE("recipe – casts outside the supported set are recipe_unsupported_cast", "[engine][recipe]") {
  require_error(R::cast(src("f8"), DType::F16), errc::recipe_unsupported_cast,
                {"recipe cast:", "cast from F8_E4M3 to F16 is not supported", "tensor 'f8'"});
  require_error(R::cast(src("i32"), DType::F32), errc::recipe_unsupported_cast, {"from I32 to F32"});
  require_error(R::cast(src("q"), DType::F8_E4M3), errc::recipe_unsupported_cast, {"from BF16 to F8_E4M3"});
}

TEST_CASE("recipe – layout of sub-byte dtypes is recipe_sub_byte_layout", "[engine][recipe]") {
  require_error(R::slice(src("f4"), 0, {0, 2}), errc::recipe_sub_byte_layout,
                {"recipe slice:", "slice of a F4 input (4-bit elements, shape [4, 8])", "tensor 'f4'"});
  require_error(R::concat({src("f4"), src("f4")}, 0), errc::recipe_sub_byte_layout, {"concat of a F4 input"});
  require_error(R::transpose(src("f4")), errc::recipe_sub_byte_layout, {"transpose of a F4 input"});
  require_error(R::permute(src("f4"), {0, 1}), errc::recipe_sub_byte_layout, {"permute of a F4 input"});
  require_error(R::source("f4", Selection::rows({4, 8}, 0, 2)), errc::recipe_sub_byte_layout,
                {"recipe source 'f4':", "selection [0:2, 0:8] of a F4 tensor", "only read whole"});
}

TEST_CASE("recipe – sizes that overflow 64 bits are rejected", "[engine][recipe]") {
  io::Catalog catalog;
  const auto file = catalog.add_file({.path = "/virtual/huge.safetensors", .format = "safetensors"});
  const std::uint64_t n = std::uint64_t{1} << 60;  // 2^60 one-byte elements: 2^63 bits, just fits
  catalog.add_tensor({.name = "huge", .dtype = DType::F8_E4M3, .shape = {n}, .file = file, .offset = 8, .nbytes = n});
  CHECK(R::source("huge").infer(catalog).bytes == n);
  try {
    (void)R::cast(R::source("huge"), DType::BF16).infer(catalog);
    FAIL("no overflow reported");
  } catch (const RecipeError& e) {
    CHECK(e.kind() == errc::recipe_shape_mismatch);
    CHECK_THAT(e.what(), Catch::Contains("/virtual/huge.safetensors: tensor 'huge': recipe cast:") &&
                             Catch::Contains("1152921504606846976 elements of BF16") &&
                             Catch::Contains("overflow 64-bit size arithmetic"));
  }
  try {
    (void)R::concat(std::vector<R>(16, R::source("huge")), 0).infer(catalog);
    FAIL("no overflow reported");
  } catch (const RecipeError& e) {
    CHECK(e.kind() == errc::recipe_shape_mismatch);
    CHECK_THAT(e.what(), Catch::Contains("dim 0 overflows 64 bits when input 15"));
  }
  CHECK_THROWS_AS(R::concat(std::vector<R>(4, R::source("huge")), 0).infer(catalog), RecipeError);
}

TEST_CASE("recipe – copies share nodes and compare equal, and equality is structural", "[engine][recipe]") {
  const R q = R::source("q");
  const R qkv = R::concat({q, src("k"), src("v")}, 0);
  const R copy = qkv;  // NOLINT(performance-unnecessary-copy-initialization): the point of the test
  CHECK(copy.shares_nodes_with(qkv));
  CHECK(copy == qkv);
  CHECK(qkv.inputs()[0].shares_nodes_with(q));  // inputs are shared, not cloned

  const R rebuilt = R::concat({src("q"), src("k"), src("v")}, 0);
  CHECK_FALSE(rebuilt.shares_nodes_with(qkv));
  CHECK(rebuilt == qkv);
  CHECK_FALSE(R::concat({src("q"), src("k"), src("v")}, 1) == qkv);
  CHECK_FALSE(R::concat({src("q"), src("v"), src("k")}, 0) == qkv);
  CHECK_FALSE(R::source("q", Selection::rows({8, 16}, 0, 4)) == q);
  CHECK_FALSE(R::cast(q, DType::F32) == R::cast(q, DType::F16));
  CHECK_FALSE(R::slice(q, 0, {0, 4}) == R::slice(q, 0, {0, 5}));
  CHECK_FALSE(R::transpose(q) == R::permute(q, {1, 0}));  // unresolved vs explicit

  // A "moved-from" recipe is a copy: never empty.
  R moved = qkv;
  R target = std::move(moved);
  CHECK(target == qkv);
  CHECK(moved.kind() == R::Kind::concat);  // NOLINT(bugprone-use-after-move): documented to stay valid
}

TEST_CASE("recipe – accessors and source keys", "[engine][recipe]") {
  const R s = R::source("q", Selection::rows({8, 16}, 0, 4));
  CHECK(s.kind() == R::Kind::source);
  CHECK(s.key() == "q");
  CHECK(s.selection() == Selection::rows({8, 16}, 0, 4));
  CHECK(s.inputs().empty());
  const R sl = R::slice(s, 1, {2, 3});
  CHECK(sl.dim() == 1);
  CHECK(sl.range() == Range{2, 3});
  CHECK(R::reshape(s, {64}).shape() == Shape{64});
  CHECK(R::cast(s, DType::F32).dtype() == DType::F32);
  CHECK_THROWS_AS(sl.key(), std::logic_error);
  CHECK_THROWS_AS(s.dim(), std::logic_error);
  CHECK_THROWS_AS(s.order(), std::logic_error);
  CHECK_THROWS_AS(sl.dtype(), std::logic_error);
  CHECK_THROWS_WITH(R::concat({s}, 0).shape(), Catch::Contains("shape() called on a concat node"));

  const R mixed = R::concat({src("q"), src("k"), R::cast(src("q"), DType::F32), R::transpose(src("v")), src("k")}, 0);
  CHECK(mixed.source_keys() == std::vector<std::string>{"q", "k", "v"});
  CHECK(s.source_keys() == std::vector<std::string>{"q"});
}

TEST_CASE("recipe – to_string spells the tree", "[engine][recipe]") {
  CHECK(R::concat({src("q"), src("k"), src("v")}, 0).to_string() ==
        "concat(dim=0, source('q'), source('k'), source('v'))");
  CHECK(R::source("q", Selection::rows({8, 16}, 0, 4)).to_string() == "source('q', [0:4, 0:16])");
  CHECK(R::cast(R::transpose(src("w")), DType::F32).to_string() == "cast(F32, transpose(source('w')))");
  CHECK(R::permute(src("w"), {2, 0, 1}).to_string() == "permute(order=[2, 0, 1], source('w'))");
  CHECK(R::reshape(R::slice(src("w"), 1, {2, 5}), {3, 4}).to_string() ==
        "reshape([3, 4], slice(dim=1, 2:5, source('w')))");
  CHECK(recipe_kind_name(R::Kind::reshape) == std::string("reshape"));
}
