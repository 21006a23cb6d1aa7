// The CPU backend: storage pool, executor, materialization (direct, cast, recipes), transfer.

#include <sys/resource.h>
#include <tbb/task_arena.h>
#include <tbb/task_group.h>

#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <fstream>
#include <mutex>
#include <new>
#include <optional>
#include <sstream>
#include <string>
#include <thread>

#include "cpu/cpu_fixture.hpp"
#include "eredu/core/error.hpp"
#include "eredu/cpu/convert.hpp"
#include "eredu/cpu/layout.hpp"
#include "eredu/engine/orchestration/engine_error.hpp"

#include <fmt/format.h>

using namespace eredu;
using namespace eredu::test;
using engine::DerivedWeightRecipe;

namespace {

/// A checkpoint whose odd-sized u8 tensor puts every later tensor at an odd file offset, so
/// chunk boundaries (aligned on file offsets) split elements.
std::vector<synth::TensorSpec> mixed_specs() {
  return {
      {"odd", DType::U8, {7}},          {"q", DType::BF16, {8, 16}},     {"k", DType::BF16, {8, 16}},
      {"v", DType::BF16, {8, 16}},      {"gate", DType::F32, {4, 6}},    {"up", DType::F32, {4, 10}},
      {"big", DType::BF16, {300, 257}},  // ~150 KiB: several 64 KiB chunks
      {"mat", DType::F32, {67, 131}},   {"cube", DType::F16, {3, 5, 7}},
  };
}

struct Env {
  CpuCheckpoint ckpt{mixed_specs()};
  asio::io_context ctx;
  std::unique_ptr<io::CheckpointSource> source;
  cpu::Executor executor{2};
  cpu::StoragePool storage;
  cpu::MaterializationContext mc{executor, storage};

  explicit Env(io::SourceOptions options = small_source_options()) {
    source = io::CheckpointSource::open(ctx.get_executor(), ckpt.path, options);
  }
  cpu::Tensor run(const DerivedWeightRecipe& recipe) {
    return finish(ctx, cpu::Backend::materialize_recipe(*source, recipe, mc, {}));
  }
  cpu::Tensor read(const io::TensorReadRequest& request) {
    return finish(ctx, cpu::Backend::materialize(*source, request, mc, {}));
  }
};

std::vector<std::byte> converted(DType from, DType to, const std::vector<std::byte>& in) {
  std::vector<std::byte> out(in.size() / (dtype_bits(from) / 8) * (dtype_bits(to) / 8));
  cpu::convert_serial(from, to, in, out);
  return out;
}

/// The VmFlags line of the mapping that holds `p` in /proc/self/smaps ("rd wr mr ... nh"), or
/// nothing when the kernel does not report them.
std::optional<std::string> vm_flags_at(const void* p) {
  std::ifstream smaps("/proc/self/smaps");
  const auto addr = reinterpret_cast<std::uintptr_t>(p);
  bool inside = false;
  for (std::string line; std::getline(smaps, line);) {
    std::uintptr_t lo = 0, hi = 0;
    char dash = 0;
    std::istringstream range(line);
    if (range >> std::hex >> lo >> dash >> hi && dash == '-') {
      inside = lo <= addr && addr < hi;
    } else if (inside && line.rfind("VmFlags:", 0) == 0) {
      return line.substr(8) + " ";
    }
  }
  return std::nullopt;
}

}  // namespace

TEST_CASE("storage pool – large blocks get the pages asked for: 4 KiB by default, huge on request", "[cpu][storage]") {
  const int probe = 0;
  if (!vm_flags_at(&probe)) {
    WARN("this kernel's /proc/self/smaps has no VmFlags: the advice cannot be observed, skipping");
    return;
  }
  // A kernel built without THP refuses both kinds of advice (EINVAL) and shows neither.
  if (!std::ifstream("/sys/kernel/mm/transparent_hugepage/enabled").good()) {
    WARN("no transparent huge pages in this kernel: there is no page advice to check, skipping");
    return;
  }
  for (cpu::StoragePages pages : {cpu::StoragePages::small, cpu::StoragePages::huge}) {
    cpu::StoragePool pool(pages == cpu::StoragePages::small ? cpu::StoragePoolOptions{}
                                                            : cpu::StoragePoolOptions{.pages = pages});
    cpu::StorageBlock b = pool.allocate(std::size_t{4} << 20);
    const std::optional<std::string> flags = vm_flags_at(b.data());
    REQUIRE(flags);
    INFO("VmFlags:" << *flags);
    // "nh": MADV_NOHUGEPAGE; "hg": MADV_HUGEPAGE.
    CHECK((flags->find(" nh ") != std::string::npos) == (pages == cpu::StoragePages::small));
    CHECK((flags->find(" hg ") != std::string::npos) == (pages == cpu::StoragePages::huge));
  }
}

