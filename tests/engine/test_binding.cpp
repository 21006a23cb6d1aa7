// Weight bindings, binding plans (declaration checks, byte checks against the catalog),
// atomic recipe sets and their lowering into bindings.

#include "eredu/engine/description/atomic_recipe_set.hpp"
#include "eredu/engine/description/bindings_from_recipe_set.hpp"
#include "eredu/engine/description/weight_binding.hpp"
#include "eredu/engine/description/weight_binding_plan.hpp"

#include <catch2/catch.hpp>

#include <stdexcept>
#include <string>
#include <vector>

#include "eredu/core/error.hpp"
#include "eredu/engine/orchestration/engine_error.hpp"

using namespace eredu;
using namespace eredu::engine;
using R = DerivedWeightRecipe;

namespace {

// A catalog built by hand: nothing is ever read in these tests.
io::Catalog make_catalog() {
  io::Catalog c;
  const auto f0 = c.add_file({.path = "/ckpt/model-00001-of-00002.safetensors", .format = "safetensors"});
  const auto f1 = c.add_file({.path = "/ckpt/model-00002-of-00002.safetensors", .format = "safetensors"});
  std::uint64_t offset = 64;
  auto add = [&](std::uint32_t file, const char* name, DType dtype, Shape shape) {
    const std::uint64_t bytes = *checked_byte_size(*checked_element_count(shape), dtype);
    c.add_tensor(
        {.name = name, .dtype = dtype, .shape = std::move(shape), .file = file, .offset = offset, .nbytes = bytes});
    offset += bytes;
  };
  add(f0, "embed", DType::BF16, {100, 8});   // 1600 bytes
  add(f0, "q", DType::BF16, {8, 8});         // 128
  add(f0, "k", DType::BF16, {4, 8});         // 64
  add(f0, "v", DType::BF16, {4, 8});         // 64
  add(f1, "gate", DType::F8_E4M3, {16, 8});  // 128
  add(f1, "up", DType::F8_E4M3, {16, 8});    // 128
  add(f1, "norm", DType::F32, {8});          // 32
  return c;
}

const io::Catalog& binding_catalog() {
  static const io::Catalog c = make_catalog();
  return c;
}

template <class E>
void require_throws(auto&& f, errc kind, std::initializer_list<std::string> fragments) {
  try {
    f();
    FAIL("nothing thrown");
  } catch (const E& e) {
    INFO("message: " << e.what());
    CHECK(std::string(errc_name(e.kind())) == errc_name(kind));
    for (const auto& s : fragments) CHECK_THAT(e.what(), Catch::Contains(s));
  }
}

R qkv() { return R::concat({R::source("q"), R::source("k"), R::source("v")}, 0); }

}  // namespace

TEST_CASE("weight binding – the three kinds and their accessors", "[engine][binding]") {
  const auto plain = WeightBinding::tensor("model.embed.weight", "embed", Selection::rows({100, 8}, 0, 50), 800);
  CHECK(plain.name() == "model.embed.weight");
  CHECK(plain.id() == ParameterId("model.embed.weight"));
  CHECK_FALSE(plain.is_alias());
  CHECK(plain.recipe() == nullptr);
  CHECK(plain.checkpoint_key() == "embed");
  CHECK(plain.selection() == Selection::rows({100, 8}, 0, 50));
  CHECK(plain.expected_bytes() == 800);
  CHECK(plain.source_recipe() == R::source("embed", Selection::rows({100, 8}, 0, 50)));
  CHECK_THROWS_AS(plain.owner(), std::logic_error);

  const auto fused = WeightBinding::from_recipe("layers.0.attn.qkv.weight", qkv(), 256);
  REQUIRE(fused.recipe() != nullptr);
  CHECK(*fused.recipe() == qkv());
  CHECK(fused.source_recipe() == qkv());
  CHECK_FALSE(fused.is_alias());
  CHECK_THROWS_AS(fused.checkpoint_key(), std::logic_error);
  CHECK_THROWS_AS(fused.selection(), std::logic_error);

  const auto tied = WeightBinding::alias("lm_head.weight", "model.embed.weight", 1600);
  CHECK(tied.is_alias());
  CHECK(tied.owner() == "model.embed.weight");
  CHECK(tied.owner_id() == ParameterId("model.embed.weight"));
  CHECK(tied.recipe() == nullptr);
  CHECK(tied.expected_bytes() == 1600);
  CHECK_THROWS_WITH(tied.source_recipe(), Catch::Contains("alias 'lm_head.weight' of 'model.embed.weight'"));
  CHECK_THROWS_AS(tied.checkpoint_key(), std::logic_error);
}

