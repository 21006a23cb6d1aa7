// ModelSlot (double-buffered hot-swap) and InPlaceModelSlot on the CPU backend: versions
// publish whole, every failure kind leaves the serving version bit-identical, concurrent
// readers never see a mix, and memory returns to one version after many swaps — from a local
// checkpoint, and from an in-memory io::ByteSource (test::VectorSource) that is not a file.

#include <asio/bind_cancellation_slot.hpp>
#include <asio/cancellation_signal.hpp>
#include <asio/use_future.hpp>
#include <atomic>
#include <catch2/catch.hpp>
#include <cerrno>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "cpu/cpu_fixture.hpp"
#include "eredu/core/error.hpp"
#include "eredu/cpu/convert.hpp"
#include "eredu/engine/serving/in_place_model_slot.hpp"
#include "eredu/engine/serving/model_slot.hpp"
#include "eredu/io/integrity/digest.hpp"
#include "eredu/io/integrity/sha256.hpp"
#include "support/vector_source.hpp"

using namespace eredu;
using namespace eredu::test;
using engine::DerivedWeightRecipe;
using engine::WeightBinding;
using engine::WeightBindingPlan;

// Named, not anonymous: the slots' swap coroutines are also instantiated on these types from
// the shared conformance header, where GCC flags (-Wsubobject-linkage) a coroutine frame
// holding a type of an anonymous namespace.
namespace model_slot_test {

std::vector<synth::TensorSpec> model_specs() {
  return {{"w", DType::BF16, {64, 48}}, {"b", DType::BF16, {96}}, {"n", DType::F32, {48}}};
}

/// A small model: a matrix of `Rows` rows (of dtype W: F32 is the stored BF16 cast), a kept
/// vector, and a tied alias of the vector.
template <DType W, std::uint64_t Rows = 64>
struct BasicTinyModel {
  cpu::Parameter w{W, {Rows, 48}};
  cpu::Parameter b{DType::BF16, {96}};
  cpu::Parameter n{DType::F32, {48}};
  cpu::Parameter b_tied{DType::BF16, {96}};

  template <class Self, class Fn>
  static void each(Self& self, Fn&& fn) {
    fn("w", self.w);
    fn("b", self.b);
    fn("n", self.n);
    fn("b_tied", self.b_tied);
  }
  void visit_parameters(engine::ParameterVisitor<cpu::Parameter>& v, const std::string& prefix) const {
    visit_slots(*this, v, prefix);
  }
  void visit_parameters_mut(engine::ParameterVisitorMut<cpu::Parameter>& v, const std::string& prefix) {
    visit_slots_mut(*this, v, prefix);
  }
  /// A tag computed from every weight's bytes: which version a response came from.
  std::string tag() const {
    io::Sha256 h;
    each(*this, [&](const char*, const cpu::Parameter& p) { h.update(p.value.bytes()); });
    return h.hex_digest();
  }
  /// Every weight's bytes, in order (the tied one included): what a version's reader sees.
  std::vector<std::byte> bytes() const {
    std::vector<std::byte> out;
    each(*this, [&](const char*, const cpu::Parameter& p) {
      out.insert(out.end(), p.value.bytes().begin(), p.value.bytes().end());
    });
    return out;
  }
};

/// The model most cases load: its matrix is cast by a recipe.
using TinyModel = BasicTinyModel<DType::F32>;

std::vector<WeightBinding> bindings() {
  return {
      WeightBinding::from_recipe("w", DerivedWeightRecipe::cast(DerivedWeightRecipe::source("w"), DType::F32),
                                 64 * 48 * 4),
      WeightBinding::tensor("b", "b", Selection::all(), 96 * 2),
      WeightBinding::tensor("n", "n", Selection::all(), 48 * 4),
      WeightBinding::alias("b_tied", "b", 96 * 2),
  };
}

using Slot = engine::ModelSlot<cpu::Backend, TinyModel>;

/// The tag a correct load of `ckpt` gives.
std::string expected_tag(const CpuCheckpoint& ckpt) {
  std::vector<std::byte> w(ckpt.bytes("w").size() * 2);
  cpu::convert_serial(DType::BF16, DType::F32, ckpt.bytes("w"), w);
  io::Sha256 h;
  h.update(w);
  h.update(ckpt.bytes("b"));
  h.update(ckpt.bytes("n"));
  h.update(ckpt.bytes("b"));
  return h.hex_digest();
}

/// Threads that read a slot as requests would until stop(), counting reads and mixed
/// versions. `read` makes one request: std::nullopt when it could not read (the slot is
/// writing), else whether what it read was one whole version. Starts once every thread has read.
class Readers {
 public:
  Readers(int n, std::function<std::optional<bool>()> read) : read_(std::move(read)) {
    for (int r = 0; r < n; ++r)
      threads_.emplace_back([this] {
        bool counted = false;  // this reader has read once: swaps may start
        while (!stop_.load(std::memory_order_relaxed)) {
          const std::optional<bool> whole = read_();
          if (!whole) {
            std::this_thread::yield();
            continue;
          }
          if (!*whole) mixed_.fetch_add(1);
          reads_.fetch_add(1);
          if (!std::exchange(counted, true)) running_.fetch_add(1);
        }
      });
    while (running_.load() < n) std::this_thread::yield();
  }
  ~Readers() { stop(); }
  Readers(const Readers&) = delete;
  Readers& operator=(const Readers&) = delete;
  /// Stops and joins every thread.
  void stop() {
    stop_ = true;
    for (auto& t : threads_) t.join();
    threads_.clear();
  }
  /// Requests that read a version.
  std::uint64_t reads() const { return reads_.load(); }
  /// Of those, the ones that saw a mix of versions.
  std::uint64_t mixed() const { return mixed_.load(); }