TEST_CASE("storage pool – large blocks are 2 MiB aligned, recycled populated, trimmed", "[cpu][storage]") {
  cpu::StoragePool pool;
  std::byte* first = nullptr;
  {
    cpu::StorageBlock b = pool.allocate(3 << 20);
    REQUIRE(b);
    CHECK(b.size() == std::size_t{3} << 20);
    CHECK(reinterpret_cast<std::uintptr_t>(b.data()) % (2 << 20) == 0);
    CHECK(b.fresh());
    cpu::Executor ex(2);
    ex.run_blocking([&] { cpu::StoragePool::populate(b); });
    CHECK_FALSE(b.fresh());
    b.bytes()[12345] = std::byte{7};
    first = b.data();
    CHECK(pool.stats().live_bytes == std::size_t{3} << 20);  // whole pages, not whole huge pages
  }
  CHECK(pool.stats().retained_bytes == std::size_t{3} << 20);
  cpu::StorageBlock again = pool.allocate((3 << 20) - 5);  // same size class (4 KiB pages)
  CHECK(again.data() == first);
  CHECK_FALSE(again.fresh());
  CHECK(pool.stats().recycled_allocations == 1);
  cpu::StorageBlock other = pool.allocate(100);  // small: aligned, never "fresh"
  CHECK(reinterpret_cast<std::uintptr_t>(other.data()) % 64 == 0);
  CHECK_FALSE(other.fresh());
  again = cpu::StorageBlock();
  CHECK(pool.stats().retained_bytes == std::size_t{3} << 20);
  pool.trim();
  CHECK(pool.stats().retained_bytes == 0);
}

TEST_CASE("storage pool – a never-populated block and blocks over the retention limit go back", "[cpu][storage]") {
  cpu::StoragePool pool({.max_retained_bytes = std::size_t{1} << 20});
  { auto fresh = pool.allocate(std::size_t{2} << 20); }
  CHECK(pool.stats().retained_bytes == 0);  // not populated: nothing to gain by keeping it
  {
    auto b = pool.allocate(std::size_t{2} << 20);
    b.mark_populated();
  }
  CHECK(pool.stats().retained_bytes == 0);  // over the 1 MiB limit
  CHECK(pool.stats().live_bytes == 0);
}

TEST_CASE("storage pool – a reservation serves fresh blocks with no mapping of their own, and its rest goes back",
          "[cpu][storage]") {
  const std::size_t mib = std::size_t{1} << 20;
  cpu::StoragePool pool;
  pool.reserve(10 * mib);
  CHECK(pool.stats().reserved_bytes == 10 * mib);
  cpu::StorageBlock a = pool.allocate(3 * mib);
  cpu::StorageBlock b = pool.allocate(3 * mib + 5);  // size class: 3 MiB + one page
  CHECK(b.data() == a.data() + 3 * mib);             // carved one after the other
  CHECK(a.fresh());
  CHECK(pool.stats().reserved_allocations == 2);
  CHECK(pool.stats().fresh_allocations == 2);
  CHECK(pool.stats().reserved_bytes == 4 * mib - 4096);
  if (const std::optional<std::string> flags = vm_flags_at(a.data());
      flags && std::ifstream("/sys/kernel/mm/transparent_hugepage/enabled").good())
    CHECK(flags->find(" nh ") != std::string::npos);  // 4 KiB pages, as a block mapped alone
  std::fill(a.bytes().begin(), a.bytes().end(), std::byte{1});
  std::fill(b.bytes().begin(), b.bytes().end(), std::byte{2});
  CHECK(a.bytes().back() == std::byte{1});
  CHECK(b.bytes().front() == std::byte{2});
  // Larger than the rest: mapped on its own, 2 MiB aligned; the rest stays for smaller ones.
  cpu::StorageBlock c = pool.allocate(8 * mib);
  CHECK(reinterpret_cast<std::uintptr_t>(c.data()) % (2 * mib) == 0);
  CHECK(pool.stats().reserved_allocations == 2);
  cpu::StorageBlock d = pool.allocate(mib);
  CHECK(d.data() == b.data() + 3 * mib + 4096);
  CHECK(pool.stats().reserved_allocations == 3);
  // A carved block goes back like any other: populated ones retained, fresh ones unmapped.
  a.mark_populated();
  a = cpu::StorageBlock();
  b = cpu::StorageBlock();
  CHECK(pool.stats().retained_bytes == 3 * mib);
  // A new reservation counts the retained blocks as served and replaces the old rest.
  pool.reserve(5 * mib);
  CHECK(pool.stats().reserved_bytes == 2 * mib);
  pool.trim();
  CHECK(pool.stats().reserved_bytes == 0);
  CHECK(pool.stats().retained_bytes == 0);
  cpu::StorageBlock e = pool.allocate(mib);
  CHECK(pool.stats().reserved_allocations == 3);  // nothing reserved any more
}