TEST_CASE("weight binding – names and owners must be parameter ids", "[engine][binding]") {
  require_throws<DeclarationError>([] { (void)WeightBinding::tensor("bad..name", "q", {}, 1); },
                                   errc::invalid_parameter_id, {"parameter 'bad..name'", "empty segment"});
  require_throws<DeclarationError>([] { (void)WeightBinding::from_recipe("", R::source("q"), 1); },
                                   errc::invalid_parameter_id, {"empty"});
  require_throws<DeclarationError>([] { (void)WeightBinding::alias("lm_head.weight", "embed weight", 1); },
                                   errc::invalid_parameter_id, {"parameter 'embed weight'", "' ' at byte 5"});
  require_throws<DeclarationError>([] { (void)WeightBinding::alias(".x", "embed", 1); }, errc::invalid_parameter_id,
                                   {"starts with '.'"});
  // Checkpoint keys are the file's business, not identities.
  CHECK_NOTHROW(WeightBinding::tensor("w", "model/layers 0:weight", {}, 1));
}

TEST_CASE("binding plan – owners and aliases in the order given", "[engine][binding]") {
  const WeightBindingPlan plan({
      WeightBinding::tensor("embed.weight", "embed", {}, 1600),
      WeightBinding::alias("lm_head.weight", "embed.weight", 1600),
      WeightBinding::from_recipe("attn.qkv.weight", qkv(), 256),
      WeightBinding::alias("tied.qkv", "attn.qkv.weight", 256),
      WeightBinding::tensor("norm.weight", "norm", {}, 32),
  });
  CHECK(plan.bindings().size() == 5);
  const auto owners = plan.owners();
  REQUIRE(owners.size() == 3);
  CHECK(owners[0]->name() == "embed.weight");
  CHECK(owners[1]->name() == "attn.qkv.weight");
  CHECK(owners[2]->name() == "norm.weight");
  CHECK(owners[0] == &plan.bindings()[0]);
  const auto aliases = plan.aliases();
  REQUIRE(aliases.size() == 2);
  CHECK(aliases[0].first->name() == "lm_head.weight");
  CHECK(aliases[0].second == &plan.bindings()[0]);
  CHECK(aliases[1].first->name() == "tied.qkv");
  CHECK(aliases[1].second->name() == "attn.qkv.weight");

  const auto inferred = plan.check(binding_catalog());
  REQUIRE(inferred.size() == 3);
  CHECK(inferred[0] == InferredWeight{DType::BF16, {100, 8}, 1600});
  CHECK(inferred[1] == InferredWeight{DType::BF16, {16, 8}, 256});
  CHECK(inferred[2] == InferredWeight{DType::F32, {8}, 32});
  CHECK(plan.owner_bytes(binding_catalog()) == 1888);  // aliases cost nothing

  // The pointers stay valid when the plan moves: it owns its bindings.
  WeightBindingPlan moved = WeightBindingPlan(plan);
  CHECK(moved.owners()[1]->recipe() != nullptr);
  CHECK(std::move(moved).into_bindings().size() == 5);
}

TEST_CASE("binding plan – invalid declarations are DeclarationErrors of their kind", "[engine][binding]") {
  using B = WeightBinding;
  require_throws<DeclarationError>(
      [] {
        WeightBindingPlan({B::tensor("w", "q", {}, 128), B::tensor("x", "k", {}, 64), B::tensor("w", "v", {}, 64)});
      },
      errc::duplicate_binding, {"parameter 'w'", "bound twice (bindings 0 and 2 of 3)"});
  require_throws<DeclarationError>(
      [] {
        WeightBindingPlan({B::tensor("w", "q", {}, 128), B::alias("w", "w", 128)});
      },
      errc::duplicate_binding, {"parameter 'w'"});
  require_throws<DeclarationError>(
      [] {
        WeightBindingPlan({B::tensor("embed.weight", "embed", {}, 1600), B::alias("lm_head.weight", "embed", 1600)});
      },
      errc::alias_unknown_owner, {"parameter 'lm_head.weight'", "alias of 'embed'", "no binding"});
  require_throws<DeclarationError>(
      [] {
        WeightBindingPlan({B::tensor("a", "q", {}, 128), B::alias("b", "a", 128), B::alias("c", "b", 128)});
      },
      errc::alias_chain, {"parameter 'c'", "alias of 'b', which is itself an alias (of 'a')"});
  require_throws<DeclarationError>([] { WeightBindingPlan({B::alias("self", "self", 1)}); }, errc::alias_chain,
                                   {"parameter 'self'", "alias of itself"});
  require_throws<DeclarationError>(
      [] {
        WeightBindingPlan(
            {B::tensor("embed.weight", "embed", {}, 1600), B::alias("lm_head.weight", "embed.weight", 1601)});
      },
      errc::byte_mismatch,
      {"parameter 'lm_head.weight'", "declares 1601 bytes but its owner 'embed.weight' declares 1600"});
  CHECK_NOTHROW(WeightBindingPlan({}));
}