 private:
  std::function<std::optional<bool>()> read_;
  std::atomic<bool> stop_{false};
  std::atomic<std::uint64_t> reads_{0}, mixed_{0};
  std::atomic<int> running_{0};
  std::vector<std::thread> threads_;
};

struct Env {
  CpuCheckpoint a{model_specs(), 11};
  CpuCheckpoint b{model_specs(), 12};
  asio::io_context ctx;
  struct FailAll final : io::FaultInjector {
    std::atomic<bool> on{false};
    io::ReadFault on_complete(std::uint32_t, std::uint64_t, std::uint64_t) override {
      return on ? io::ReadFault{.error = EIO} : io::ReadFault{};
    }
  } faults;
  std::unique_ptr<io::CheckpointSource> source_a, source_b;
  cpu::Executor serving{2};
  cpu::Executor background{1};  // the swap's throttled arena
  cpu::StoragePool storage;
  cpu::MaterializationContext mc{background, storage};
  Slot slot{[] { return TinyModel{}; }};
  WeightBindingPlan plan{bindings()};
  // A and B again, served from memory (not a file), in chunks that split elements.
  test::VectorSource memory_a{ctx.get_executor(), std::size_t{1} << 20, 1000};
  test::VectorSource memory_b{ctx.get_executor(), std::size_t{1} << 20, 1000};

  Env() {
    source_a = io::CheckpointSource::open(ctx.get_executor(), a.path, small_source_options());
    auto options = small_source_options();
    options.reader.faults = &faults;
    source_b = io::CheckpointSource::open(ctx.get_executor(), b.path, options);
    for (std::size_t i = 0; i < a.specs.size(); ++i) {
      memory_a.add(a.specs[i].name, a.specs[i].dtype, a.specs[i].shape, a.data[i]);
      memory_b.add(b.specs[i].name, b.specs[i].dtype, b.specs[i].shape, b.data[i]);
    }
  }

  template <class T>
  T get(std::future<T>& future) {
    return run_until_ready(ctx, future);
  }

  engine::SwapReport swap(io::CheckpointSource& source, engine::SwapOptions<TinyModel> options = {}) {
    auto f = slot.async_swap(source, plan, mc, std::move(options), asio::use_future);
    return get(f);
  }

  /// Expects the swap to fail with `kind` and the serving version to be unchanged.
  void expect_rejected(io::CheckpointSource& source, errc kind, engine::SwapOptions<TinyModel> options = {},
                       const WeightBindingPlan* other_plan = nullptr) {
    auto before = slot.current();
    REQUIRE(before);
    const std::string tag = before->model.tag();
    try {
      auto f = slot.async_swap(source, other_plan ? *other_plan : plan, mc, std::move(options), asio::use_future);
      get(f);
      FAIL("the swap succeeded");
    } catch (const Error& e) {
      CHECK(e.kind() == kind);
      INFO(e.what());
    }
    CHECK(slot.current() == before);            // the same version object
    CHECK(slot.current()->model.tag() == tag);  // and not a byte of it changed
    CHECK_FALSE(slot.swapping());
    CHECK(source.pool().in_use() == 0);
  }
};

}  // namespace model_slot_test

using namespace model_slot_test;

TEST_CASE("model slot – versions publish whole, with generations, and the old one lives while read", "[engine][swap]") {
  Env env;
  CHECK(env.slot.current() == nullptr);
  CHECK(env.slot.generation() == 0);
  engine::SwapReport r1 = env.swap(*env.source_a, {.origin = "a"});
  CHECK(r1.generation == 1);
  CHECK(r1.bytes == 64 * 48 * 4 + 96 * 2 + 48 * 4);
  auto v1 = env.slot.current();
  REQUIRE(v1);
  CHECK(v1->origin == "a");
  CHECK(v1->model.tag() == expected_tag(env.a));
  CHECK(v1->model.b_tied.value.shares_storage_with(v1->model.b.value));

  engine::SwapReport r2 = env.swap(*env.source_b, {.origin = "b"});
  CHECK(r2.generation == 2);
  CHECK(r2.publish_pause.count() >= 0);
  CHECK(env.slot.current()->model.tag() == expected_tag(env.b));
  // A reader that took version 1 before the swap still has all of it.
  CHECK(v1->model.tag() == expected_tag(env.a));
  CHECK(v1.use_count() == 1);
}

TEST_CASE("model slot – every failed swap leaves the serving version untouched", "[engine][swap]") {
  Env env;
  env.swap(*env.source_a, {.origin = "a"});

  SECTION("an I/O error mid-load") {
    env.faults.on = true;
    env.expect_rejected(*env.source_b, errc::io_error);
  }
  SECTION("the checkpoint is truncated after it was opened") {
    std::filesystem::resize_file(env.b.path, env.source_b->catalog().at("n").offset + 10);
    env.expect_rejected(*env.source_b, errc::file_changed);
  }
  SECTION("a tensor the plan needs is missing") {
    WeightBindingPlan missing({WeightBinding::tensor("w", "nope", Selection::all(), 64 * 48 * 4)});
    env.expect_rejected(*env.source_b, errc::recipe_unknown_key, {}, &missing);
  }
  SECTION("the new set lacks a parameter of the model") {
    auto b = bindings();
    b.pop_back();
    WeightBindingPlan lacking(std::move(b));
    env.expect_rejected(*env.source_b, errc::missing_binding, {}, &lacking);
  }
  SECTION("the new set has an extra tensor") {
    auto b = bindings();
    b.push_back(WeightBinding::tensor("extra", "n", Selection::all(), 48 * 4));
    WeightBindingPlan extra(std::move(b));
    env.expect_rejected(*env.source_b, errc::unexpected_bindings, {}, &extra);
  }
  SECTION("a weight has the wrong shape") {
    auto b = bindings();
    b[2] = WeightBinding::tensor("n", "n", Selection{{{0, 24}}}, 24 * 4);
    WeightBindingPlan narrow(std::move(b));
    env.expect_rejected(*env.source_b, errc::bind_shape_mismatch, {}, &narrow);
  }
  SECTION("a checksum does not match") {
    io::Checksums sums;
    sums.add("w", io::sha256_hex(env.b.bytes("w")));
    sums.add("n", io::sha256_hex(env.a.bytes("n")));  // A's digest: B's bytes differ
    env.expect_rejected(*env.source_b, errc::checksum_mismatch, {.checksums = sums});
  }
  SECTION("the canary rejects the new version") {
    env.expect_rejected(*env.source_b, errc::canary_failed, {.canary = [](const TinyModel&) -> asio::awaitable<void> {
      throw std::runtime_error("probe output is NaN");
      co_return;
    }});
  }
  SECTION("the swap is cancelled") {
    asio::cancellation_signal cancel;
    auto before = env.slot.current();
    auto f = env.slot.async_swap(*env.source_b, env.plan, env.mc,
                                 asio::bind_cancellation_slot(cancel.slot(), asio::use_future));
    cancel.emit(asio::cancellation_type::terminal);
    CHECK_THROWS_AS(env.get(f), Error);
    CHECK(env.slot.current() == before);
    CHECK(env.source_b->pool().in_use() == 0);
  }
  SECTION("a second swap while one runs") {
    auto first = env.slot.async_swap(*env.source_b, env.plan, env.mc, asio::use_future);
    env.ctx.restart();
    env.ctx.poll_one();  // the first swap has claimed the slot
    auto second = env.slot.async_swap(*env.source_a, env.plan, env.mc, asio::use_future);
    try {
      env.get(second);
      FAIL("two swaps ran at once");
    } catch (const Error& e) {
      CHECK(e.kind() == errc::swap_in_progress);
    }
    env.get(first);
    CHECK(env.slot.current()->model.tag() == expected_tag(env.b));
  }
  // After every failure, a good swap still works.
  env.faults.on = false;
  if (std::filesystem::file_size(env.b.path) == std::filesystem::file_size(env.a.path)) {
    env.swap(*env.source_b);
    CHECK(env.slot.current()->model.tag() == expected_tag(env.b));
  }
}