TEST_CASE("storage pool – huge pages and tiny units reserve nothing", "[cpu][storage]") {
  cpu::StoragePool huge({.pages = cpu::StoragePages::huge});
  huge.reserve(std::uint64_t{64} << 20);
  CHECK(huge.stats().reserved_bytes == 0);  // carving would break the blocks' 2 MiB alignment
  cpu::StoragePool pool;
  pool.reserve(1000);  // below one mapped block
  CHECK(pool.stats().reserved_bytes == 0);
  pool.reserve(std::uint64_t{1} << 60);  // beyond any address space: refused quietly
  CHECK(pool.stats().reserved_bytes == 0);
  CHECK(pool.allocate(std::size_t{1} << 20));
}

TEST_CASE("executor – completions, errors, order_after, fence and retention", "[cpu][executor]") {
  cpu::Executor ex(2);
  std::atomic<int> ran{0};
  Completion ok = ex.submit([&] { ran += 1; });
  ok.get();
  CHECK(ran == 1);

  Completion bad = ex.submit([] { throw Error(errc::backend_failure, {}, "kernel failed"); });
  CHECK_THROWS_WITH(bad.get(), Catch::Contains("kernel failed"));

  // Work ordered after a pending completion does not start before it.
  CompletionSource gate;
  ex.order_after(gate.completion());
  Completion later = ex.submit([&] { ran += 10; });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  CHECK_FALSE(later.ready());
  CHECK(ran == 1);
  gate.complete();
  later.get();
  CHECK(ran == 11);

  // A failed predecessor fails the work ordered after it, which never runs.
  auto lanes = cpu::Backend::fork_executors(ex, 2);
  REQUIRE(lanes.size() == 2);
  CompletionSource failing;
  cpu::Backend::order_after(failing.completion(), *lanes[0]);
  Completion skipped = lanes[0]->submit([&] { ran += 100; });
  failing.fail(std::make_exception_ptr(Error(errc::io_error, {}, "EIO")));
  CHECK_THROWS_AS(skipped.get(), Error);
  CHECK(ran == 11);

  // retain_until_complete keeps a value exactly until the completion.
  auto alive = std::make_shared<int>(5);
  std::weak_ptr<int> watch = alive;
  CompletionSource hold;
  cpu::Backend::retain_until_complete(*lanes[1], hold.completion(), std::move(alive));
  CHECK_FALSE(watch.expired());
  hold.complete();
  CHECK(watch.expired());

  Completion fenced = cpu::Backend::submit(ex);
  fenced.wait();
  CHECK_FALSE(static_cast<bool>(fenced.error()));
}

TEST_CASE("materialize – checkpoint dtype kept: bytes land in the tensor, whole or selected", "[cpu][materialize]") {
  Env env;
  for (const char* name : {"q", "gate", "big", "cube", "odd"}) {
    io::TensorReadRequest r{name};
    cpu::Tensor t = env.read(r);
    CHECK(t.dtype() == env.ckpt.spec(name).dtype);
    CHECK(t.shape() == env.ckpt.spec(name).shape);
    CHECK(to_vector(t.bytes()) == env.ckpt.bytes(name));
  }
  const auto& big = env.ckpt.spec("big");
  for (Selection sel : {Selection::rows(big.shape, 10, 120), Selection::columns(big.shape, 3, 200)}) {
    io::TensorReadRequest r{"big", sel};
    cpu::Tensor t = env.read(r);
    CHECK(t.shape() == sel.selected_shape(big.shape));
    CHECK(to_vector(t.bytes()) == select_bytes(env.ckpt.bytes("big"), big.shape, DType::BF16, sel));
  }
  CHECK(env.source->pool().high_water() == 0);  // no staging: read straight into the tensor
  io::TensorReadRequest missing{"nope"};
  CHECK_THROWS_AS(cpu::Backend::materialize(*env.source, missing, env.mc, {}), Error);
}