TEST_CASE("binding plan – check compares declared bytes with inference before any read", "[engine][binding]") {
  const WeightBindingPlan wrong({
      WeightBinding::tensor("embed.weight", "embed", {}, 1600),
      WeightBinding::from_recipe("layers.0.qkv", qkv(), 255),
  });
  require_throws<OrchestrationError>([&] { (void)wrong.check(binding_catalog()); }, errc::byte_mismatch,
                                     {"parameter 'layers.0.qkv': declares 255 bytes but its recipe produces 256",
                                      "BF16 [16, 8]", "concat(dim=0, source('q')"});
  try {
    (void)wrong.check(binding_catalog());
  } catch (const OrchestrationError& e) {
    CHECK(e.context().parameter == "layers.0.qkv");
    CHECK(e.family() == error_family::declaration);  // byte_mismatch is a declaration kind
  }
  // A plain binding also names its tensor and file.
  const WeightBindingPlan plain({WeightBinding::tensor("norm.weight", "norm", {}, 64)});
  require_throws<OrchestrationError>([&] { (void)plain.check(binding_catalog()); }, errc::byte_mismatch,
                                     {"/ckpt/model-00002-of-00002.safetensors: parameter 'norm.weight': tensor 'norm'",
                                      "declares 64 bytes but its recipe produces 32"});
  require_throws<OrchestrationError>([&] { (void)plain.owner_bytes(binding_catalog()); }, errc::byte_mismatch,
                                     {"64", "32"});
}

TEST_CASE("binding plan – recipe errors from check name the parameter", "[engine][binding]") {
  const WeightBindingPlan plan({
      WeightBinding::tensor("ok", "q", {}, 128),
      WeightBinding::from_recipe("mlp.gate_up", R::concat({R::source("gate"), R::source("upp")}, 0), 256),
  });
  require_throws<RecipeError>([&] { (void)plan.check(binding_catalog()); }, errc::recipe_unknown_key,
                              {"parameter 'mlp.gate_up'", "tensor 'upp'", "recipe concat[1] > source 'upp'"});
  try {
    (void)plan.check(binding_catalog());
  } catch (const RecipeError& e) {
    CHECK(e.context().parameter == "mlp.gate_up");
  }
  const WeightBindingPlan shard({WeightBinding::tensor("s", "q", Selection::rows({8, 8}, 4, 12), 64)});
  require_throws<RecipeError>([&] { (void)shard.check(binding_catalog()); }, errc::recipe_invalid_selection,
                              {"/ckpt/model-00001-of-00002.safetensors: parameter 's': tensor 'q'", "4:12"});
}

TEST_CASE("atomic recipe set – names are unique ids, and into_parts consumes the set", "[engine][binding]") {
  AtomicRecipeSet set;
  CHECK(set.empty());
  set.add_output("attn.qkv", qkv());
  set.add_output("mlp.gate_up", R::concat({R::source("gate"), R::source("up")}, 0));
  set.add_alias("attn.qkv_tied", "attn.qkv");
  CHECK(set.size() == 3);
  require_throws<DeclarationError>([&] { set.add_output("attn.qkv", R::source("q")); }, errc::duplicate_binding,
                                   {"parameter 'attn.qkv'"});
  require_throws<DeclarationError>([&] { set.add_alias("mlp.gate_up", "attn.qkv"); }, errc::duplicate_binding,
                                   {"parameter 'mlp.gate_up'"});
  require_throws<DeclarationError>([&] { set.add_alias("attn.qkv_tied", "mlp.gate_up"); }, errc::duplicate_binding,
                                   {"parameter 'attn.qkv_tied'"});
  require_throws<DeclarationError>([&] { set.add_output("a..b", R::source("q")); }, errc::invalid_parameter_id,
                                   {"a..b"});
  require_throws<DeclarationError>([&] { set.add_alias("fine", "not fine"); }, errc::invalid_parameter_id,
                                   {"not fine"});
  CHECK(set.size() == 3);  // failed additions change nothing

  const R qkv_recipe = qkv();
  auto parts = std::move(set).into_parts();
  CHECK(set.size() == 0);  // NOLINT(bugprone-use-after-move): consumption is the behaviour under test
  CHECK(set.empty());
  REQUIRE(parts.outputs.size() == 2);
  CHECK(parts.outputs[0].first == "attn.qkv");
  CHECK(parts.outputs[0].second == qkv_recipe);
  CHECK(parts.outputs[1].first == "mlp.gate_up");
  REQUIRE(parts.aliases.size() == 1);
  CHECK(parts.aliases[0] == std::pair<std::string, std::string>{"attn.qkv_tied", "attn.qkv"});
  // The consumed set is reusable: its names are free again.
  set.add_output("attn.qkv", R::source("q"));
  CHECK(set.size() == 1);
}

