// The CUDA backend on a device: bytes on the device equal the checkpoint's, casts and recipes
// equal the CPU backend's bit for bit, a lease is never reused under its copy, out-of-memory
// fails a unit cleanly, many units run at once on several streams, transfer round-trips, and
// every quantized type of ggml's fixture dequantizes to ggml's bits.
// Every case needs a device; where none is present it passes with a WARN saying so.

#include <asio/io_context.hpp>
#include <asio/use_future.hpp>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <future>
#include <thread>
#include <vector>

#include "cpu/cpu_fixture.hpp"
#include "eredu/core/error.hpp"
#include "eredu/core/float_formats.hpp"
#include "eredu/cpu/convert.hpp"
#include "eredu/cuda/backend.hpp"
#include "eredu/cuda/cuda_error.hpp"
#include "eredu/cuda/device.hpp"
#include "eredu/cuda/kernels.hpp"
#include "eredu/engine/description/weight_binding_plan.hpp"
#include "eredu/engine/orchestration/materialize.hpp"
#include "eredu/io/formats/open_catalog.hpp"
#include "gguf/gguf_fixture.hpp"
#include "io/read_fixture.hpp"
#include "support/vector_source.hpp"

using namespace eredu;
using namespace eredu::test;
using engine::DerivedWeightRecipe;
using R = engine::DerivedWeightRecipe;

// Skips the rest of a test case, with the reason in the report, when no device can be used.
#define EREDU_REQUIRE_GPU()                                                  \
  do {                                                                       \
    if (cuda::device_count() == 0) {                                         \
      WARN("no CUDA device (" << cuda::no_device_reason() << "): skipping"); \
      return;                                                                \
    }                                                                        \
  } while (false)

namespace {

/// Tensors of every dtype the kernels handle; the odd u8 tensor puts the others at odd file
/// offsets, so chunk boundaries split elements. FP8 tensors hold every byte pattern.
std::vector<synth::TensorSpec> gpu_specs() {
  return {
      {"odd", DType::U8, {7}},
      {"q", DType::BF16, {8, 16}},
      {"k", DType::BF16, {8, 16}},
      {"v", DType::BF16, {8, 16}},
      {"gate", DType::F32, {4, 6}},
      {"up", DType::F32, {4, 10}},
      {"big", DType::BF16, {300, 257}},
      {"mat", DType::F32, {67, 131}},
      {"cube", DType::F16, {3, 5, 7}},
      {"half", DType::F16, {256, 256}},
      {"e4m3", DType::F8_E4M3, {16, 256}},
      {"e5m2", DType::F8_E5M2, {16, 256}},
      {"e8m0", DType::F8_E8M0, {16, 256}},
  };
}

/// The device's bytes of a completed tensor (a blocking copy: tests only).
std::vector<std::byte> to_host(const cuda::Tensor& t) {
  std::vector<std::byte> out(t.nbytes());
  if (!out.empty()) cuda::check(cudaMemcpy(out.data(), t.data(), out.size(), cudaMemcpyDeviceToHost), "cudaMemcpy");
  return out;
}

/// A checkpoint, a source with a small pool (so reads are chunked), one stream, a device pool
/// and the pinned staging. Declared so that the registration goes before the source.
struct GpuEnv {
  CpuCheckpoint ckpt;
  asio::io_context ctx;
  std::unique_ptr<io::CheckpointSource> source;
  cuda::Executor executor{0};
  cuda::DeviceMemoryPool memory{0, 0};  // device 0, no limit
  cuda::PinnedRegistration pin;
  cuda::MaterializationContext mc{executor, memory, &pin};