TEST_CASE("materialize – a cold tensor at an unaligned offset is read O_DIRECT with its page window, in place",
          "[cpu][materialize][direct]") {
  // 16 bytes first: every tensor after it starts inside a page, aligned for its elements.
  CpuCheckpoint ckpt({{"pad", DType::U8, {16}},
                      {"big", DType::BF16, {300, 257}},
                      {"wide", DType::F32, {40, 1000}},
                      {"small", DType::F32, {100}},
                      {"tail", DType::F16, {150, 333}}});
  asio::io_context ctx;
  io::SourceOptions options = small_source_options();
  options.reader.direct = io::DirectMode::on;  // as a file not in the page cache is read
  std::unique_ptr<io::CheckpointSource> source;
  try {
    source = io::CheckpointSource::open(ctx.get_executor(), ckpt.path, options);
  } catch (const Error& e) {
    if (e.kind() != errc::direct_io_unsupported) throw;
    WARN("O_DIRECT is unsupported on this file system, so no window is read: " << e.what());
    return;
  }
  cpu::Executor executor(2);
  cpu::StoragePool storage;
  for (bool windows : {true, false}) {
    INFO("read_cold_windows " << windows);
    cpu::MaterializationContext mc{executor, storage};
    mc.read_cold_windows = windows;
    const std::uint64_t aligned_before = source->alignment_bytes();
    for (const char* name : {"big", "wide", "small", "tail"}) {
      INFO(name);
      const io::TensorInfo& info = source->catalog().at(name);
      REQUIRE(info.offset % 4096 != 0);
      cpu::Tensor t = finish(ctx, cpu::Backend::materialize(*source, io::TensorReadRequest{name}, mc, {}));
      CHECK(to_vector(t.bytes()) == ckpt.bytes(name));
      const auto at = reinterpret_cast<std::uintptr_t>(t.bytes().data());
      if (windows && info.nbytes >= 64 * 1024) {
        // Laid out like the file: the tensor's first byte sits where the file puts it in a page.
        CHECK(at % 4096 == info.offset % 4096);
        CHECK(t.storage()->allocation().size() % 4096 == 0);
      } else {
        CHECK(at % 64 == 0);  // a plain block (a small tensor is not worth a window)
      }
    }
    if (windows) {
      CHECK(source->alignment_bytes() > aligned_before);
    } else {
      CHECK(source->alignment_bytes() == aligned_before);
    }
  }
  // A window's block goes back to the pool whole and is reused as plain storage.
  CHECK(storage.stats().live_bytes == 0);
  CHECK(storage.stats().retained_bytes > 0);
  const cpu::StoragePoolStats before = storage.stats();
  cpu::MaterializationContext mc{executor, storage};
  options.reader.direct = io::DirectMode::automatic;
  auto hot = io::CheckpointSource::open(ctx.get_executor(), ckpt.path, options);
  // The file was just written and read: its pages are in the page cache, so no window.
  CHECK_FALSE(hot->direct_window(io::TensorReadRequest{"big"}));
  cpu::Tensor again = finish(ctx, cpu::Backend::materialize(*hot, io::TensorReadRequest{"big"}, mc, {}));
  CHECK(to_vector(again.bytes()) == ckpt.bytes("big"));
  CHECK(reinterpret_cast<std::uintptr_t>(again.bytes().data()) % 64 == 0);
  CHECK(storage.stats().recycled_allocations > before.recycled_allocations);
}

TEST_CASE("materialize – a cast streams bounded chunks, converts each, splits elements correctly",
          "[cpu][materialize]") {
  io::SourceOptions options = small_source_options();
  options.map_resident = false;  // the staged path, which a file not in the page cache takes
  Env env(options);
  for (auto [name, from, to] : {std::tuple{"big", DType::BF16, DType::F32}, std::tuple{"mat", DType::F32, DType::BF16},
                                std::tuple{"cube", DType::F16, DType::F32}, std::tuple{"q", DType::BF16, DType::F16}}) {
    INFO(name);
    cpu::Tensor t = env.run(DerivedWeightRecipe::cast(DerivedWeightRecipe::source(name), to));
    CHECK(t.dtype() == to);
    CHECK(t.shape() == env.ckpt.spec(name).shape);
    CHECK(to_vector(t.bytes()) == converted(from, to, env.ckpt.bytes(name)));
  }
  CHECK(env.source->pool().high_water() > 0);
  CHECK(env.source->pool().high_water() <= env.source->pool().budget());
  CHECK(env.source->pool().in_use() == 0);  // every lease returned
}

TEST_CASE("materialize – a cast of a resident tensor converts straight from the page cache",
          "[cpu][materialize][mapped]") {
  Env env;  // the checkpoint was just written: its pages are in the page cache
  for (auto [name, from, to] : {std::tuple{"big", DType::BF16, DType::F32}, std::tuple{"mat", DType::F32, DType::BF16},
                                std::tuple{"cube", DType::F16, DType::F32}, std::tuple{"q", DType::BF16, DType::F16}}) {
    INFO(name);
    io::TensorReadRequest whole{name};
    CHECK(env.source->map_resident(whole));
    cpu::Tensor t = env.run(DerivedWeightRecipe::cast(DerivedWeightRecipe::source(name), to));
    CHECK(t.dtype() == to);
    CHECK(to_vector(t.bytes()) == converted(from, to, env.ckpt.bytes(name)));
  }
  CHECK(env.source->pool().high_water() == 0);  // no staging at all
}