TEST_CASE("bindings from recipe set – owners first, then aliases with their owner's bytes", "[engine][binding]") {
  AtomicRecipeSet set;
  const R gate_up = R::cast(R::concat({R::source("gate"), R::source("up")}, 0), DType::BF16);
  set.add_alias("lm_head.weight", "embed.weight");  // aliases may precede their owner
  set.add_output("attn.qkv.weight", qkv());
  set.add_output("mlp.gate_up.weight", gate_up);
  set.add_output("embed.weight", R::source("embed"));
  set.add_alias("tied.gate_up", "mlp.gate_up.weight");

  const auto bindings = bindings_from_recipe_set(binding_catalog(), std::move(set));
  REQUIRE(bindings.size() == 5);
  CHECK(bindings[0].name() == "attn.qkv.weight");
  CHECK(bindings[0].expected_bytes() == 256);
  REQUIRE(bindings[0].recipe() != nullptr);
  CHECK(*bindings[0].recipe() == qkv());
  CHECK(bindings[1].name() == "mlp.gate_up.weight");
  CHECK(bindings[1].expected_bytes() == 512);               // 32x8 f8 widened to bf16
  CHECK(bindings[1].recipe()->shares_nodes_with(gate_up));  // moved through, never cloned
  CHECK(bindings[2].name() == "embed.weight");
  CHECK(bindings[2].expected_bytes() == 1600);
  CHECK(bindings[3].is_alias());
  CHECK(bindings[3].name() == "lm_head.weight");
  CHECK(bindings[3].owner() == "embed.weight");
  CHECK(bindings[3].expected_bytes() == 1600);
  CHECK(bindings[4].name() == "tied.gate_up");
  CHECK(bindings[4].expected_bytes() == 512);

  // They form a plan that passes its byte check.
  const WeightBindingPlan plan(bindings);
  CHECK(plan.check(binding_catalog()).size() == 3);
  CHECK(plan.owner_bytes(binding_catalog()) == 256 + 512 + 1600);
}

TEST_CASE("bindings from recipe set – failures are typed and named", "[engine][binding]") {
  {
    AtomicRecipeSet set;
    set.add_output("w", R::source("q"));
    set.add_alias("t", "missing");
    require_throws<DeclarationError>([&] { (void)bindings_from_recipe_set(binding_catalog(), std::move(set)); },
                                     errc::alias_unknown_owner, {"parameter 't'", "alias of 'missing'"});
  }
  {
    AtomicRecipeSet set;
    set.add_output("w", R::source("q"));
    set.add_alias("a", "w");
    set.add_alias("b", "a");
    require_throws<DeclarationError>([&] { (void)bindings_from_recipe_set(binding_catalog(), std::move(set)); },
                                     errc::alias_chain, {"parameter 'b'", "alias of 'a'"});
  }
  {
    AtomicRecipeSet set;
    set.add_output("w", R::source("q"));
    set.add_output("bad", R::cast(R::source("gate"), DType::F16));
    require_throws<RecipeError>(
        [&] { (void)bindings_from_recipe_set(binding_catalog(), std::move(set)); }, errc::recipe_unsupported_cast,
        {"/ckpt/model-00002-of-00002.safetensors: parameter 'bad': tensor 'gate'", "cast from F8_E4M3 to F16"});
  }
  CHECK(bindings_from_recipe_set(binding_catalog(), AtomicRecipeSet{}).empty());
}