TEST_CASE("model slot – checksums that match let the version through", "[engine][swap]") {
  Env env;
  io::Checksums sums;
  for (const char* t : {"w", "b", "n"}) sums.add(t, io::sha256_hex(env.a.bytes(t)));
  engine::SwapReport r = env.swap(*env.source_a, {.checksums = sums});
  CHECK(r.verified_bytes == env.a.bytes("w").size() + env.a.bytes("b").size() + env.a.bytes("n").size());
  bool canary_ran = false;
  env.swap(*env.source_b, {.canary = [&](const TinyModel& m) -> asio::awaitable<void> {
    canary_ran = m.tag() == expected_tag(env.b);
    co_return;
  }});
  CHECK(canary_ran);
}

TEST_CASE("model slot – concurrent readers see whole versions while swaps repeat, and memory returns",
          "[engine][swap][stress]") {
  Env env;
  env.swap(*env.source_a);
  const std::string tag_a = expected_tag(env.a), tag_b = expected_tag(env.b);
  const std::uint64_t one_version = env.storage.stats().live_bytes;

  Readers readers(3, [&]() -> std::optional<bool> {
    auto v = env.slot.current();  // held for the whole "request"
    return v->model.tag() == (v->generation % 2 == 1 ? tag_a : tag_b);
  });
  const int swaps = 20;
  for (int i = 0; i < swaps; ++i) env.swap(i % 2 == 0 ? *env.source_b : *env.source_a);
  readers.stop();

  CHECK(readers.mixed() == 0);
  CHECK(readers.reads() > 0);
  CHECK(env.slot.generation() == 1 + swaps);
  // Only the serving version is live; every retired version's storage went back to the pool,
  // and later swaps reused it rather than asking the system again.
  CHECK(env.storage.stats().live_bytes == one_version);
  CHECK(env.storage.stats().recycled_allocations > 0);
  CHECK(env.source_a->pool().in_use() == 0);
  CHECK(env.source_b->pool().in_use() == 0);
}

namespace model_slot_test {

using InPlace = engine::InPlaceModelSlot<cpu::Backend, TinyModel>;

/// Runs an in-place swap to completion (rethrows its failure).
engine::SwapReport swap_in_place(Env& env, InPlace& slot, io::CheckpointSource& source, const WeightBindingPlan& plan,
                                 engine::SwapOptions<TinyModel> options = {}) {
  auto f = slot.async_swap(source, plan, env.mc, env.background, std::move(options), asio::use_future);
  return env.get(f);
}

}  // namespace model_slot_test

TEST_CASE("in-place slot – weights are overwritten in their own storage, only after the whole set is staged",
          "[engine][swap][in-place]") {
  Env env;
  InPlace slot([] { return TinyModel{}; });
  CHECK(slot.generation() == 0);
  swap_in_place(env, slot, *env.source_a, env.plan);
  const std::byte* w_address = nullptr;
  {
    auto reader = slot.try_read();
    REQUIRE(reader);
    CHECK(reader->generation() == 1);
    CHECK(reader->model().tag() == expected_tag(env.a));
    w_address = reader->model().w.value.bytes().data();
  }
  engine::SwapReport r = swap_in_place(env, slot, *env.source_b, env.plan);
  CHECK(r.generation == 2);
  auto reader = slot.try_read();
  REQUIRE(reader);
  CHECK(reader->model().tag() == expected_tag(env.b));
  CHECK(reader->model().w.value.bytes().data() == w_address);  // same storage, new contents
  CHECK(reader->model().b_tied.value.shares_storage_with(reader->model().b.value));
}

