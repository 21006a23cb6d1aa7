// The engine's materialize/bind orchestration on the CPU backend: a successful atomic load,
// and every failure leaving the module exactly as it was, with every lease returned.

#include <asio/bind_cancellation_slot.hpp>
#include <asio/cancellation_signal.hpp>
#include <asio/use_future.hpp>
#include <catch2/catch.hpp>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <functional>
#include <mutex>

#include "cpu/cpu_fixture.hpp"
#include "eredu/core/error.hpp"
#include "eredu/core/log.hpp"
#include "eredu/cpu/convert.hpp"
#include "eredu/engine/backend/parameter_backend.hpp"
#include "eredu/engine/backend/transfer_backend.hpp"
#include "eredu/engine/backend/verifying_backend.hpp"
#include "eredu/engine/description/bindings_from_recipe_set.hpp"
#include "eredu/engine/orchestration/engine_error.hpp"
#include "eredu/engine/orchestration/load.hpp"
#include "eredu/io/integrity/digest.hpp"
#include "eredu/io/integrity/sha256.hpp"

using namespace eredu;
using namespace eredu::test;
using engine::DeclarationError;
using engine::DerivedWeightRecipe;
using engine::OrchestrationError;
using engine::RecipeError;
using engine::WeightBinding;
using engine::WeightBindingPlan;
using R = DerivedWeightRecipe;

static_assert(engine::ParameterBackend<cpu::Backend>);
static_assert(engine::SubmissionBackend<cpu::Backend>);
static_assert(engine::TransferBackend<cpu::Backend>);
static_assert(engine::VerifyingBackend<cpu::Backend>);

namespace {

std::vector<synth::TensorSpec> specs() {
  return {
      {"odd", DType::U8, {7}},     {"embed", DType::BF16, {8, 16}},  {"q", DType::BF16, {8, 16}},
      {"k", DType::BF16, {8, 16}}, {"v", DType::BF16, {8, 16}},      {"gate", DType::F32, {4, 6}},
      {"up", DType::F32, {4, 10}}, {"big", DType::BF16, {300, 257}}, {"norm", DType::F16, {3, 5, 7}},
  };
}

/// Calls `fn(local_name, slot)` for each slot of a block: one traversal for both visitors.
template <class Self, class Fn>
void for_each_block_slot(Self& self, Fn&& fn) {
  fn("attn.qkv.weight", self.qkv);
  fn("mlp.gate_up.weight", self.gate_up);
  fn("mlp.big.weight", self.big);
  fn("norm.weight", self.norm);
}

struct Block {
  cpu::Parameter qkv{DType::BF16, {24, 16}};
  cpu::Parameter gate_up{DType::F32, {4, 16}};
  cpu::Parameter big{DType::F32, {300, 257}};
  cpu::Parameter norm{DType::F16, {3, 5, 7}};

  void visit_parameters(engine::ParameterVisitor<cpu::Parameter>& v, const std::string& prefix) const {
    for_each_block_slot(*this, [&](const char* name, const cpu::Parameter& p) {
      v.visit({engine::ParameterId(engine::join_name(prefix, name)), p.dtype, p.shape}, p);
    });
  }
  void visit_parameters_mut(engine::ParameterVisitorMut<cpu::Parameter>& v, const std::string& prefix) {
    for_each_block_slot(*this, [&](const char* name, cpu::Parameter& p) {
      v.visit_mut({engine::ParameterId(engine::join_name(prefix, name)), p.dtype, p.shape}, p);
    });
  }
};

struct Model {
  cpu::Parameter embed{DType::BF16, {8, 16}};
  Block layer;
  cpu::Parameter lm_head{DType::BF16, {8, 16}};  // tied to embed