TEST_CASE("materialize – with copy_resident_on_executor, resident tensors are copied from the mapping",
          "[cpu][materialize][mapped]") {
  Env env;
  env.mc.copy_resident_on_executor = true;
  // Fresh storage from the system is left to the reader, which faults its pages in as it
  // copies; recycled (populated) storage gets the arena's copy from the mapping.
  const auto before = env.source->reader().stats().bytes;
  {
    cpu::Tensor t = env.read(io::TensorReadRequest{"big"});  // ~150 KiB: a fresh mapped block
    CHECK(to_vector(t.bytes()) == env.ckpt.bytes("big"));
    CHECK(env.source->reader().stats().bytes > before);
    CHECK_FALSE(t.storage()->fresh());  // the read wrote every page: the block recycles
  }
  const auto& big = env.ckpt.spec("big");
  Selection rows = Selection::rows(big.shape, 10, 200);  // one run of 95 KiB: mapped too
  io::TensorReadRequest row_request{"big", rows};
  const std::vector<std::byte> row_bytes = select_bytes(env.ckpt.bytes("big"), big.shape, DType::BF16, rows);
  CHECK(to_vector(env.read(row_request).bytes()) == row_bytes);  // fresh storage: read
  const auto reader_bytes = env.source->reader().stats().bytes;
  const auto recycled = env.storage.stats().recycled_allocations;
  {
    cpu::Tensor t = env.read(io::TensorReadRequest{"big"});
    CHECK(to_vector(t.bytes()) == env.ckpt.bytes("big"));
  }
  CHECK(to_vector(env.read(row_request).bytes()) == row_bytes);
  CHECK(env.source->reader().stats().bytes == reader_bytes);  // the reader read nothing
  // Weights under 64 KiB are read: a mapping's system calls cost more than their copy.
  for (const char* name : {"q", "cube", "odd"}) {
    cpu::Tensor t = env.read(io::TensorReadRequest{name});
    CHECK(to_vector(t.bytes()) == env.ckpt.bytes(name));
  }
  CHECK(env.source->reader().stats().bytes ==
        reader_bytes + env.ckpt.bytes("q").size() + env.ckpt.bytes("cube").size() + env.ckpt.bytes("odd").size());
  CHECK(env.storage.stats().recycled_allocations > recycled);  // "big" got the first one's block
  // A column selection is many runs: the reader serves it.
  Selection columns = Selection::columns(big.shape, 3, 200);
  io::TensorReadRequest column_request{"big", columns};
  CHECK(to_vector(env.read(column_request).bytes()) ==
        select_bytes(env.ckpt.bytes("big"), big.shape, DType::BF16, columns));
  CHECK(env.source->reader().stats().bytes > reader_bytes);
  CHECK(env.source->pool().high_water() == 0);
}

TEST_CASE("materialize – a file that shrinks under a mapped cast fails it with a typed error",
          "[cpu][materialize][mapped][errors]") {
  // Shrinks the checkpoint the moment a mapping is handed out, so the conversion's reads
  // fault (SIGBUS) and must come back as an error naming file, tensor and offset.
  ShrinkOnMap shrinker;
  shrinker.survive = 4096;  // one page or so of the tensor survives
  CpuCheckpoint ckpt{mixed_specs()};
  shrinker.path = ckpt.path;
  io::SourceOptions options = small_source_options();
  options.reader.faults = &shrinker;
  asio::io_context ctx;
  auto source = io::CheckpointSource::open(ctx.get_executor(), ckpt.path, options);
  cpu::Executor executor{2};
  cpu::StoragePool storage;
  cpu::MaterializationContext mc{executor, storage};
  const auto& big = source->catalog().at("big");
  REQUIRE(big.nbytes > 4 * 4096);
  cpu::Materialization m = cpu::Backend::materialize_recipe(
      *source, DerivedWeightRecipe::cast(DerivedWeightRecipe::source("big"), DType::F32), mc, {});
  try {
    (void)finish(ctx, std::move(m));
    FAIL("the conversion of a shrunk file succeeded");
  } catch (const Error& e) {
    CHECK(e.kind() == errc::file_changed);
    CHECK(e.context().file == ckpt.path.string());
    CHECK(e.context().tensor == "big");
    REQUIRE(e.context().offset);
    CHECK(*e.context().offset >= shrinker.keep);
    CHECK(*e.context().offset < big.offset + big.nbytes);
  }
  CHECK(source->pool().in_use() == 0);
}

