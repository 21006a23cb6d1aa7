// The recipe evaluator: a tiny RecipeOps that records the primitives it is asked for proves
// the folding decisions once for every backend — what is read straight into the output,
// what goes through a temporary, in which order, and what is refused before any read.

#include "eredu/engine/description/recipe_evaluator.hpp"

#include <catch2/catch.hpp>

#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>
#include <asio/use_future.hpp>
#include <cstddef>
#include <filesystem>
#include <future>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "eredu/core/error.hpp"
#include "eredu/io/formats/open_catalog.hpp"
#include "eredu/synth/safetensors_writer.hpp"
#include "support/temp_dir.hpp"

using namespace eredu;
using namespace eredu::engine;
using R = DerivedWeightRecipe;

namespace {

// A small checkpoint, written once for the whole run.
class EvaluatorCheckpoint {
 public:
  EvaluatorCheckpoint() {
    const std::vector<synth::TensorSpec> specs{
        {"q", DType::BF16, {8, 16}},   {"k", DType::BF16, {4, 16}},      {"v", DType::BF16, {4, 16}},
        {"gate", DType::BF16, {4, 8}}, {"up", DType::BF16, {4, 8}},      {"w3", DType::F32, {2, 3, 4}},
        {"h", DType::F16, {4, 16}},    {"r4", DType::F32, {2, 1, 2, 2}},
    };
    std::vector<std::vector<std::byte>> data;
    std::vector<std::span<const std::byte>> views;
    for (const auto& s : specs) data.emplace_back(synth::tensor_nbytes(s), std::byte{0x3c});
    for (const auto& d : data) views.emplace_back(d);
    synth::write_safetensors(dir_ / "model.safetensors", specs, views);
    catalog_ = io::open_catalog(dir_ / "model.safetensors");
  }
  const io::Catalog& catalog() const noexcept { return catalog_; }

 private:
  test::TempDir dir_;
  io::Catalog catalog_;
};

const io::Catalog& catalog() {
  static const EvaluatorCheckpoint checkpoint;
  return checkpoint.catalog();
}

// Backend primitives that write nothing and log every call, with the regions they write.
// Refuses F16 -> BF16 and permutes up to rank 3, to show where the walk asks.
struct RecordingOps {
  // Bytes [offset, offset + bytes) of buffer `buffer`: 0 is the output, k the k-th temporary.
  struct Region {
    int buffer = 0;
    std::size_t offset = 0;
    std::size_t bytes = 0;
  };
  // A temporary: its number and size (no strings: g++ 12 and co_await temporaries).
  struct Temporary {
    int id = 0;
    std::size_t bytes = 0;
  };
  // Logs each part and the end of a concat the walk could not place in its output.
  struct ConcatJoin {
    RecordingOps* ops;
    asio::awaitable<void> add(Temporary part, const InferredWeight&) {
      ops->calls.push_back(fmt::format("concat.add tmp{}", part.id));
      co_return;
    }
    asio::awaitable<void> finish() {
      ops->calls.push_back("concat.finish");
      co_return;
    }
  };

  static constexpr std::string_view name = "recording";
  static constexpr std::size_t max_permute_rank = 3;

  std::vector<std::string> calls;
  bool stop = false;
  std::string fail_reading;  // read_into of this key throws
  bool stop_after_first_read = false;
  int temporaries = 0;

  const io::Catalog& catalog() const { return ::catalog(); }
  bool stop_requested() const { return stop; }
  static bool supports_cast(DType from, DType to) {
    return is_supported_cast(from, to) && !(from == DType::F16 && to == DType::BF16);
  }
  static Region subregion(Region r, std::size_t offset, std::size_t bytes) {
    return {r.buffer, r.offset + offset, bytes};
  }
  static Region region(const Temporary& t) { return {t.id, 0, t.bytes}; }

  static std::string str(Region r) {
    return fmt::format("{}[{}:{}]", r.buffer == 0 ? std::string("out") : fmt::format("tmp{}", r.buffer), r.offset,
                       r.offset + r.bytes);
  }
  static std::string str(const io::TensorReadRequest& r) {
    return r.selection.is_all() ? r.key : fmt::format("{} {}", r.key, r.selection.to_string());
  }