  static void visit_one(engine::ParameterVisitor<cpu::Parameter>& v, const engine::ParameterMetadata& m,
                        const cpu::Parameter& p) {
    v.visit(m, p);
  }
  static void visit_one(engine::ParameterVisitorMut<cpu::Parameter>& v, const engine::ParameterMetadata& m,
                        cpu::Parameter& p) {
    v.visit_mut(m, p);
  }
  template <class V, class Self>
  static void visit(Self& self, V& v, const std::string& prefix) {
    auto one = [&](const char* name, auto& p) {
      visit_one(v, {engine::ParameterId(engine::join_name(prefix, name)), p.dtype, p.shape}, p);
    };
    one("embed.weight", self.embed);
    if constexpr (std::is_const_v<Self>)
      self.layer.visit_parameters(v, engine::join_name(prefix, "layers.0"));
    else
      self.layer.visit_parameters_mut(v, engine::join_name(prefix, "layers.0"));
    one("lm_head.weight", self.lm_head);
  }
  void visit_parameters(engine::ParameterVisitor<cpu::Parameter>& v, const std::string& prefix) const {
    visit(*this, v, prefix);
  }
  void visit_parameters_mut(engine::ParameterVisitorMut<cpu::Parameter>& v, const std::string& prefix) {
    visit(*this, v, prefix);
  }
};
static_assert(engine::Parameterized<Model, cpu::Parameter>);

/// Everything observable about a module: per slot, its storage identity and bytes.
struct Snapshot {
  std::vector<std::pair<const void*, std::vector<std::byte>>> slots;
  friend bool operator==(const Snapshot&, const Snapshot&) = default;
};

Snapshot snapshot(const Model& m) {
  Snapshot s;
  auto add = [&](const cpu::Parameter& p) {
    s.slots.emplace_back(p.value.storage().get(), to_vector(p.value.bytes()));
  };
  add(m.embed);
  for_each_block_slot(m.layer, [&](const char*, const cpu::Parameter& p) { add(p); });
  add(m.lm_head);
  return s;
}

std::uint64_t bytes_of(DType t, const Shape& s) { return *checked_byte_size(*checked_element_count(s), t); }

/// The plan that loads Model from the checkpoint: plain, fused, concatenated, cast, tied.
std::vector<WeightBinding> good_bindings() {
  return {
      WeightBinding::tensor("embed.weight", "embed", Selection::all(), 256),
      WeightBinding::from_recipe("layers.0.attn.qkv.weight",
                                 R::concat({R::source("q"), R::source("k"), R::source("v")}, 0), 768),
      WeightBinding::from_recipe("layers.0.mlp.gate_up.weight", R::concat({R::source("gate"), R::source("up")}, 1),
                                 256),
      WeightBinding::from_recipe("layers.0.mlp.big.weight", R::cast(R::source("big"), DType::F32),
                                 bytes_of(DType::F32, {300, 257})),
      WeightBinding::tensor("layers.0.norm.weight", "norm", Selection::all(), 210),
      WeightBinding::alias("lm_head.weight", "embed.weight", 256),
  };
}

/// Fails every read that touches [offset, offset + length) of file 0 with EIO; when
/// `on_map` is set, lets resident tensors be mapped and calls it as each mapping is handed out.
struct FailRange final : io::FaultInjector {
  std::uint64_t begin = 0, end = 0;
  std::function<void()> on_map_hook;
  int mapped = 0;
  io::ReadFault on_complete(std::uint32_t, std::uint64_t offset, std::uint64_t length) override {
    if (offset < end && offset + length > begin) return {.error = EIO};
    return {};
  }
  bool allow_mapping() const override { return static_cast<bool>(on_map_hook); }
  void on_map(std::uint32_t, std::uint64_t, std::uint64_t) override {
    ++mapped;
    on_map_hook();
  }
};

struct Env {
  CpuCheckpoint ckpt{specs()};
  asio::io_context ctx;
  FailRange faults;
  std::unique_ptr<io::CheckpointSource> source;
  cpu::Executor executor{2};
  cpu::StoragePool storage;
  cpu::MaterializationContext mc{executor, storage};