TEST_CASE("materialize – recipes: fused QKV, gate+up, transpose, slice, reshape, permute, nested cast",
          "[cpu][materialize][recipe]") {
  Env env;
  using R = DerivedWeightRecipe;
  auto cat = [](std::vector<const std::vector<std::byte>*> parts) {
    std::vector<std::byte> out;
    for (auto* p : parts) out.insert(out.end(), p->begin(), p->end());
    return out;
  };
  const auto &q = env.ckpt.bytes("q"), &k = env.ckpt.bytes("k"), &v = env.ckpt.bytes("v");

  cpu::Tensor qkv = env.run(R::concat({R::source("q"), R::source("k"), R::source("v")}, 0));
  CHECK(qkv.shape() == Shape{24, 16});
  CHECK(to_vector(qkv.bytes()) == cat({&q, &k, &v}));

  // Along the last dim: rows interleave.
  cpu::Tensor gu = env.run(R::concat({R::source("gate"), R::source("up")}, 1));
  CHECK(gu.shape() == Shape{4, 16});
  std::vector<std::byte> expect;
  for (std::size_t row = 0; row < 4; ++row) {
    auto& g = env.ckpt.bytes("gate");
    auto& u = env.ckpt.bytes("up");
    expect.insert(expect.end(), g.begin() + row * 24, g.begin() + (row + 1) * 24);
    expect.insert(expect.end(), u.begin() + row * 40, u.begin() + (row + 1) * 40);
  }
  CHECK(to_vector(gu.bytes()) == expect);

  cpu::Tensor tr = env.run(R::transpose(R::source("mat")));
  CHECK(tr.shape() == Shape{131, 67});
  {
    auto in = env.ckpt.bytes("mat");
    bool same = true;
    for (std::size_t i = 0; i < 67 && same; ++i)
      for (std::size_t j = 0; j < 131 && same; ++j)
        same = std::memcmp(tr.bytes().data() + (j * 67 + i) * 4, in.data() + (i * 131 + j) * 4, 4) == 0;
    CHECK(same);
  }

  // A slice of a source is folded into the read's selection.
  const auto& big = env.ckpt.spec("big");
  cpu::Tensor sl = env.run(R::slice(R::source("big"), 1, {5, 77}));
  CHECK(to_vector(sl.bytes()) ==
        select_bytes(env.ckpt.bytes("big"), big.shape, DType::BF16, Selection{{{0, 300}, {5, 77}}}));
  // A slice of a derived value runs as a kernel.
  cpu::Tensor sl2 = env.run(R::slice(R::concat({R::source("q"), R::source("k")}, 0), 0, {4, 12}));
  auto qk = cat({&q, &k});
  CHECK(to_vector(sl2.bytes()) == std::vector<std::byte>(qk.begin() + 4 * 32, qk.begin() + 12 * 32));

  cpu::Tensor rs = env.run(R::reshape(R::source("cube"), {15, 7}));
  CHECK(rs.shape() == Shape{15, 7});
  CHECK(to_vector(rs.bytes()) == env.ckpt.bytes("cube"));

  cpu::Tensor pm = env.run(R::permute(R::source("cube"), {2, 0, 1}));
  CHECK(pm.shape() == Shape{7, 3, 5});
  {
    auto& in = env.ckpt.bytes("cube");
    bool same = true;
    for (std::size_t a = 0; a < 3; ++a)
      for (std::size_t b = 0; b < 5; ++b)
        for (std::size_t c = 0; c < 7; ++c)
          same = same && std::memcmp(pm.bytes().data() + ((c * 3 + a) * 5 + b) * 2,
                                     in.data() + ((a * 5 + b) * 7 + c) * 2, 2) == 0;
    CHECK(same);
  }

  // A transpose of a rank-3 source swaps its last two dims (the rank comes from the catalog).
  cpu::Tensor t3 = env.run(R::transpose(R::source("cube")));
  CHECK(t3.shape() == Shape{3, 7, 5});
  {
    auto& in = env.ckpt.bytes("cube");
    bool same = true;
    for (std::size_t a = 0; a < 3; ++a)
      for (std::size_t b = 0; b < 5; ++b)
        for (std::size_t c = 0; c < 7; ++c)
          same = same && std::memcmp(t3.bytes().data() + ((a * 7 + c) * 5 + b) * 2,
                                     in.data() + ((a * 5 + b) * 7 + c) * 2, 2) == 0;
    CHECK(same);
  }

  // A cast of a derived value: concat first, then convert.
  cpu::Tensor cc = env.run(R::cast(R::concat({R::source("q"), R::source("k"), R::source("v")}, 0), DType::F32));
  CHECK(cc.dtype() == DType::F32);
  CHECK(to_vector(cc.bytes()) == converted(DType::BF16, DType::F32, cat({&q, &k, &v})));

  // A bad recipe is refused before anything starts.
  CHECK_THROWS_AS(cpu::Backend::materialize_recipe(*env.source, R::source("absent"), env.mc, {}), engine::RecipeError);
  CHECK(env.source->pool().in_use() == 0);
}

TEST_CASE("materialize – a stop request before the work starts completes it as cancelled", "[cpu][materialize]") {
  Env env;
  std::stop_source stop;
  stop.request_stop();
  io::TensorReadRequest r{"big"};
  cpu::Materialization m = cpu::Backend::materialize(*env.source, r, env.mc, stop.get_token());
  drive_until(env.ctx, m.done);
  try {
    cpu::Backend::finish_materialization(std::move(m));
    FAIL("expected cancellation");
  } catch (const Error& e) {
    CHECK(e.kind() == errc::cancelled);
  }
  cpu::Materialization c = cpu::Backend::materialize_recipe(
      *env.source, DerivedWeightRecipe::cast(DerivedWeightRecipe::source("big"), DType::F32), env.mc, stop.get_token());
  drive_until(env.ctx, c.done);
  CHECK(c.done.error());
  CHECK(env.source->pool().in_use() == 0);
}