  explicit GpuEnv(std::vector<synth::TensorSpec> specs = gpu_specs(),
                  io::SourceOptions options = small_source_options(), std::size_t device_limit = 0)
      : ckpt(std::move(specs)), memory(0, device_limit) {
    source = io::CheckpointSource::open(ctx.get_executor(), ckpt.path, options);
    pin = cuda::pin_staging(*source);
  }
  cuda::Tensor finish(cuda::Materialization m) {
    drive_until(ctx, m.done);
    return cuda::Backend::finish_materialization(std::move(m));
  }
  cuda::Tensor read(const io::TensorReadRequest& request) {
    return finish(cuda::Backend::materialize(*source, request, mc, {}));
  }
  cuda::Tensor run(const DerivedWeightRecipe& recipe) {
    return finish(cuda::Backend::materialize_recipe(*source, recipe, mc, {}));
  }
  /// Runs a future-returning operation's loop until it is ready.
  template <class T>
  T drive(std::future<T>& f) {
    return run_until_ready(ctx, f);
  }
};

std::uint64_t bytes_of(DType t, const Shape& s) { return *checked_byte_size(*checked_element_count(s), t); }

}  // namespace

TEST_CASE("cuda backend – whole and selected tensors land on the device byte for byte", "[cuda][gpu]") {
  EREDU_REQUIRE_GPU();
  GpuEnv env;
  for (const auto& spec : env.ckpt.specs) {
    INFO(spec.name);
    io::TensorReadRequest whole{spec.name};
    cuda::Tensor t = env.read(whole);
    CHECK(t.dtype() == spec.dtype);
    CHECK(t.shape() == spec.shape);
    CHECK(to_host(t) == env.ckpt.bytes(spec.name));
  }
  const auto& big = env.ckpt.spec("big");
  for (const Selection& sel :
       {Selection{{{10, 290}, {0, 257}}}, Selection{{{0, 300}, {100, 101}}}, Selection{{{299, 300}, {3, 250}}}}) {
    io::TensorReadRequest request{"big", sel};
    cuda::Tensor t = env.read(request);
    CHECK(to_host(t) == select_bytes(env.ckpt.bytes("big"), big.shape, big.dtype, sel));
  }
  CHECK(env.source->pool().in_use() == 0);
}

TEST_CASE("cuda backend – casts and recipes equal the CPU backend bit for bit", "[cuda][gpu]") {
  EREDU_REQUIRE_GPU();
  GpuEnv env;
  cpu::Executor cpu_executor(2);
  cpu::StoragePool storage;
  cpu::MaterializationContext cpu_mc{cpu_executor, storage};
  const std::vector<DerivedWeightRecipe> recipes = {
      R::cast(R::source("big"), DType::F32),
      R::cast(R::source("big"), DType::F16),
      R::cast(R::source("half"), DType::BF16),
      R::cast(R::source("half"), DType::F32),
      R::cast(R::source("mat"), DType::BF16),
      R::cast(R::source("mat"), DType::F16),
      R::cast(R::source("e4m3"), DType::F32),
      R::cast(R::source("e4m3"), DType::BF16),
      R::cast(R::source("e5m2"), DType::F32),
      R::cast(R::source("e5m2"), DType::BF16),
      R::cast(R::source("e8m0"), DType::F32),
      R::cast(R::source("e8m0"), DType::BF16),
      R::concat({R::source("q"), R::source("k"), R::source("v")}, 0),
      R::concat({R::source("q"), R::source("k"), R::source("v")}, 1),
      R::concat({R::source("gate"), R::source("up")}, 1),
      R::slice(R::source("big"), 1, {5, 200}),
      R::slice(R::source("big"), 0, {7, 150}),
      R::slice(R::cast(R::source("mat"), DType::BF16), 1, {3, 100}),
      R::transpose(R::source("mat")),
      R::transpose(R::source("big")),
      R::permute(R::source("cube"), {2, 0, 1}),
      R::permute(R::source("cube"), {1, 2, 0}),
      R::cast(R::concat({R::source("q"), R::source("k")}, 1), DType::F32),
      R::transpose(R::cast(R::source("e4m3"), DType::BF16)),
      R::reshape(R::source("big"), {257, 300}),
  };
  for (const auto& recipe : recipes) {
    INFO(recipe.to_string());
    cuda::Tensor gpu = env.run(recipe);
    cpu::Tensor cpu = finish(env.ctx, cpu::Backend::materialize_recipe(*env.source, recipe, cpu_mc, {}));
    CHECK(gpu.dtype() == cpu.dtype());
    CHECK(gpu.shape() == cpu.shape());
    CHECK(to_host(gpu) == to_vector(cpu.bytes()));
  }
  CHECK(env.source->pool().in_use() == 0);
}