  Env() {
    auto options = small_source_options();
    options.reader.faults = &faults;
    source = io::CheckpointSource::open(ctx.get_executor(), ckpt.path, options);
  }
  /// Runs async_load to completion; rethrows its failure.
  void load(Model& model, const WeightBindingPlan& plan, engine::MaterializeOptions options = {}) {
    auto done = engine::async_load<cpu::Backend>(model, *source, plan, mc, std::move(options), asio::use_future);
    run_until_ready(ctx, done);
  }
  /// Digests of `kind` of every tensor of the checkpoint.
  io::Checksums all_digests(io::DigestKind kind = io::DigestKind::sha256) const {
    io::Checksums sums;
    for (const auto& s : ckpt.specs) sums.add(s.name, kind, io::digest_hex(kind, ckpt.bytes(s.name)));
    return sums;
  }
};

template <class E>
E expect_failure(const std::function<void()>& fn, errc kind) {
  try {
    fn();
  } catch (const E& e) {
    CHECK(e.kind() == kind);
    return e;
  } catch (const std::exception& e) {
    FAIL("unexpected exception: " << e.what());
  }
  FAIL("no exception");
  throw std::logic_error("unreachable");
}

}  // namespace

TEST_CASE("orchestration – a unit loads atomically: recipes, casts, tied alias sharing storage",
          "[engine][orchestration]") {
  Env env;
  Model model;
  env.load(model, WeightBindingPlan(good_bindings()));
  CHECK(to_vector(model.embed.value.bytes()) == env.ckpt.bytes("embed"));
  CHECK(model.lm_head.value.shares_storage_with(model.embed.value));  // an alias is one storage
  std::vector<std::byte> qkv;
  for (auto* n : {"q", "k", "v"}) qkv.insert(qkv.end(), env.ckpt.bytes(n).begin(), env.ckpt.bytes(n).end());
  CHECK(to_vector(model.layer.qkv.value.bytes()) == qkv);
  std::vector<std::byte> f32(env.ckpt.bytes("big").size() * 2);
  cpu::convert_serial(DType::BF16, DType::F32, env.ckpt.bytes("big"), f32);
  CHECK(to_vector(model.layer.big.value.bytes()) == f32);
  CHECK(to_vector(model.layer.norm.value.bytes()) == env.ckpt.bytes("norm"));
  CHECK(env.source->pool().in_use() == 0);
  CHECK(env.source->pool().high_water() <= env.source->pool().budget());
  // The unit's bytes were reserved before its first read (cpu::Backend is a ReservingBackend):
  // its one block of mapped size ("big" as f32, 300 KiB) was carved from the reservation.
  CHECK(env.storage.stats().reserved_allocations == 1);
}