  Temporary temporary(const InferredWeight& w, const std::string&) {
    Temporary t{++temporaries, w.bytes};
    calls.push_back(fmt::format("temporary tmp{} {} {}", t.id, dtype_name(w.dtype), format_shape(w.shape)));
    return t;
  }
  asio::awaitable<void> read_into(const io::TensorReadRequest& request, Region out) {
    if (request.key == fail_reading) throw Error(errc::io_error, {.tensor = request.key}, "injected");
    calls.push_back(fmt::format("read_into {} -> {}", str(request), str(out)));
    if (stop_after_first_read) stop = true;
    co_return;
  }
  asio::awaitable<void> cast_source(const io::TensorReadRequest& request, const InferredWeight& in, DType to,
                                    Region out, const std::string&) {
    calls.push_back(
        fmt::format("cast_source {} {}->{} -> {}", str(request), dtype_name(in.dtype), dtype_name(to), str(out)));
    co_return;
  }
  asio::awaitable<void> convert(Temporary in, const InferredWeight& w, DType to, Region out, const std::string&) {
    calls.push_back(fmt::format("convert tmp{} {}->{} -> {}", in.id, dtype_name(w.dtype), dtype_name(to), str(out)));
    co_return;
  }
  asio::awaitable<void> copy_slice(Temporary in, const InferredWeight&, std::size_t dim, Range range, Region out,
                                   const std::string&) {
    calls.push_back(fmt::format("copy_slice tmp{} dim={} {}:{} -> {}", in.id, dim, range.start, range.stop, str(out)));
    co_return;
  }
  asio::awaitable<void> permute(Temporary in, const InferredWeight&, std::span<const std::size_t> order, Region out,
                                const std::string&) {
    calls.push_back(fmt::format("permute tmp{} order=[{}] -> {}", in.id, fmt::join(order, ", "), str(out)));
    co_return;
  }
  ConcatJoin begin_concat(const InferredWeight& whole, std::size_t dim, Region out, const std::string&) {
    calls.push_back(fmt::format("begin_concat dim={} {} -> {}", dim, format_shape(whole.shape), str(out)));
    return ConcatJoin{this};
  }
};

static_assert(RecipeOps<RecordingOps>);

// Evaluates `r` into an output of its inferred size with `ops`; rethrows the walk's error.
void evaluate(RecordingOps& ops, const R& r) {
  asio::io_context context;
  const RecordingOps::Region out{0, 0, r.infer(catalog()).bytes};
  std::future<void> done = asio::co_spawn(context, evaluate_recipe(ops, r, out), asio::use_future);
  context.run();
  done.get();
}

// The calls evaluating `r` makes.
std::vector<std::string> calls_of(const R& r) {
  RecordingOps ops;
  evaluate(ops, r);
  return ops.calls;
}

using Calls = std::vector<std::string>;

R input(const char* key) { return R::source(key); }

}  // namespace

TEST_CASE("recipe evaluator – a type of recording primitives is a RecipeOps", "[engine][evaluator]") {
  STATIC_REQUIRE(RecipeOps<RecordingOps>);
  STATIC_REQUIRE_FALSE(RecipeOps<int>);
}

TEST_CASE("recipe evaluator – a source is read straight into the output, whole or selected", "[engine][evaluator]") {
  CHECK(calls_of(input("q")) == Calls{"read_into q -> out[0:256]"});
  CHECK(calls_of(R::source("q", Selection::rows({8, 16}, 2, 6))) == Calls{"read_into q [2:6, 0:16] -> out[0:128]"});
}

TEST_CASE("recipe evaluator – reshapes and casts to the input's dtype pass straight through", "[engine][evaluator]") {
  CHECK(calls_of(R::reshape(input("q"), {128})) == Calls{"read_into q -> out[0:256]"});
  CHECK(calls_of(R::cast(R::reshape(R::cast(input("q"), DType::BF16), {4, 32}), DType::BF16)) ==
        Calls{"read_into q -> out[0:256]"});
}

TEST_CASE("recipe evaluator – a slice of a source folds into the read's selection", "[engine][evaluator]") {
  CHECK(calls_of(R::slice(input("q"), 0, {2, 6})) == Calls{"read_into q [2:6, 0:16] -> out[0:128]"});
  CHECK(calls_of(R::slice(input("w3"), 2, {1, 3})) == Calls{"read_into w3 [0:2, 0:3, 1:3] -> out[0:48]"});
  // Of a selected source, relative to its selection.
  CHECK(calls_of(R::slice(R::source("q", Selection{{{2, 8}, {0, 16}}}), 1, {4, 12})) ==
        Calls{"read_into q [2:8, 4:12] -> out[0:96]"});
}

TEST_CASE("recipe evaluator – a concat along the outer dimension evaluates each input in its place",
          "[engine][evaluator]") {
  CHECK(calls_of(R::concat({input("q"), input("k"), input("v")}, 0)) ==
        Calls{"read_into q -> out[0:256]", "read_into k -> out[256:384]", "read_into v -> out[384:512]"});
  // A fused QKV cast to f32: each cast of a source is the backend's cast_source, in place.
  CHECK(calls_of(R::concat({R::cast(input("q"), DType::F32), R::cast(input("k"), DType::F32)}, 0)) ==
        Calls{"cast_source q BF16->F32 -> out[0:512]", "cast_source k BF16->F32 -> out[512:768]"});
  // Below dimensions of size 1 the inputs are still contiguous blocks.
  CHECK(calls_of(R::concat({R::reshape(input("q"), {1, 8, 16}), R::reshape(input("k"), {1, 4, 16})}, 1)) ==
        Calls{"read_into q -> out[0:256]", "read_into k -> out[256:384]"});
  // Nested: a slice folded into the read of its block.
  CHECK(calls_of(R::concat({R::slice(input("q"), 0, {0, 4}), input("k")}, 0)) ==
        Calls{"read_into q [0:4, 0:16] -> out[0:128]", "read_into k -> out[128:256]"});
}