namespace {

// Holds the first read it sees until opened: that read is then in the pread worker, the rest
// of its batch queued behind it.
struct ReadGate final : io::FaultInjector {
  std::mutex mutex;
  std::condition_variable changed;
  bool entered = false;
  bool open = false;
  io::ReadFault on_complete(std::uint32_t, std::uint64_t, std::uint64_t) override {
    std::unique_lock lock(mutex);
    entered = true;
    changed.notify_all();
    changed.wait(lock, [&] { return open; });
    return {};
  }
  bool has_entered() {
    std::lock_guard lock(mutex);
    return entered;
  }
  void release() {
    {
      std::lock_guard lock(mutex);
      open = true;
    }
    changed.notify_all();
  }
};

}  // namespace

TEST_CASE("materialize – a stop while its read waits in the reader drops the read's queued requests",
          "[cpu][materialize][cancel]") {
  ReadGate gate;
  io::SourceOptions options = small_source_options();
  options.reader.kind = io::ReaderKind::pread;
  options.reader.direct = io::DirectMode::off;
  options.reader.depth = 1;           // one request in flight, the rest queued
  options.reader.max_request = 4096;  // "big" is 38 requests
  options.reader.faults = &gate;      // no mappings either: the source reads
  Env env(options);
  std::stop_source stop;
  io::TensorReadRequest r{"big"};
  cpu::Materialization m = cpu::Backend::materialize(*env.source, r, env.mc, stop.get_token());
  while (!gate.has_entered()) {
    env.ctx.restart();
    env.ctx.run_one_for(std::chrono::milliseconds(5));
  }
  stop.request_stop();
  // The stop's cancellation is emitted on the loop (StopCancellation): let it reach the reader
  // before the gate lets the worker go on to the queued requests.
  env.ctx.restart();
  env.ctx.poll();
  gate.release();
  drive_until(env.ctx, m.done);
  try {
    cpu::Backend::finish_materialization(std::move(m));
    FAIL("expected cancellation");
  } catch (const Error& e) {
    CHECK(e.kind() == errc::cancelled);
  }
  CHECK(env.source->reader().stats().requests == 1);  // without the stop reaching the read: 38
  CHECK(env.source->pool().in_use() == 0);
}

TEST_CASE("transfer – demote to host and promote back preserves bytes, dtype and shape", "[cpu][transfer]") {
  Env env;
  io::TensorReadRequest r{"big"};
  cpu::Tensor t = env.read(r);
  auto [host, demoted] = cpu::Backend::demote(env.executor, t);
  demoted.get();
  CHECK(host.dtype() == DType::BF16);
  CHECK(host.shape() == t.shape());
  CHECK(to_vector(host.bytes()) == to_vector(t.bytes()));
  auto [back, promoted] = cpu::Backend::promote(env.executor, host, env.storage);
  promoted.get();
  CHECK_FALSE(back.shares_storage_with(t));
  CHECK(to_vector(back.bytes()) == env.ckpt.bytes("big"));
}

TEST_CASE("bind – validate_bind refuses wrong dtype and shape, and bind publishes", "[cpu][bind]") {
  cpu::StoragePool pool;
  cpu::Tensor t = cpu::Tensor::allocate(pool, DType::BF16, {4, 4});
  cpu::Parameter right(DType::BF16, {4, 4}), wrong_dtype(DType::F32, {4, 4}), wrong_shape(DType::BF16, {16});
  CHECK_NOTHROW(cpu::Backend::validate_bind(right, t));
  try {
    cpu::Backend::validate_bind(wrong_dtype, t);
    FAIL();
  } catch (const BackendError& e) {
    CHECK(e.kind() == errc::bind_dtype_mismatch);
    CHECK_THAT(e.what(), Catch::Contains("F32") && Catch::Contains("BF16"));
  }
  try {
    cpu::Backend::validate_bind(wrong_shape, t);
    FAIL();
  } catch (const BackendError& e) {
    CHECK(e.kind() == errc::bind_shape_mismatch);
    CHECK_THAT(e.what(), Catch::Contains("[16]") && Catch::Contains("[4, 4]"));
  }
  cpu::Backend::bind(right, cpu::Backend::share_materialized_weight(t));
  CHECK(right.value.shares_storage_with(t));
}