TEST_CASE("in-place slot – a failed swap changes no byte, and a reader in flight holds the copy back",
          "[engine][swap][in-place]") {
  Env env;
  InPlace slot([] { return TinyModel{}; });
  swap_in_place(env, slot, *env.source_a, env.plan);
  auto tag_now = [&] {
    auto f = slot.async_read(asio::use_future);
    return env.get(f).model().tag();
  };

  SECTION("I/O error while staging") {
    env.faults.on = true;
    CHECK_THROWS_AS(swap_in_place(env, slot, *env.source_b, env.plan), Error);
    CHECK(tag_now() == expected_tag(env.a));
    CHECK(slot.generation() == 1);
  }
  SECTION("wrong shape, caught before the copy") {
    auto b = bindings();
    b[2] = WeightBinding::tensor("n", "n", Selection{{{0, 24}}}, 24 * 4);
    WeightBindingPlan narrow(std::move(b));
    try {
      swap_in_place(env, slot, *env.source_b, narrow);
      FAIL("accepted");
    } catch (const Error& e) {
      CHECK(e.kind() == errc::bind_shape_mismatch);
    }
    CHECK(tag_now() == expected_tag(env.a));
  }
  SECTION("different aliasing") {
    auto b = bindings();
    b[3] = WeightBinding::tensor("b_tied", "b", Selection::all(), 96 * 2);
    WeightBindingPlan untied(std::move(b));
    CHECK_THROWS_AS(swap_in_place(env, slot, *env.source_b, untied), Error);
    CHECK(tag_now() == expected_tag(env.a));
  }
  SECTION("canary") {
    CHECK_THROWS_AS(
        swap_in_place(env, slot, *env.source_b, env.plan, {.canary = [](const TinyModel&) -> asio::awaitable<void> {
                        throw std::runtime_error("bad probe");
                        co_return;
                      }}),
        Error);
    CHECK(tag_now() == expected_tag(env.a));
  }
  SECTION("a reader in flight delays the copy, and new reads wait for it") {
    auto held = slot.try_read();
    REQUIRE(held);
    auto f = slot.async_swap(*env.source_b, env.plan, env.mc, env.background, asio::use_future);
    // Staging completes, then the swap waits for `held`.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (slot.try_read().has_value() && std::chrono::steady_clock::now() < deadline) {
      env.ctx.restart();
      env.ctx.run_one_for(std::chrono::milliseconds(5));
    }
    CHECK_FALSE(slot.try_read().has_value());  // the gate is closed for new readers
    CHECK(f.wait_for(std::chrono::milliseconds(0)) != std::future_status::ready);
    CHECK(held->model().tag() == expected_tag(env.a));  // the reader still sees version 1 whole
    held.reset();                                       // the request ends
    engine::SwapReport r = env.get(f);
    CHECK(r.readers_drained > std::chrono::nanoseconds(0));
    CHECK(tag_now() == expected_tag(env.b));
  }
}

TEST_CASE("in-place slot – concurrent readers never see a mix while swaps repeat", "[engine][swap][in-place][stress]") {
  Env env;
  InPlace slot([] { return TinyModel{}; });
  swap_in_place(env, slot, *env.source_a, env.plan);
  const std::uint64_t serving_bytes = env.storage.stats().live_bytes;
  const std::string tag_a = expected_tag(env.a), tag_b = expected_tag(env.b);
  Readers readers(2, [&]() -> std::optional<bool> {
    auto reader = slot.try_read();
    if (!reader) return std::nullopt;
    return reader->model().tag() == (reader->generation() % 2 == 1 ? tag_a : tag_b);
  });
  for (int i = 0; i < 10; ++i) swap_in_place(env, slot, i % 2 == 0 ? *env.source_b : *env.source_a, env.plan);
  readers.stop();
  CHECK(readers.mixed() == 0);
  CHECK(readers.reads() > 0);
  CHECK(slot.generation() == 11);
  // The serving model and nothing else: every staged set went back to the pool.
  CHECK(env.storage.stats().live_bytes == serving_bytes);
  CHECK(env.source_a->pool().in_use() == 0);
}

namespace model_slot_test {

/// TinyModel with every weight read as stored (no recipe): what a patch can write in place.
using PlainModel = BasicTinyModel<DType::BF16>;

std::vector<WeightBinding> plain_bindings() {
  return {
      WeightBinding::tensor("w", "w", Selection::all(), 64 * 48 * 2),
      WeightBinding::tensor("b", "b", Selection::all(), 96 * 2),
      WeightBinding::tensor("n", "n", Selection::all(), 48 * 4),
      WeightBinding::alias("b_tied", "b", 96 * 2),
  };
}

/// Three versions in memory: A, A with three bytes changed (in three 64-byte blocks), and B,
/// which differs everywhere; an in-place slot serving A.
struct PatchEnv {
  Env env;
  std::vector<std::vector<std::byte>> a = env.a.data, a2 = env.a.data, b = env.b.data;
  std::unique_ptr<test::VectorSource> source_a, source_a2, source_b;
  WeightBindingPlan plan{plain_bindings()};
  engine::InPlaceModelSlot<cpu::Backend, PlainModel> slot{[] { return PlainModel{}; }};

  PatchEnv() {
    a2[0][5] ^= std::byte{0x40};     // w: block 0
    a2[0][3000] ^= std::byte{0x01};  // w: block 46
    a2[2][100] ^= std::byte{0x80};   // n: block 1
    source_a = make(a);
    source_a2 = make(a2);
    source_b = make(b);
    auto f = slot.async_swap(*source_a, plan, env.mc, env.background, asio::use_future);
    env.get(f);
  }
  std::unique_ptr<test::VectorSource> make(const std::vector<std::vector<std::byte>>& data) {
    // Chunks of 1000 bytes: blocks and changed runs straddle them.
    auto s = std::make_unique<test::VectorSource>(env.ctx.get_executor(), std::size_t{1} << 20, 1000);
    for (std::size_t i = 0; i < env.a.specs.size(); ++i)
      s->add(env.a.specs[i].name, env.a.specs[i].dtype, env.a.specs[i].shape, data[i]);
    return s;
  }
  /// What a reader of version `data` sees.
  static std::vector<std::byte> expected(const std::vector<std::vector<std::byte>>& data) {
    std::vector<std::byte> out;
    for (int i : {0, 1, 2, 1}) out.insert(out.end(), data[i].begin(), data[i].end());
    return out;
  }
  /// The XXH3-128 digests of every tensor of `data`, under A's names.
  io::Checksums digests(const std::vector<std::vector<std::byte>>& data) const {
    io::Checksums sums;
    for (std::size_t i = 0; i < data.size(); ++i)
      sums.add(env.a.specs[i].name, io::DigestKind::xxh3_128, io::digest_hex(io::DigestKind::xxh3_128, data[i]));
    return sums;
  }
  engine::SwapReport patch(test::VectorSource& source, engine::SwapOptions<PlainModel> options = {},
                           engine::PatchOptions patch_options = {}, const WeightBindingPlan* other = nullptr) {
    auto f = slot.async_patch(source, other ? *other : plan, env.background, std::move(options), patch_options,
                              asio::use_future);
    return env.get(f);
  }
  std::vector<std::byte> serving() {
    auto f = slot.async_read(asio::use_future);
    return env.get(f).model().bytes();
  }
};

}  // namespace model_slot_test