TEST_CASE("orchestration – every failure leaves the module exactly as it was", "[engine][orchestration]") {
  Env env;
  Model model;
  env.load(model, WeightBindingPlan(good_bindings()));
  const Snapshot before = snapshot(model);
  const auto live_before = env.storage.stats().live_bytes;

  auto with = [](std::function<void(std::vector<WeightBinding>&)> edit) {
    auto b = good_bindings();
    edit(b);
    return b;
  };

  SECTION("declared bytes differ: refused before any read") {
    const auto read_before = env.source->reader().stats().bytes;
    auto b = with([](auto& v) {
      v[3] = WeightBinding::from_recipe("layers.0.mlp.big.weight", R::cast(R::source("big"), DType::F32), 1234);
    });
    auto e = expect_failure<OrchestrationError>([&] { env.load(model, WeightBindingPlan(b)); }, errc::byte_mismatch);
    CHECK_THAT(e.what(), Catch::Contains("layers.0.mlp.big.weight") && Catch::Contains("1234"));
    CHECK(env.source->reader().stats().bytes == read_before);
  }
  SECTION("a recipe naming an unknown tensor") {
    auto b = with([](auto& v) {
      v[1] =
          WeightBinding::from_recipe("layers.0.attn.qkv.weight", R::concat({R::source("q"), R::source("kk")}, 0), 512);
    });
    auto e = expect_failure<RecipeError>([&] { env.load(model, WeightBindingPlan(b)); }, errc::recipe_unknown_key);
    CHECK_THAT(e.what(), Catch::Contains("kk"));
  }
  SECTION("a slot without a value") {
    auto b = with([](auto& v) { v.erase(v.begin() + 4); });
    auto e = expect_failure<OrchestrationError>([&] { env.load(model, WeightBindingPlan(b)); }, errc::missing_binding);
    CHECK_THAT(e.what(), Catch::Contains("layers.0.norm.weight"));
  }
  SECTION("a value without a slot") {
    auto b = with([](auto& v) { v.push_back(WeightBinding::tensor("layers.0.extra", "odd", Selection::all(), 7)); });
    auto e =
        expect_failure<OrchestrationError>([&] { env.load(model, WeightBindingPlan(b)); }, errc::unexpected_bindings);
    CHECK_THAT(e.what(), Catch::Contains("layers.0.extra"));
  }
  SECTION("a weight of the wrong shape") {
    auto b = with([](auto& v) {
      v[0] = WeightBinding::tensor("embed.weight", "embed", Selection{{{0, 4}, {0, 16}}}, 128);
      v[5] = WeightBinding::alias("lm_head.weight", "embed.weight", 128);
    });
    auto e = expect_failure<BackendError>([&] { env.load(model, WeightBindingPlan(b)); }, errc::bind_shape_mismatch);
    CHECK_THAT(e.what(), Catch::Contains("embed.weight") && Catch::Contains("[4, 16]"));
  }
  SECTION("a weight of the wrong dtype") {
    auto b = with([](auto& v) {
      v[3] =
          WeightBinding::tensor("layers.0.mlp.big.weight", "big", Selection::all(), bytes_of(DType::BF16, {300, 257}));
    });
    auto e = expect_failure<BackendError>([&] { env.load(model, WeightBindingPlan(b)); }, errc::bind_dtype_mismatch);
    CHECK_THAT(e.what(), Catch::Contains("layers.0.mlp.big.weight"));
  }
  SECTION("an I/O error in one tensor while the others are in flight") {
    const io::TensorInfo& big = env.source->catalog().at("big");
    env.faults.begin = big.offset + big.nbytes / 2;
    env.faults.end = env.faults.begin + 1;
    auto e = expect_failure<Error>([&] { env.load(model, WeightBindingPlan(good_bindings())); }, errc::io_error);
    CHECK_THAT(e.what(), Catch::Contains(env.ckpt.path.string()) && Catch::Contains("'big'") &&
                             Catch::Contains("layers.0.mlp.big.weight"));
    env.faults.end = 0;
  }
  SECTION("the file is truncated after it was opened") {
    std::filesystem::resize_file(env.ckpt.path, env.source->catalog().at("big").offset + 100);
    Error e = expect_failure<Error>([&] { env.load(model, WeightBindingPlan(good_bindings())); }, errc::file_changed);
    CHECK_THAT(e.what(), Catch::Contains(env.ckpt.path.string()));
  }
  SECTION("the file shrinks while a cast converts a resident tensor straight from its mapping") {
    // The cast of `big` maps it (the file is in the page cache); the file is cut inside it
    // right then, so the conversion's reads fault. `norm`, stored after `big`, may fail its
    // read first (unexpected_eof): either way the unit must fail whole.
    const io::TensorInfo& big = env.source->catalog().at("big");
    const auto cut = (big.offset + 4096 + 4095) / 4096 * 4096;
    const std::filesystem::path path = env.ckpt.path;
    env.faults.on_map_hook = [path, cut] { std::filesystem::resize_file(path, cut); };
    try {
      env.load(model, WeightBindingPlan(good_bindings()));
      FAIL("loading a shrunk file succeeded");
    } catch (const Error& e) {
      CHECK((e.kind() == errc::file_changed || e.kind() == errc::unexpected_eof));
      CHECK_THAT(e.what(), Catch::Contains(env.ckpt.path.string()));
    }
    CHECK(env.faults.mapped == 1);
    env.faults.on_map_hook = nullptr;
  }
  CHECK(snapshot(model) == before);
  CHECK(env.source->pool().in_use() == 0);               // every lease returned
  CHECK(env.storage.stats().live_bytes == live_before);  // the failed unit's tensors freed
}