TEST_CASE("cpu executor – a concurrency out of range is invalid_argument, at once", "[cpu][options]") {
  for (int bad : {0, -2, 100000, cpu::Executor::max_concurrency + 1}) {
    try {
      cpu::Executor executor(bad);
      FAIL("accepted " << bad);
    } catch (const Error& e) {
      CHECK(e.kind() == errc::invalid_argument);
      CHECK_THAT(e.what(), Catch::Contains(fmt::format("concurrency is {}; it must be", bad)));
    }
  }
  cpu::Executor one(1);
  CHECK(one.concurrency() == 1);
  cpu::Executor all(cpu::Executor::automatic);
  CHECK(all.concurrency() >= 1);
}

namespace {

errc kind_of(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const Error& err) {
    return err.kind();
  } catch (...) {
    return errc::backend_failure;
  }
}

/// Waits up to `seconds` for `c`; false if it did not complete (a hang, in these tests).
bool completes_within(const Completion& c, double seconds) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (!c.ready()) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool sanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
constexpr bool sanitized = true;
#else
constexpr bool sanitized = false;
#endif
#else
constexpr bool sanitized = false;
#endif

/// Bytes of address space the process maps now (VmSize).
std::size_t mapped_bytes() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line))
    if (line.rfind("VmSize:", 0) == 0) return std::stoull(line.substr(7)) * 1024;  // kB
  return 0;
}

/// Threads of this process now (the status file's Threads:).
std::size_t thread_count() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line))
    if (line.rfind("Threads:", 0) == 0) return std::stoull(line.substr(8));
  return 0;
}

}  // namespace

TEST_CASE("cpu executor – work that throws std::bad_alloc fails with out_of_memory, the executor stays usable",
          "[cpu][executor][limits]") {
  cpu::Executor ex(2);
  Completion c = ex.submit([] { throw std::bad_alloc(); });
  REQUIRE(completes_within(c, 30));
  CHECK(kind_of(c.error()) == errc::out_of_memory);
  CHECK_FALSE(ex.closed_error());
  int ran = 0;
  ex.submit([&] { ran = 1; }).get();
  CHECK(ran == 1);
}

TEST_CASE("cpu executor – TBB refused a worker thread: the work fails typed, the executor closes, nothing waits",
          "[cpu][executor][limits]") {
  if (sanitized) {
    WARN("skipped: RLIMIT_AS cannot be lowered under a sanitizer (its shadow memory is most of the address space)");
    return;
  }
  // What is tested is the first worker thread TBB starts: in a process where an earlier case
  // started workers, there is none left to refuse, and lowering RLIMIT_AS under running
  // workers only breaks them (TBB crashes when its own allocations fail). ctest runs every
  // case in a process of its own, where this one runs.
  if (const std::size_t threads = thread_count(); threads != 1) {
    WARN("skipped: this process already runs " << threads
                                               << " threads; run this case alone (ctest does) to test TBB's "
                                                  "first worker thread");
    return;
  }
  cpu::Executor ex(2);  // its arena initialized now: no thread started yet
  // TBB's allocator, warmed in an arena without workers, so that queueing needs no new
  // mapping: what the limit below refuses is the worker's stack (TBB asks for 4 MiB).
  tbb::task_arena alone(1, 1);
  alone.execute([] {
    tbb::task_group g;
    g.run([] {});
    g.wait();
  });
  rlimit old{};
  REQUIRE(::getrlimit(RLIMIT_AS, &old) == 0);
  const rlimit tight{mapped_bytes() + (std::size_t{1} << 20), old.rlim_max};
  std::atomic<int> ran{0};
  Completion first;
  REQUIRE(::setrlimit(RLIMIT_AS, &tight) == 0);
  try {
    first = ex.submit([&] { ++ran; });
  } catch (...) {
    ::setrlimit(RLIMIT_AS, &old);
    throw;
  }
  REQUIRE(::setrlimit(RLIMIT_AS, &old) == 0);

  // Before, the second submit waited for ever inside TBB (the failed call left the arena's
  // demand bookkeeping mid-update), and the first work's completion never came.
  REQUIRE(completes_within(first, 30));
  const errc kind = kind_of(first.error());
  INFO("the first work's error: " << (first.error() ? "" : "none, it ran") << " kind " << errc_name(kind));
  CHECK((kind == errc::resource_exhausted || kind == errc::out_of_memory));
  CHECK(ran == 0);
  REQUIRE(ex.closed_error());
  Completion later = ex.submit([&] { ++ran; });
  REQUIRE(completes_within(later, 1));
  CHECK(kind_of(later.error()) == kind);
  CHECK_THROWS_AS(ex.run_blocking([] {}), Error);
  CHECK(ran == 0);
  if (kind == errc::resource_exhausted) {
    // The refused worker is lost to TBB's process-wide pool for good: a new executor refuses
    // at once instead of queueing work no worker may ever run.
    std::exception_ptr refused;
    try {
      cpu::Executor again(2);
    } catch (...) {
      refused = std::current_exception();
    }
    CHECK(kind_of(refused) == errc::resource_exhausted);
  }
}