TEST_CASE("in-place patch – writes only the changed blocks, in the serving storage, after checking the digests",
          "[engine][swap][in-place][patch]") {
  PatchEnv p;
  const std::byte* w_address = nullptr;
  {
    auto reader = p.slot.try_read();
    REQUIRE(reader);
    w_address = reader->model().w.value.bytes().data();
  }
  engine::SwapReport r = p.patch(*p.source_a2, {.checksums = p.digests(p.a2)});
  CHECK(r.generation == 2);
  CHECK(r.written_bytes == 3 * 64);
  CHECK(r.verified_bytes == (64 * 48 * 2) + (96 * 2) + (48 * 4));
  CHECK(p.serving() == PatchEnv::expected(p.a2));
  auto reader = p.slot.try_read();
  REQUIRE(reader);
  CHECK(reader->generation() == 2);
  CHECK(reader->model().w.value.bytes().data() == w_address);
  CHECK(reader->model().b_tied.value.shares_storage_with(reader->model().b.value));
  reader.reset();

  // Back to A: the same three blocks; then to B, which changes every block (within budget).
  CHECK(p.patch(*p.source_a).written_bytes == 3 * 64);
  CHECK(p.serving() == PatchEnv::expected(p.a));
  engine::SwapReport to_b = p.patch(*p.source_b);
  CHECK(to_b.written_bytes <= to_b.bytes);
  CHECK(to_b.written_bytes > to_b.bytes / 2);
  CHECK(p.serving() == PatchEnv::expected(p.b));
  CHECK(p.slot.generation() == 4);
  CHECK(p.source_b->pool().in_use() == 0);
}

TEST_CASE("in-place patch – a delta is read only where its sender says it changed, the rest hashed where it serves",
          "[engine][swap][in-place][patch]") {
  PatchEnv p;
  // A2 as a delta against A, which serves: its sender names the 64-byte ranges of its three
  // changed bytes.
  p.source_a2->declare_changed("w", {{.offset = 0, .length = 64}, {.offset = 2944, .length = 64}});
  p.source_a2->declare_changed("b", {});
  p.source_a2->declare_changed("n", {{.offset = 64, .length = 64}});
  const std::uint64_t total = (64 * 48 * 2) + (96 * 2) + (48 * 4);
  const std::vector<std::byte> before = p.serving();
  SECTION("with digests, only those ranges are read, and every byte is checked") {
    engine::MaterializeProgress progress;
    engine::SwapReport r = p.patch(*p.source_a2, {.checksums = p.digests(p.a2), .progress = &progress});
    CHECK(p.source_a2->delivered() == 3 * 64);
    CHECK(r.written_bytes == 3 * 64);
    CHECK(r.verified_bytes == total);
    CHECK(progress.bytes_verified == total);
    CHECK(progress.bytes_done == total);
    CHECK(p.serving() == PatchEnv::expected(p.a2));
    CHECK(p.slot.generation() == 2);
  }
  SECTION("without digests, the sender's ranges are not trusted: every byte is read") {
    CHECK(p.patch(*p.source_a2).written_bytes == 3 * 64);
    CHECK(p.source_a2->delivered() == total);
    CHECK(p.serving() == PatchEnv::expected(p.a2));
  }
  // A sender's ranges that are wrong for `tensor`: the patch fails with `kind` naming it, and
  // writes nothing.
  const auto refused = [&](const std::string& tensor, std::vector<io::SelectionRange> ranges, errc kind) {
    p.source_a2->declare_changed(tensor, std::move(ranges));
    try {
      p.patch(*p.source_a2, {.checksums = p.digests(p.a2)});
      FAIL("the patch succeeded");
    } catch (const Error& e) {
      INFO(e.what());
      CHECK(e.kind() == kind);
      CHECK(e.context().tensor == tensor);
    }
    CHECK(p.serving() == before);
    CHECK(p.slot.generation() == 1);
  };
  SECTION("a sender that leaves a changed range out: the digest of the whole weight refuses it") {
    refused("n", {}, errc::checksum_mismatch);
  }
  SECTION("ranges out of order: an io_error") {
    refused("w", {{.offset = 2944, .length = 64}, {.offset = 0, .length = 64}}, errc::io_error);
  }
}

namespace model_slot_test {

/// PlainModel with a matrix of 2048 rows: 192 KiB, three 64 KiB digest blocks.
using WidePlainModel = BasicTinyModel<DType::BF16, 2048>;

/// Versions of WidePlainModel in memory, a slot serving the first, and patches between them
/// checked against block digests (io::DigestKind::xxh3_128_blocks).
struct WidePatchEnv {
  static constexpr std::size_t B = io::BlockDigests::block_bytes;
  Env env;
  std::vector<synth::TensorSpec> specs{
      {"w", DType::BF16, {2048, 48}}, {"b", DType::BF16, {96}}, {"n", DType::F32, {48}}};
  WeightBindingPlan plan{{
      WeightBinding::tensor("w", "w", Selection::all(), 2048 * 48 * 2),
      WeightBinding::tensor("b", "b", Selection::all(), 96 * 2),
      WeightBinding::tensor("n", "n", Selection::all(), 48 * 4),
      WeightBinding::alias("b_tied", "b", 96 * 2),
  }};
  engine::InPlaceModelSlot<cpu::Backend, WidePlainModel> slot{[] { return WidePlainModel{}; }};
  std::vector<std::vector<std::byte>> v1;
  std::uint64_t total = 0;