TEST_CASE("orchestration – invalid declarations are refused when the plan is built", "[engine][orchestration]") {
  auto plan_of = [](std::vector<WeightBinding> b) { return WeightBindingPlan(std::move(b)); };
  expect_failure<DeclarationError>(
      [&] {
        plan_of({WeightBinding::tensor("a", "q", {}, 256), WeightBinding::tensor("a", "k", {}, 256)});
      },
      errc::duplicate_binding);
  expect_failure<DeclarationError>([&] { plan_of({WeightBinding::alias("b", "nobody", 256)}); },
                                   errc::alias_unknown_owner);
  expect_failure<DeclarationError>(
      [&] {
        plan_of({WeightBinding::tensor("a", "q", {}, 256), WeightBinding::alias("b", "a", 256),
                 WeightBinding::alias("c", "b", 256)});
      },
      errc::alias_chain);
  expect_failure<DeclarationError>([&] { WeightBinding::tensor("bad..name", "q", {}, 256); },
                                   errc::invalid_parameter_id);
}

TEST_CASE("orchestration – a recipe set is consumed whole into bindings that load", "[engine][orchestration]") {
  Env env;
  engine::AtomicRecipeSet set;
  set.add_output("embed.weight", R::source("embed"));
  set.add_output("layers.0.attn.qkv.weight", R::concat({R::source("q"), R::source("k"), R::source("v")}, 0));
  set.add_output("layers.0.mlp.gate_up.weight", R::concat({R::source("gate"), R::source("up")}, 1));
  set.add_output("layers.0.mlp.big.weight", R::cast(R::source("big"), DType::F32));
  set.add_output("layers.0.norm.weight", R::source("norm"));
  set.add_alias("lm_head.weight", "embed.weight");
  auto bindings = engine::bindings_from_recipe_set(env.source->catalog(), std::move(set));
  REQUIRE(bindings.size() == 6);
  CHECK(bindings.back().is_alias());
  CHECK(bindings.back().expected_bytes() == 256);
  Model model;
  env.load(model, WeightBindingPlan(bindings));
  CHECK(model.lm_head.value.shares_storage_with(model.embed.value));

  engine::AtomicRecipeSet bad;
  bad.add_output("a", R::source("q"));
  bad.add_output("b", R::cast(R::source("odd"), DType::F32));  // u8 -> f32 is not a supported cast
  CHECK_THROWS_AS(engine::bindings_from_recipe_set(env.source->catalog(), std::move(bad)), RecipeError);
}

TEST_CASE("orchestration – park a unit in host memory and bring it back without re-reading", "[engine][transfer]") {
  Env env;
  Model model;
  env.load(model, WeightBindingPlan(good_bindings()));
  const auto read_before = env.source->reader().stats().bytes;
  auto [host, demoted] = cpu::Backend::demote(env.executor, model.layer.big.value);
  demoted.get();
  auto original = to_vector(model.layer.big.value.bytes());
  model.layer.big.value = cpu::Tensor();  // dropped: only the host copy remains
  auto [back, promoted] = cpu::Backend::promote(env.executor, host, env.storage);
  promoted.get();
  cpu::Backend::validate_bind(model.layer.big, back);
  cpu::Backend::bind(model.layer.big, std::move(back));
  CHECK(to_vector(model.layer.big.value.bytes()) == original);
  CHECK(env.source->reader().stats().bytes == read_before);
}