TEST_CASE("recipe evaluator – any other concat joins its inputs' temporaries in order", "[engine][evaluator]") {
  CHECK(calls_of(R::concat({input("gate"), input("up")}, 1)) == Calls{
                                                                    "begin_concat dim=1 [4, 16] -> out[0:128]",
                                                                    "temporary tmp1 BF16 [4, 8]",
                                                                    "read_into gate -> tmp1[0:64]",
                                                                    "concat.add tmp1",
                                                                    "temporary tmp2 BF16 [4, 8]",
                                                                    "read_into up -> tmp2[0:64]",
                                                                    "concat.add tmp2",
                                                                    "concat.finish",
                                                                });
}

TEST_CASE("recipe evaluator – a cast of a source is one cast_source, of anything else, a temporary and convert",
          "[engine][evaluator]") {
  CHECK(calls_of(R::cast(input("q"), DType::F32)) == Calls{"cast_source q BF16->F32 -> out[0:512]"});
  CHECK(calls_of(R::cast(R::source("q", Selection::rows({8, 16}, 0, 2)), DType::F16)) ==
        Calls{"cast_source q [0:2, 0:16] BF16->F16 -> out[0:64]"});
  CHECK(calls_of(R::cast(R::concat({input("q"), input("k")}, 0), DType::F32)) ==
        Calls{
            "temporary tmp1 BF16 [12, 16]",
            "read_into q -> tmp1[0:256]",
            "read_into k -> tmp1[256:384]",
            "convert tmp1 BF16->F32 -> out[0:768]",
        });
}

TEST_CASE("recipe evaluator – slices of anything but a source, and permutations, go through a temporary",
          "[engine][evaluator]") {
  CHECK(calls_of(R::slice(R::cast(input("q"), DType::F32), 1, {0, 8})) == Calls{
                                                                              "temporary tmp1 F32 [8, 16]",
                                                                              "cast_source q BF16->F32 -> tmp1[0:512]",
                                                                              "copy_slice tmp1 dim=1 0:8 -> out[0:256]",
                                                                          });
  CHECK(calls_of(R::transpose(input("q"))) == Calls{
                                                  "temporary tmp1 BF16 [8, 16]",
                                                  "read_into q -> tmp1[0:256]",
                                                  "permute tmp1 order=[1, 0] -> out[0:256]",
                                              });
  // A transpose of a rank known only from the catalog is resolved for that rank.
  CHECK(calls_of(R::transpose(input("w3"))) == Calls{
                                                   "temporary tmp1 F32 [2, 3, 4]",
                                                   "read_into w3 -> tmp1[0:96]",
                                                   "permute tmp1 order=[0, 2, 1] -> out[0:96]",
                                               });
}

TEST_CASE("recipe evaluator – what the backend cannot do fails before anything is read", "[engine][evaluator]") {
  RecordingOps ops;
  SECTION("a cast its supports_cast refuses") {
    try {
      evaluate(ops, R::cast(input("h"), DType::BF16));
      FAIL("no exception");
    } catch (const BackendError& e) {
      CHECK(e.kind() == errc::recipe_unsupported_cast);
      CHECK_THAT(e.what(), Catch::Contains("the recording backend cannot convert F16 to BF16"));
      CHECK_THAT(e.what(), Catch::Contains("cast(BF16, source('h'))"));
    }
  }
  SECTION("a permutation above its rank") {
    try {
      evaluate(ops, R::permute(input("r4"), {3, 2, 1, 0}));
      FAIL("no exception");
    } catch (const BackendError& e) {
      CHECK(e.kind() == errc::backend_failure);
      CHECK_THAT(e.what(), Catch::Contains("the recording backend permutes up to rank 3, not rank 4"));
    }
  }
  CHECK(ops.calls.empty());
}

TEST_CASE("recipe evaluator – a stop request ends the walk at the next node, as cancelled", "[engine][evaluator]") {
  const R qkv = R::concat({input("q"), input("k"), input("v")}, 0);
  RecordingOps ops;
  SECTION("before the first node") {
    ops.stop = true;
    CHECK_THROWS_MATCHES(evaluate(ops, qkv), Error,
                         Catch::Predicate<Error>([](const Error& e) { return e.kind() == errc::cancelled; }));
    CHECK(ops.calls.empty());
  }
  SECTION("between two inputs") {
    ops.stop_after_first_read = true;
    try {
      evaluate(ops, qkv);
      FAIL("no exception");
    } catch (const Error& e) {
      CHECK(e.kind() == errc::cancelled);
      CHECK_THAT(e.what(), Catch::Contains("source('k')"));
    }
    CHECK(ops.calls == Calls{"read_into q -> out[0:256]"});
  }
}

TEST_CASE("recipe evaluator – a primitive's failure ends the walk with that error", "[engine][evaluator]") {
  RecordingOps ops;
  ops.fail_reading = "k";
  CHECK_THROWS_MATCHES(evaluate(ops, R::concat({input("q"), input("k"), input("v")}, 0)), Error,
                       Catch::Predicate<Error>([](const Error& e) { return e.kind() == errc::io_error; }));
  CHECK(ops.calls == Calls{"read_into q -> out[0:256]"});
}