  WidePatchEnv() {
    std::uint64_t x = 0x243F6A8885A308D3ull;
    for (const synth::TensorSpec& s : specs) {
      v1.emplace_back(synth::tensor_nbytes(s));
      for (std::byte& b : v1.back()) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        b = static_cast<std::byte>(x >> 33);
      }
      total += v1.back().size();
    }
    auto first = source(v1);
    auto f = slot.async_swap(*first, plan, env.mc, env.background, asio::use_future);
    env.get(f);
  }
  /// A source of `data` in chunks of 1000 bytes (they straddle the digest blocks), declaring
  /// `changed` of w as the only ranges that differ from the bytes serving.
  std::unique_ptr<test::VectorSource> source(const std::vector<std::vector<std::byte>>& data,
                                             std::optional<std::vector<io::SelectionRange>> changed = std::nullopt) {
    auto s = std::make_unique<test::VectorSource>(env.ctx.get_executor(), std::size_t{1} << 20, 1000);
    for (std::size_t i = 0; i < specs.size(); ++i) s->add(specs[i].name, specs[i].dtype, specs[i].shape, data[i]);
    if (changed) {
      s->declare_changed("w", std::move(*changed));
      s->declare_changed("b", {});
      s->declare_changed("n", {});
    }
    return s;
  }
  /// The block digests of every tensor of `data`.
  io::Checksums digests(const std::vector<std::vector<std::byte>>& data) const {
    io::Checksums sums;
    for (std::size_t i = 0; i < data.size(); ++i)
      sums.add(specs[i].name, io::DigestKind::xxh3_128_blocks,
               io::digest_hex(io::DigestKind::xxh3_128_blocks, data[i]));
    return sums;
  }
  engine::SwapReport patch(test::VectorSource& from, io::Checksums sums) {
    auto f = slot.async_patch(from, plan, env.background, {.checksums = std::move(sums)}, {}, asio::use_future);
    return env.get(f);
  }
  /// Serves exactly `data`.
  bool serves(const std::vector<std::vector<std::byte>>& data) {
    auto f = slot.async_read(asio::use_future);
    auto reader = env.get(f);
    const WidePlainModel& m = reader.model();
    return std::ranges::equal(m.w.value.bytes(), data[0]) && std::ranges::equal(m.b.value.bytes(), data[1]) &&
           std::ranges::equal(m.n.value.bytes(), data[2]);
  }
};

}  // namespace model_slot_test

TEST_CASE("in-place patch – with block digests kept, a delta hashes only the 64 KiB blocks it changed",
          "[engine][swap][in-place][patch]") {
  WidePatchEnv p;
  constexpr std::size_t B = WidePatchEnv::B;
  // v2 changes w in block 0 and in block 2; v3 changes it across the edge of blocks 1 and 2.
  std::vector<std::vector<std::byte>> v2 = p.v1, v3;
  v2[0][70] ^= std::byte{0x01};
  v2[0][2 * B + 900] ^= std::byte{0x02};
  const std::vector<io::SelectionRange> v2_ranges{{.offset = 64, .length = 64}, {.offset = 2 * B + 896, .length = 64}};
  v3 = v2;
  v3[0][2 * B - 3] ^= std::byte{0x04};
  v3[0][2 * B + 2] ^= std::byte{0x08};
  const std::vector<io::SelectionRange> v3_ranges{{.offset = 2 * B - 64, .length = 128}};

  // The first patch after a swap has no block digests to start from: it hashes every byte, and
  // keeps the blocks' digests it went through.
  auto s2 = p.source(v2, v2_ranges);
  const engine::SwapReport first = p.patch(*s2, p.digests(v2));
  CHECK(first.hashed_bytes == p.total);
  CHECK(s2->delivered() == 128);
  CHECK(first.written_bytes == 128);
  CHECK(p.serves(v2));

  SECTION("the next delta hashes only the two blocks its range touches, and serves every byte") {
    engine::MaterializeProgress progress;
    auto s3 = p.source(v3, v3_ranges);
    auto f = p.slot.async_patch(*s3, p.plan, p.env.background, {.checksums = p.digests(v3), .progress = &progress}, {},
                                asio::use_future);
    const engine::SwapReport r = p.env.get(f);
    CHECK(r.hashed_bytes == 2 * B);  // blocks 1 and 2 of w; b and n unchanged
    CHECK(s3->delivered() == 128);
    CHECK(r.verified_bytes == p.total);
    CHECK(progress.bytes_done == p.total);
    CHECK(p.serves(v3));
    // And the one after it, back to v2, from the digests that patch kept.
    auto back = p.source(v2, v3_ranges);
    CHECK(p.patch(*back, p.digests(v2)).hashed_bytes == 2 * B);
    CHECK(p.serves(v2));
  }
  // A delta the block digests must refuse: checksum_mismatch naming w, and every byte and the
  // generation stay.
  const auto refused = [&](test::VectorSource& from, const io::Checksums& sums) {
    try {
      p.patch(from, sums);
      FAIL("the patch succeeded");
    } catch (const Error& e) {
      INFO(e.what());
      CHECK(e.kind() == errc::checksum_mismatch);
      CHECK(e.context().tensor == "w");
    }
    CHECK(p.serves(v2));
    CHECK(p.slot.generation() == 2);
  };
  SECTION("a sender that leaves a changed range out") {
    auto s3 = p.source(v3, std::vector<io::SelectionRange>{{.offset = 2 * B, .length = 64}});
    refused(*s3, p.digests(v3));
  }
  SECTION("a bit flipped in flight inside a changed range") {
    std::vector<std::vector<std::byte>> flipped = v3;
    flipped[0][2 * B + 40] ^= std::byte{0x10};
    auto s3 = p.source(flipped, v3_ranges);
    refused(*s3, p.digests(v3));
  }
  SECTION("a delta against another base: its kept blocks are not the serving ones") {
    std::vector<std::vector<std::byte>> other = v3;
    other[0][5] ^= std::byte{0x20};  // the sender's base differed here, outside the ranges
    auto s3 = p.source(v3, v3_ranges);
    refused(*s3, p.digests(other));
  }
  SECTION("a swap, or a patch without digests, forgets the block digests: the next patch hashes every byte") {
    auto unchecked = p.source(v3, v3_ranges);
    auto f = p.slot.async_patch(*unchecked, p.plan, p.env.background, asio::use_future);
    p.env.get(f);
    REQUIRE(p.serves(v3));
    auto to_v2 = p.source(v2, v3_ranges);
    CHECK(p.patch(*to_v2, p.digests(v2)).hashed_bytes == p.total);
    auto whole = p.source(v3);
    auto g = p.slot.async_swap(*whole, p.plan, p.env.mc, p.env.background, asio::use_future);
    p.env.get(g);
    auto again = p.source(v2, v3_ranges);
    CHECK(p.patch(*again, p.digests(v2)).hashed_bytes == p.total);
    CHECK(p.serves(v2));
  }
}