TEST_CASE("cuda backend – a lease is never released before the copy that reads it has completed",
          "[cuda][gpu][lease]") {
  EREDU_REQUIRE_GPU();
  // A 64 KiB pool of 16 KiB chunks: every tensor reuses the same few staging blocks. If a lease
  // went back to the pool when its copy was *queued*, the next read would overwrite the bytes
  // while the copy, held back by the sleeping kernel, had not read them yet.
  io::SourceOptions options = small_source_options(std::size_t{64} << 10);
  options.chunk_bytes = std::size_t{16} << 10;
  GpuEnv env(gpu_specs(), options);
  Completion hold = env.executor.enqueue([](cudaStream_t s) { cuda::check(cuda::launch_sleep(s, 300'000), "sleep"); });
  std::vector<cuda::Materialization> in_flight;
  for (const char* name : {"big", "half", "mat", "e4m3"}) {
    io::TensorReadRequest request{name};
    in_flight.push_back(cuda::Backend::materialize(*env.source, request, env.mc, {}));
  }
  // While the copies are held back, the pool fills and the reads wait: nothing completes.
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(100);
  while (std::chrono::steady_clock::now() < until) {
    env.ctx.restart();
    env.ctx.run_one_for(std::chrono::milliseconds(5));
  }
  CHECK_FALSE(hold.ready());
  for (const auto& m : in_flight) CHECK_FALSE(m.done.ready());
  CHECK(env.source->pool().in_use() > 0);
  const char* names[] = {"big", "half", "mat", "e4m3"};
  for (std::size_t i = 0; i < in_flight.size(); ++i) {
    INFO(names[i]);
    cuda::Tensor t = env.finish(std::move(in_flight[i]));
    CHECK(to_host(t) == env.ckpt.bytes(names[i]));
  }
  CHECK(env.source->pool().in_use() == 0);
  CHECK(env.source->pool().high_water() <= env.source->pool().budget());
}

TEST_CASE("cuda memory pool – the limit refuses what does not fit and counts freed blocks back", "[cuda][gpu][oom]") {
  EREDU_REQUIRE_GPU();
  const std::size_t mib = std::size_t{1} << 20;
  cuda::DeviceMemoryPool memory(0, 16 * mib);
  const auto stream = std::make_shared<const cuda::Stream>(0);
  auto a = memory.allocate(12 * mib, stream, "a");
  try {
    (void)memory.allocate(8 * mib, stream, "b");
    FAIL("8 MiB fit beside 12 MiB in a 16 MiB pool");
  } catch (const Error& e) {
    CHECK(e.kind() == errc::out_of_memory);
    CHECK_THAT(e.what(), Catch::Contains("12582912 of 16777216 in use"));
  }
  CHECK_THROWS_AS(memory.allocate(17 * mib, stream, "c"), Error);
  a.reset();  // queued free: its bytes count back at once
  auto whole = memory.allocate(16 * mib, stream, "d");
  CHECK(whole->size() == 16 * mib);
  CHECK_THROWS_AS(memory.allocate(1, stream, "e"), Error);
  whole.reset();
  cuda::check(cudaStreamSynchronize(stream->get()), "cudaStreamSynchronize");
  CHECK(memory.used_bytes() == 0);
}

TEST_CASE("cuda backend – out of device memory fails the unit cleanly: nothing published, all returned",
          "[cuda][gpu][oom]") {
  EREDU_REQUIRE_GPU();
  // Eight 4 MiB tensors into a pool limited to 16 MiB.
  std::vector<synth::TensorSpec> specs;
  for (int i = 0; i < 8; ++i) specs.push_back({"w" + std::to_string(i), DType::F32, {1024, 1024}});
  GpuEnv env(specs, small_source_options(std::size_t{4} << 20), std::size_t{16} << 20);
  std::vector<engine::WeightBinding> bindings;
  for (int i = 0; i < 8; ++i)
    bindings.push_back(engine::WeightBinding::tensor("layers." + std::to_string(i) + ".weight", "w" + std::to_string(i),
                                                     Selection::all(), bytes_of(DType::F32, {1024, 1024})));
  engine::WeightBindingPlan plan(std::move(bindings));
  auto done = engine::async_materialize<cuda::Backend>(*env.source, plan, env.mc, asio::use_future);
  try {
    env.drive(done);
    FAIL("a 32 MiB unit fit into a 16 MiB pool");
  } catch (const Error& e) {
    CHECK(e.kind() == errc::out_of_memory);
    CHECK_THAT(e.what(), Catch::Contains("device memory pool limit") && Catch::Contains("16777216"));
  }
  CHECK(env.source->pool().in_use() == 0);
  env.executor.fence().get();  // the frees are stream-ordered: let them run
  CHECK(env.memory.used_bytes() == 0);
}

TEST_CASE("cuda backend – many units at once on several streams", "[cuda][gpu][concurrency]") {
  EREDU_REQUIRE_GPU();
  GpuEnv env(gpu_specs(), small_source_options(std::size_t{512} << 10));
  auto lanes = cuda::Backend::fork_executors(env.executor, 4);
  REQUIRE(lanes.size() == 4);
  std::vector<cuda::MaterializationContext> contexts;
  for (auto& lane : lanes) contexts.push_back({*lane, env.memory, &env.pin});
  std::vector<engine::WeightBinding> bindings;
  for (const auto& spec : env.ckpt.specs)
    bindings.push_back(
        engine::WeightBinding::tensor("t." + spec.name, spec.name, Selection::all(), bytes_of(spec.dtype, spec.shape)));
  engine::WeightBindingPlan plan(std::move(bindings));
  std::vector<std::future<engine::MaterializedUnit<cuda::Backend>>> units;
  for (int round = 0; round < 3; ++round)
    for (auto& c : contexts)
      units.push_back(engine::async_materialize<cuda::Backend>(*env.source, plan, c, asio::use_future));
  for (auto& u : units) {
    auto unit = env.drive(u);
    for (const auto& spec : env.ckpt.specs) {
      const cuda::Tensor* t = unit.find(engine::ParameterId("t." + spec.name));
      REQUIRE(t != nullptr);
      CHECK(to_host(*t) == env.ckpt.bytes(spec.name));
    }
  }
  CHECK(env.source->pool().in_use() == 0);
}

TEST_CASE("cuda backend – demote then promote round-trips a weight through pinned host memory",
          "[cuda][gpu][transfer]") {
  EREDU_REQUIRE_GPU();
  GpuEnv env;
  io::TensorReadRequest request{"big"};
  cuda::Tensor t = env.read(request);
  auto [host, demoted] = cuda::Backend::demote(env.executor, t);
  demoted.get();
  CHECK(to_vector(host.bytes()) == env.ckpt.bytes("big"));
  auto [back, promoted] = cuda::Backend::promote(env.executor, host);
  promoted.get();
  CHECK(back.dtype() == t.dtype());
  CHECK(back.shape() == t.shape());
  CHECK_FALSE(back.shares_storage_with(t));
  CHECK(to_host(back) == env.ckpt.bytes("big"));
}

TEST_CASE("cuda executor – order_after holds work until a completion, and orders streams on the device",
          "[cuda][gpu][executor]") {
  EREDU_REQUIRE_GPU();
  cuda::Executor ex(0);
  CompletionSource gate;
  cuda::Backend::order_after(gate.completion(), ex);
  std::atomic<bool> ran{false};
  Completion later = ex.enqueue([&](cudaStream_t) { ran = true; });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  CHECK_FALSE(ran);
  CHECK_FALSE(later.ready());
  gate.complete();
  later.get();
  CHECK(ran);

  // A failed predecessor fails what is ordered after it; nothing runs.
  cuda::Executor failing(0);
  failing.order_after(Completion::failed(std::make_exception_ptr(Error(errc::backend_failure, {}, "upstream"))));
  std::atomic<bool> ran_after_failure{false};
  Completion skipped = failing.enqueue([&](cudaStream_t) { ran_after_failure = true; });
  CHECK_THROWS_WITH(skipped.get(), Catch::Contains("upstream"));
  CHECK_FALSE(ran_after_failure);

  // Device-side ordering: b's copy waits for a's sleep, so it sees a's write.
  auto lanes = cuda::Backend::fork_executors(ex, 2);
  cuda::DeviceMemoryPool memory(0);
  cuda::Tensor buf = cuda::Tensor::allocate(memory, DType::U8, {4}, lanes[0]->shared_stream());
  cuda::HostBuffer host(DType::U8, {4}, 4);
  lanes[0]->enqueue([&](cudaStream_t s) {
    cuda::check(cuda::launch_sleep(s, 50'000), "sleep");
    cuda::check(cudaMemsetAsync(buf.data(), 0x5A, 4, s), "cudaMemsetAsync");
  });
  lanes[1]->order_after(*lanes[0]);
  Completion copied = lanes[1]->enqueue([&](cudaStream_t s) {
    cuda::check(cudaMemcpyAsync(host.bytes().data(), buf.data(), 4, cudaMemcpyDeviceToHost, s), "cudaMemcpyAsync");
  });
  copied.get();
  for (std::byte b : host.bytes()) CHECK(b == std::byte{0x5A});
  lanes[0]->fence().get();
}

TEST_CASE("cuda executor – retain_until_complete keeps device memory until its work completes",
          "[cuda][gpu][executor]") {
  EREDU_REQUIRE_GPU();
  cuda::Executor ex(0);
  cuda::DeviceMemoryPool memory(0);
  std::weak_ptr<cuda::DeviceAllocation> watch;
  Completion c;
  {
    cuda::Tensor t = cuda::Tensor::allocate(memory, DType::F32, {1024}, ex.shared_stream());
    watch = t.storage();
    c = ex.enqueue([](cudaStream_t s) { cuda::check(cuda::launch_sleep(s, 50'000), "sleep"); });
    cuda::Backend::retain_until_complete(ex, c, t);
  }
  CHECK_FALSE(watch.expired());
  c.get();
  for (int i = 0; i < 1000 && !watch.expired(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  CHECK(watch.expired());
}

TEST_CASE("cuda backend – dequantizes every type of ggml's fixture to ggml's own bits, f32, bf16 and f16",
          "[cuda][gpu][gguf]") {
  EREDU_REQUIRE_GPU();
  const std::filesystem::path dir = gguf_quant_dir();
  if (dir.empty()) {
    WARN("no ../shared/data/gguf-quant: skipping");
    return;
  }
  const std::string ref_path = (dir / "quant-types.dequant.safetensors").string();
  const io::Catalog reference = io::open_catalog(ref_path);
  // The source before the registration of its staging, so that the registration goes first.
  asio::io_context ctx;
  const auto source = io::CheckpointSource::open(ctx.get_executor(), dir / "quant-types.gguf", small_source_options());
  cuda::Executor executor{0};
  cuda::DeviceMemoryPool memory{0, 0};  // device 0, no limit
  cuda::PinnedRegistration pin = cuda::pin_staging(*source);
  cuda::MaterializationContext mc{executor, memory, &pin};
  int types = 0;
  for (const io::TensorInfo& t : source->catalog().tensors()) {
    if (!dtype_is_quantized(t.dtype)) continue;
    INFO(t.name << " " << dtype_name(t.dtype));
    const io::TensorInfo& r = reference.at(t.name);
    const std::vector<std::byte> f32 = read_range(ref_path, r.offset, r.nbytes);
    for (DType to : {DType::F32, DType::BF16, DType::F16}) {
      INFO(dtype_name(to));
      std::vector<std::byte> expected = f32;
      if (to != DType::F32) {
        // One rounding of ggml's f32, as the CPU backend's kernels do.
        expected.resize(f32.size() / 2);
        for (std::size_t i = 0; i < f32.size() / 4; ++i) {
          std::uint32_t bits;
          std::memcpy(&bits, f32.data() + 4 * i, 4);
          const std::uint16_t h = to == DType::BF16 ? formats::f32_to_bf16(bits) : formats::f32_to_f16(bits);
          std::memcpy(expected.data() + 2 * i, &h, 2);
        }
      }
      cuda::Materialization m = cuda::Backend::materialize_recipe(*source, R::cast(R::source(t.name), to), mc, {});
      drive_until(ctx, m.done);
      const cuda::Tensor gpu = cuda::Backend::finish_materialization(std::move(m));
      CHECK(gpu.shape() == t.shape);
      CHECK(to_host(gpu) == expected);
    }
    ++types;
  }
  CHECK(types == 22);
  CHECK(source->pool().in_use() == 0);
}

// The CUDA backend needs no change for a source that is not a file: materialize and
// materialize_recipe are templates on io::ByteSource, like the CPU backend's.
static_assert(engine::ParameterBackend<cuda::Backend, test::VectorSource>);

TEST_CASE("cuda backend – weights from an in-memory byte source, kept, selected and cast", "[cuda][gpu]") {
  EREDU_REQUIRE_GPU();
  const std::vector<synth::TensorSpec> specs{{"w", DType::F32, {64, 48}}, {"h", DType::BF16, {40, 33}}};
  const std::vector<std::vector<std::byte>> data = test::random_tensor_bytes(specs, 5);
  asio::io_context ctx;
  // Chunks of 1000 bytes split elements: the cast's kernel gets units carried across chunks.
  test::VectorSource memory(ctx.get_executor(), std::size_t{1} << 20, 1000);
  for (std::size_t i = 0; i < specs.size(); ++i) memory.add(specs[i].name, specs[i].dtype, specs[i].shape, data[i]);
  cuda::Executor executor{0};
  cuda::DeviceMemoryPool device_memory{0, 0};
  cuda::PinnedRegistration pin = cuda::pin_staging(memory.pool());
  cuda::MaterializationContext mc{executor, device_memory, &pin};
  auto finish = [&](cuda::Materialization m) {
    drive_until(ctx, m.done);
    return cuda::Backend::finish_materialization(std::move(m));
  };

  const cuda::Tensor w = finish(cuda::Backend::materialize(memory, io::TensorReadRequest{"w"}, mc, {}));
  CHECK(to_host(w) == data[0]);
  const Selection sel{{{3, 40}, {8, 20}}};
  const cuda::Tensor part = finish(cuda::Backend::materialize(memory, io::TensorReadRequest{"w", sel}, mc, {}));
  CHECK(to_host(part) == test::select_bytes(data[0], specs[0].shape, DType::F32, sel));
  const cuda::Tensor h = finish(cuda::Backend::materialize_recipe(
      memory, DerivedWeightRecipe::cast(DerivedWeightRecipe::source("h"), DType::F32), mc, {}));
  std::vector<std::byte> expected(data[1].size() * 2);
  cpu::convert_serial(DType::BF16, DType::F32, data[1], expected);
  CHECK(to_host(h) == expected);
  CHECK(memory.pool().in_use() == 0);
}