TEST_CASE("orchestration – cancelling a load through its Asio cancellation slot publishes nothing",
          "[engine][orchestration][cancel]") {
  Env env;
  Model model;
  env.load(model, WeightBindingPlan(good_bindings()));
  const Snapshot before = snapshot(model);
  const auto live_before = env.storage.stats().live_bytes;

  asio::cancellation_signal signal;
  std::exception_ptr result;
  bool done = false;
  std::size_t in_use_when_told = 1;
  std::uint64_t live_when_told = 0;
  WeightBindingPlan plan(good_bindings());
  engine::async_load<cpu::Backend>(model, *env.source, plan, env.mc,
                                   asio::bind_cancellation_slot(signal.slot(), [&](std::exception_ptr e) {
                                     result = e;
                                     done = true;
                                     in_use_when_told = env.source->pool().in_use();
                                     live_when_told = env.storage.stats().live_bytes;
                                   }));
  env.ctx.restart();
  env.ctx.run_one();  // the orchestration starts every owner and waits for them
  signal.emit(asio::cancellation_type::terminal);
  while (!done) {
    env.ctx.restart();
    env.ctx.run_one_for(std::chrono::milliseconds(5));
  }
  REQUIRE(result);
  try {
    std::rethrow_exception(result);
  } catch (const Error& e) {
    CHECK(e.kind() == errc::cancelled);
    CHECK_THAT(e.what(), Catch::Contains("cancelled"));
  }
  CHECK(snapshot(model) == before);
  CHECK(in_use_when_told == 0);  // every lease was back before the caller was told
  // The partial unit's storage is freed after the caller was told (engine::detail::ReleasesLate),
  // in a task the loop runs next: a cancelled load does not wait for it.
  CHECK(live_when_told > live_before);
  env.ctx.restart();
  env.ctx.poll();
  CHECK(env.source->pool().in_use() == 0);
  CHECK(env.storage.stats().live_bytes == live_before);
}

namespace {

// Captures log lines for the duration of a test.
struct LogCapture {
  std::mutex mutex;
  std::vector<std::string> lines;
  log::Sink previous;
  LogCapture() {
    previous = log::set_sink([this](log::Level, std::string_view l) {
      std::lock_guard lock(mutex);
      lines.emplace_back(l);
    });
  }
  ~LogCapture() { log::set_sink(std::move(previous)); }
  bool contains(std::string_view needle) {
    std::lock_guard lock(mutex);
    for (auto& l : lines)
      if (l.find(needle) != std::string::npos) return true;
    return false;
  }
};

}  // namespace

TEST_CASE("verification – every tensor a load reads is checked: in place when read whole, by re-reading otherwise",
          "[engine][verify]") {
  Env env;
  Model model;
  engine::MaterializeProgress progress;
  const io::DigestKind kind = GENERATE(io::DigestKind::sha256, io::DigestKind::xxh3_128);
  engine::MaterializeOptions options{
      .progress = &progress,
      .verify = {.mode = engine::VerifyMode::require, .checksums = env.all_digests(kind), .preferred = kind}};
  env.load(model, WeightBindingPlan(good_bindings()), options);
  // embed, norm (in place); q, k, v, gate, up, big (sources of recipes, re-read).
  CHECK(progress.tensors_verified == 8);
  std::uint64_t bytes = 0;
  for (const char* t : {"embed", "norm", "q", "k", "v", "gate", "up", "big"}) bytes += env.ckpt.bytes(t).size();
  CHECK(progress.bytes_verified == bytes);
  CHECK(progress.tensors_unverified == 0);
  CHECK(to_vector(model.embed.value.bytes()) == env.ckpt.bytes("embed"));
  CHECK(env.source->pool().in_use() == 0);
}