TEST_CASE("in-place patch – every failure leaves the serving bytes and generation as they were",
          "[engine][swap][in-place][patch]") {
  PatchEnv p;
  const std::vector<std::byte> before = p.serving();
  auto expect_rejected = [&](errc kind, auto&& run) {
    try {
      run();
      FAIL("the patch succeeded");
    } catch (const Error& e) {
      INFO(e.what());
      CHECK(e.kind() == kind);
    }
    CHECK(p.serving() == before);
    CHECK(p.slot.generation() == 1);
    CHECK_FALSE(p.slot.swapping());
  };
  SECTION("a digest that does not match (a flipped bit in transit)") {
    expect_rejected(errc::checksum_mismatch, [&] { p.patch(*p.source_a2, {.checksums = p.digests(p.a)}); });
  }
  SECTION("more changed bytes than the budget") {
    expect_rejected(errc::exceeds_budget, [&] { p.patch(*p.source_b, {}, {.budget = 4096}); });
  }
  SECTION("a budget one byte short of the patch: its blocks and their bookkeeping") {
    // A2's three changed blocks lie in three chunks of 1000 bytes: a piece of one run each.
    const std::uint64_t patch = 3 * engine::detail::PatchPiece::held(64, 1);
    expect_rejected(errc::exceeds_budget, [&] { p.patch(*p.source_a2, {}, {.budget = patch - 1}); });
    CHECK(p.patch(*p.source_a2, {}, {.budget = patch}).written_bytes == 3 * 64);
    CHECK(p.serving() == PatchEnv::expected(p.a2));
  }
  SECTION("a read error mid-load") {
    p.source_a2->fail_after(3);
    expect_rejected(errc::io_error, [&] { p.patch(*p.source_a2); });
  }
  SECTION("read errors in several readers at once (a file, read by four): the error is still typed") {
    REQUIRE(p.env.source_b->capabilities().concurrency >= 2);
    p.env.faults.on = true;
    expect_rejected(errc::io_error, [&] {
      auto f = p.slot.async_patch(*p.env.source_b, p.plan, p.env.background, asio::use_future);
      p.env.get(f);
    });
  }
  SECTION("the canary rejects the patched model: the old bytes go back before readers return") {
    std::vector<std::byte> seen;
    expect_rejected(errc::canary_failed, [&] {
      p.patch(*p.source_a2, {.canary = [&](const PlainModel& m) -> asio::awaitable<void> {
        seen = m.bytes();
        throw std::runtime_error("bad probe");
        co_return;
      }});
    });
    CHECK(seen == PatchEnv::expected(p.a2));  // it probed the new version
  }
  SECTION("a weight of another shape") {
    auto b = plain_bindings();
    b[2] = WeightBinding::tensor("n", "n", Selection{{{0, 24}}}, 24 * 4);
    WeightBindingPlan narrow(std::move(b));
    expect_rejected(errc::bind_shape_mismatch, [&] { p.patch(*p.source_a2, {}, {}, &narrow); });
  }
  SECTION("a weight a recipe computes, or another aliasing") {
    auto b = plain_bindings();
    b[0] = WeightBinding::from_recipe("w", DerivedWeightRecipe::cast(DerivedWeightRecipe::source("w"), DType::BF16),
                                      64 * 48 * 2);
    WeightBindingPlan computed(std::move(b));
    expect_rejected(errc::invalid_argument, [&] { p.patch(*p.source_a2, {}, {}, &computed); });
    auto c = plain_bindings();
    c[3] = WeightBinding::tensor("b_tied", "b", Selection::all(), 96 * 2);
    WeightBindingPlan untied(std::move(c));
    expect_rejected(errc::invalid_argument, [&] { p.patch(*p.source_a2, {}, {}, &untied); });
  }
}

TEST_CASE("in-place patch – the first version cannot be a patch", "[engine][swap][in-place][patch]") {
  Env env;
  test::VectorSource& source = env.memory_a;
  engine::InPlaceModelSlot<cpu::Backend, PlainModel> slot([] { return PlainModel{}; });
  WeightBindingPlan plan(plain_bindings());
  auto f = slot.async_patch(source, plan, env.background, asio::use_future);
  try {
    env.get(f);
    FAIL("patched an empty model");
  } catch (const Error& e) {
    CHECK(e.kind() == errc::invalid_argument);
  }
  CHECK(slot.generation() == 0);
}

TEST_CASE("in-place patch – concurrent readers never see a mix while patches repeat",
          "[engine][swap][in-place][patch][stress]") {
  PatchEnv p;
  const std::vector<std::byte> want_a = PatchEnv::expected(p.a), want_a2 = PatchEnv::expected(p.a2);
  Readers readers(2, [&]() -> std::optional<bool> {
    auto reader = p.slot.try_read();
    if (!reader) return std::nullopt;
    return reader->model().bytes() == (reader->generation() % 2 == 1 ? want_a : want_a2);
  });
  for (int i = 0; i < 20; ++i) p.patch(i % 2 == 0 ? *p.source_a2 : *p.source_a);
  readers.stop();
  CHECK(readers.mixed() == 0);
  CHECK(readers.reads() > 0);
  CHECK(p.slot.generation() == 21);
}