TEST_CASE("verification – tensors read whole are hashed where they landed, without a second read", "[engine][verify]") {
  Env env;
  Model unverified_model, verified_model;
  std::vector<WeightBinding> plain = {
      WeightBinding::tensor("embed.weight", "embed", Selection::all(), 256),
      WeightBinding::tensor("layers.0.attn.qkv.weight", "q", Selection::all(), 256),
  };
  struct Small {
    cpu::Parameter embed{DType::BF16, {8, 16}};
    cpu::Parameter q{DType::BF16, {8, 16}};
    void visit_parameters(engine::ParameterVisitor<cpu::Parameter>& v, const std::string& prefix) const {
      v.visit({engine::ParameterId(engine::join_name(prefix, "embed.weight")), embed.dtype, embed.shape}, embed);
      v.visit({engine::ParameterId(engine::join_name(prefix, "layers.0.attn.qkv.weight")), q.dtype, q.shape}, q);
    }
    void visit_parameters_mut(engine::ParameterVisitorMut<cpu::Parameter>& v, const std::string& prefix) {
      v.visit_mut({engine::ParameterId(engine::join_name(prefix, "embed.weight")), embed.dtype, embed.shape}, embed);
      v.visit_mut({engine::ParameterId(engine::join_name(prefix, "layers.0.attn.qkv.weight")), q.dtype, q.shape}, q);
    }
  };
  auto load = [&](Small& m, engine::MaterializeOptions o) {
    auto done = engine::async_load<cpu::Backend>(m, *env.source, WeightBindingPlan(plain), env.mc, std::move(o),
                                                 asio::use_future);
    run_until_ready(env.ctx, done);
  };
  Small a, b;
  const auto r0 = env.source->reader().stats().bytes;
  load(a, {});
  const auto r1 = env.source->reader().stats().bytes;
  engine::MaterializeProgress progress;
  load(b, {.progress = &progress, .verify = {.mode = engine::VerifyMode::on, .checksums = env.all_digests()}});
  const auto r2 = env.source->reader().stats().bytes;
  CHECK(r2 - r1 == r1 - r0);  // the verified load read exactly what the plain one did
  CHECK(progress.tensors_verified == 2);

  // A digest that does not match the delivered bytes fails the load, naming the parameter.
  io::Checksums wrong = env.all_digests();
  wrong.add("q", io::digest_hex(io::DigestKind::sha256, env.ckpt.bytes("k")));
  Small c;
  auto e = expect_failure<Error>([&] { load(c, {.verify = {.mode = engine::VerifyMode::on, .checksums = wrong}}); },
                                 errc::checksum_mismatch);
  CHECK_THAT(e.what(), Catch::Contains("'q'") && Catch::Contains("layers.0.attn.qkv.weight") &&
                           Catch::Contains(env.ckpt.path.string()));
  CHECK_FALSE(c.q.value);
  CHECK_FALSE(c.embed.value);
  CHECK(env.source->pool().in_use() == 0);
}