// The cases every slot shares (conformance/slot_conformance.hpp), for ModelSlot and
// InPlaceModelSlot; DistributedModelSlot's run under mpirun (distributed/test_mpi_swap.cpp).
namespace eredu::test {

/// What both CPU adapters share: the Env above and its two versions.
struct CpuSlotCase {
  using Model = TinyModel;
  using Report = engine::SwapReport;
  Env env;
  io::CheckpointSource& source_a() { return *env.source_a; }
  io::CheckpointSource& source_b() { return *env.source_b; }
  const CpuCheckpoint& checkpoint_a() const { return env.a; }
  const CpuCheckpoint& checkpoint_b() const { return env.b; }
  static std::vector<std::string> tensors() { return {"w", "b", "n"}; }
  template <class T>
  T run(std::future<T>& f) {
    return env.get(f);
  }
  void poll_one() {
    env.ctx.restart();
    env.ctx.poll_one();
  }
  static std::string tag_of(const TinyModel& m) { return m.tag(); }
  static errc cause(const Error& e) { return e.kind(); }
};

/// ModelSlot.
struct DoubleBufferedSlot : CpuSlotCase {
  static constexpr const char* name = "ModelSlot";
  template <class Source, class Token>
  auto async_swap(Source& source, engine::SwapOptions<TinyModel> options, Token&& token) {
    return env.slot.async_swap(source, env.plan, env.mc, std::move(options), std::forward<Token>(token));
  }
  std::uint64_t generation() const { return env.slot.generation(); }
  bool swapping() const { return env.slot.swapping(); }
  std::string tag() const {
    auto v = env.slot.current();
    return v ? v->model.tag() : std::string();
  }
};

/// InPlaceModelSlot.
struct InPlaceSlot : CpuSlotCase {
  static constexpr const char* name = "InPlaceModelSlot";
  InPlace slot{[] { return TinyModel{}; }};
  template <class Source, class Token>
  auto async_swap(Source& source, engine::SwapOptions<TinyModel> options, Token&& token) {
    return slot.async_swap(source, env.plan, env.mc, env.background, std::move(options), std::forward<Token>(token));
  }
  std::uint64_t generation() const { return slot.generation(); }
  bool swapping() const { return slot.swapping(); }
  std::string tag() {
    auto reader = slot.try_read();
    return reader && reader->generation() > 0 ? reader->model().tag() : std::string();
  }
};

/// A slot `Base` whose versions come from memory (Env's VectorSources), not from a file. Its
/// checksums cover the tensors the CPU backend hashes where they land: "w" is cast on the
/// way, so its digest would need a re-read of the file, which a VectorSource cannot serve.
template <class Base>
struct FromMemory : Base {
  test::VectorSource& source_a() { return this->env.memory_a; }
  test::VectorSource& source_b() { return this->env.memory_b; }
  static std::vector<std::string> tensors() { return {"b", "n"}; }
};

/// ModelSlot, from memory.
struct DoubleBufferedSlotFromMemory : FromMemory<DoubleBufferedSlot> {
  static constexpr const char* name = "ModelSlot, from an in-memory source";
};

/// InPlaceModelSlot, from memory.
struct InPlaceSlotFromMemory : FromMemory<InPlaceSlot> {
  static constexpr const char* name = "InPlaceModelSlot, from an in-memory source";
};

}  // namespace eredu::test

#define EREDU_SLOT_ADAPTERS                                                                             \
  eredu::test::DoubleBufferedSlot, eredu::test::InPlaceSlot, eredu::test::DoubleBufferedSlotFromMemory, \
      eredu::test::InPlaceSlotFromMemory
#include "conformance/slot_conformance.hpp"

TEMPLATE_TEST_CASE("slots from an in-memory byte source – the version published is the source's bytes, all or nothing",
                   "[engine][swap][byte_source]", eredu::test::DoubleBufferedSlotFromMemory,
                   eredu::test::InPlaceSlotFromMemory) {
  using namespace eredu::test::slot_conformance;
  TestType slot;
  INFO(TestType::name);
  Env& env = slot.env;
  CHECK(swap(slot, env.memory_a).generation == 1);
  CHECK(env.memory_a.reads() > 0);
  const std::string tag_a = slot.tag();
  CHECK(tag_a == expected_tag(env.a));  // every byte bound is A's, as stored (w cast to F32)

  SECTION("a source that fails mid-load publishes nothing") {
    const std::size_t before = env.memory_b.reads();
    env.memory_b.fail_after(1);
    CHECK(failed_swap(slot, env.memory_b) == errc::io_error);
    CHECK(env.memory_b.reads() == before + 1);  // one read was served: the load was under way
    CHECK(env.memory_b.pool().in_use() == 0);   // and every lease is back
    CHECK(slot.generation() == 1);
    CHECK(slot.tag() == tag_a);  // not a byte of B
    env.memory_b.fail_after(std::nullopt);
  }
  SECTION("checksums that need a re-read of the file are refused before any read") {
    // Right digests, but "w" is cast on the way: only a re-read of its stored bytes checks it.
    io::Checksums sums;
    for (const char* t : {"w", "b", "n"}) sums.add(t, io::sha256_hex(env.b.bytes(t)));
    const std::size_t before = env.memory_b.reads();
    CHECK(failed_swap(slot, env.memory_b, {.checksums = sums}) == errc::invalid_argument);
    CHECK(env.memory_b.reads() == before);
    CHECK(slot.tag() == tag_a);
    // The same digests pass from the checkpoint of the same bytes, which can be re-read.
    CHECK(swap(slot, *env.source_b, {.checksums = sums}).verified_bytes > 0);
    CHECK(slot.tag() == expected_tag(env.b));
    CHECK(swap(slot, env.memory_a).generation == 3);
    CHECK(slot.tag() == tag_a);
  }

  CHECK_FALSE(slot.swapping());
  // Whatever failed, the next swap from memory commits B whole.
  swap(slot, env.memory_b);
  CHECK(slot.tag() == expected_tag(env.b));
}