TEST_CASE("verification – a mismatch, a missing digest under require, and nothing to verify under on",
          "[engine][verify]") {
  Env env;
  Model model;
  env.load(model, WeightBindingPlan(good_bindings()));
  const Snapshot before = snapshot(model);
  const auto live_before = env.storage.stats().live_bytes;
  using engine::VerifyMode;

  SECTION("a source of a recipe whose bytes differ from its digest (checked by re-reading)") {
    io::Checksums sums = env.all_digests();
    sums.add("v", io::digest_hex(io::DigestKind::sha256, env.ckpt.bytes("q")));
    auto e = expect_failure<Error>(
        [&] {
          env.load(model, WeightBindingPlan(good_bindings()), {.verify = {.mode = VerifyMode::on, .checksums = sums}});
        },
        errc::checksum_mismatch);
    CHECK_THAT(e.what(), Catch::Contains("'v'"));
  }
  SECTION("require with a tensor that has no digest: refused before any read") {
    io::Checksums sums;
    for (const char* t : {"embed", "q", "k", "v", "gate", "up", "big"})
      sums.add(t, io::digest_hex(io::DigestKind::sha256, env.ckpt.bytes(t)));
    const auto read_before = env.source->reader().stats().bytes;
    auto e = expect_failure<Error>(
        [&] {
          env.load(model, WeightBindingPlan(good_bindings()),
                   {.verify = {.mode = VerifyMode::require, .checksums = sums}});
        },
        errc::invalid_argument);
    CHECK_THAT(e.what(), Catch::Contains("'norm'") && Catch::Contains("no digest"));
    CHECK(env.source->reader().stats().bytes == read_before);
  }
  SECTION("a mode that is no VerifyMode: invalid_argument naming the field, before any read") {
    const auto read_before = env.source->reader().stats().bytes;
    auto e = expect_failure<Error>(
        [&] { env.load(model, WeightBindingPlan(good_bindings()), {.verify = {.mode = static_cast<VerifyMode>(5)}}); },
        errc::invalid_argument);
    CHECK_THAT(e.what(), Catch::Contains("VerifyOptions::mode is 5"));
    CHECK(env.source->reader().stats().bytes == read_before);
  }
  SECTION("require with a partial selection: its digest covers the whole tensor") {
    auto b = good_bindings();
    b[0] = WeightBinding::tensor("embed.weight", "embed", Selection{{{0, 4}, {0, 16}}}, 128);
    b[5] = WeightBinding::alias("lm_head.weight", "embed.weight", 128);
    auto e = expect_failure<Error>(
        [&] {
          env.load(model, WeightBindingPlan(b),
                   {.verify = {.mode = VerifyMode::require, .checksums = env.all_digests()}});
        },
        errc::invalid_argument);
    CHECK_THAT(e.what(), Catch::Contains("'embed'") && Catch::Contains("partially"));
  }
  SECTION("on with no digest anywhere: the load succeeds and one line says nothing was verified") {
    LogCapture log;
    engine::MaterializeProgress progress;
    Model other;
    env.load(other, WeightBindingPlan(good_bindings()), {.progress = &progress, .verify = {.mode = VerifyMode::on}});
    CHECK(log.contains("nothing is verified"));
    CHECK(progress.tensors_verified == 0);
    CHECK(progress.tensors_unverified == 8);
  }
  CHECK(snapshot(model) == before);
  CHECK(env.source->pool().in_use() == 0);
  CHECK(env.storage.stats().live_bytes == live_before);
}

TEST_CASE("verification – digests recorded in the checkpoint's metadata are used when none are given",
          "[engine][verify]") {
  std::vector<synth::TensorSpec> tensors = {{"embed", DType::BF16, {8, 16}}, {"q", DType::BF16, {8, 16}}};
  const auto data = random_tensor_bytes(tensors, 5);
  TempDir dir;
  const auto path = dir / "m.safetensors";
  io::Metadata metadata{{"sha256:embed", io::sha256_hex(data[0])},
                        {"xxh3-128:q", io::digest_hex(io::DigestKind::xxh3_128, data[1])}};
  synth::write_safetensors(path, tensors, spans_of(data), metadata);
  asio::io_context ctx;
  auto source = io::CheckpointSource::open(ctx.get_executor(), path);
  cpu::Executor executor{2};
  cpu::StoragePool storage;
  cpu::MaterializationContext mc{executor, storage};
  WeightBindingPlan plan({WeightBinding::tensor("e", "embed", Selection::all(), 256),
                          WeightBinding::tensor("q", "q", Selection::all(), 256)});
  engine::MaterializeProgress progress;
  auto done = engine::async_materialize<cpu::Backend>(
      *source, plan, mc, {.progress = &progress, .verify = {.mode = engine::VerifyMode::require}}, asio::use_future);
  auto unit = run_until_ready(ctx, done);
  CHECK(progress.tensors_verified == 2);
  CHECK(progress.bytes_verified == 512);
}
