// Both readers (io_uring, pread) under every O_DIRECT mode must deliver exactly the bytes a
// reference pread sees, and turn every injected fault into a typed error.
#include "eredu/io/reading/checkpoint_source.hpp"

#include <asio/experimental/deferred.hpp>
#include <asio/use_awaitable.hpp>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <future>
#include <mutex>
#include <stdexcept>

#include "eredu/core/error.hpp"
#include "eredu/core/log.hpp"
#include "eredu/io/reading/open_file.hpp"
#include "eredu/io/reading/pread_reader.hpp"
#include "eredu/io/reading/uring_reader.hpp"
#include "io/read_fixture.hpp"
#include "support/byte_units.hpp"
#include "support/error_kind.hpp"

using namespace eredu;
using namespace eredu::io;
using eredu::test::pread_reference;
using eredu::test::run_on;
using eredu::test::select_bytes;

namespace {

using eredu::test::MiB;

// Sizes chosen to straddle 4 KiB windows, exceed one 4 MiB request, and be empty.
std::vector<synth::TensorSpec> test_specs() {
  return {
      {"tiny", DType::U8, {7}},          {"embed", DType::BF16, {300, 130}}, {"straddle", DType::F32, {1025}},
      {"big", DType::F32, {1100, 1000}},  // 4.4 MB: two requests
      {"empty", DType::F16, {0, 16}},    {"cube", DType::I16, {6, 10, 12}},  {"scalar", DType::F64, {}},
  };
}

struct Checkpoint {
  test::TempDir dir;
  std::filesystem::path path = dir / "model.safetensors";
  std::vector<synth::TensorSpec> specs = test_specs();
  std::vector<std::vector<std::byte>> data = test::random_tensor_bytes(specs, 7);
  Checkpoint() { synth::write_safetensors(path, specs, test::spans_of(data)); }
  const std::vector<std::byte>& bytes(std::string_view name) const {
    for (std::size_t i = 0; i < specs.size(); ++i)
      if (specs[i].name == name) return data[i];
    throw std::runtime_error("no tensor");
  }
};

SourceOptions options_for(ReaderKind kind, DirectMode direct, std::size_t budget = 16 * MiB) {
  SourceOptions o;
  // No idle release (one case below sets its own): its 1 s timer is work that holds every
  // run_on (ctx.run()) for a second after each read, minutes over this file.
  o.pool = {.budget = budget, .huge_pages = false, .prefault = false, .release_after = std::chrono::milliseconds(0)};
  o.reader.kind = kind;
  o.reader.direct = direct;
  return o;
}

std::vector<std::byte> copy_of(const Lease& l) { return {l.bytes().begin(), l.bytes().end()}; }

/// The errc kind of a completion's error.
using eredu::test::kind_of;

struct ShortReads final : FaultInjector {
  std::atomic<int> calls{0};
  ReadFault on_complete(std::uint32_t, std::uint64_t, std::uint64_t length) override {
    ++calls;
    return {.truncate_to = static_cast<std::int64_t>(std::max<std::uint64_t>(1, length / 3))};
  }
};

struct FailRange final : FaultInjector {
  std::uint64_t begin = 0, end = 0;
  int error = EIO;
  ReadFault on_complete(std::uint32_t, std::uint64_t offset, std::uint64_t length) override {
    if (offset < end && offset + length > begin) return {.error = error};
    return {};
  }
};

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

TEST_CASE("checkpoint source – whole tensors equal a reference pread", "[io][read]") {
  auto kind = GENERATE(ReaderKind::uring, ReaderKind::pread);
  auto direct = GENERATE(DirectMode::off, DirectMode::automatic, DirectMode::on);
  auto parallel_copies = GENERATE(true, false);  // buffered reads on io-wq, or inline
  CAPTURE(static_cast<int>(kind), static_cast<int>(direct), parallel_copies);
  Checkpoint ck;
  asio::io_context ctx;
  auto options = options_for(kind, direct);
  options.reader.parallel_buffered_copies = parallel_copies;
  auto source = CheckpointSource::open(ctx.get_executor(), ck.path, options);
  CHECK(source->reader().name() == (kind == ReaderKind::uring ? "io_uring" : "pread"));
  for (const auto& t : source->catalog().tensors()) {
    CAPTURE(t.name);
    Lease lease = run_on(ctx, source->async_read({t.name}, asio::use_awaitable));
    CHECK(lease.bytes().size() == t.nbytes);
    CHECK(lease.total() == t.nbytes);
    CHECK(lease.last());
    CHECK(copy_of(lease) == pread_reference(ck.path, t.offset, t.nbytes));
    CHECK(copy_of(lease) == ck.bytes(t.name));
  }
  CHECK(source->pool().in_use() == 0);
  if (direct == DirectMode::on) CHECK(source->reader().stats().direct_requests > 0);
  if (direct == DirectMode::off) CHECK(source->reader().stats().direct_requests == 0);
}

TEST_CASE("checkpoint source – row, column and 3-d selections read exactly the selected bytes", "[io][read]") {
  auto kind = GENERATE(ReaderKind::uring, ReaderKind::pread);
  auto direct = GENERATE(DirectMode::off, DirectMode::on);
  Checkpoint ck;
  asio::io_context ctx;
  auto source = CheckpointSource::open(ctx.get_executor(), ck.path, options_for(kind, direct));
  struct Case {
    std::string name;
    Selection sel;
  };
  const Shape embed{300, 130}, big{1100, 1000}, cube{6, 10, 12};
  std::vector<Case> cases = {
      {"embed", Selection::rows(embed, 17, 151)},     {"embed", Selection::columns(embed, 65, 130)},
      {"big", Selection::rows(big, 550, 1100)},  // a tensor-parallel half: one run
      {"big", Selection::columns(big, 0, 500)},  // 1100 runs of 2000 bytes
      {"cube", Selection{{{1, 4}, {2, 9}, {0, 12}}}}, {"cube", Selection{{{0, 6}, {0, 10}, {3, 5}}}},
      {"embed", Selection::rows(embed, 5, 5)},  // nothing
  };
  for (const auto& c : cases) {
    CAPTURE(c.name, c.sel.to_string());
    const auto& t = source->catalog().at(c.name);
    Lease lease = run_on(ctx, source->async_read({c.name, c.sel}, asio::use_awaitable));
    CHECK(copy_of(lease) == select_bytes(ck.bytes(c.name), t.shape, t.dtype, c.sel));
  }
  CHECK(source->pool().in_use() == 0);
}

TEST_CASE("checkpoint source – bad requests are typed errors naming the tensor", "[io][read]") {
  Checkpoint ck;
  asio::io_context ctx;
  auto source =
      CheckpointSource::open(ctx.get_executor(), ck.path, options_for(ReaderKind::automatic, DirectMode::off));
  auto expect = [&](TensorReadRequest r, errc kind, std::string_view needle) {
    try {
      run_on(ctx, source->async_read(r, asio::use_awaitable));
      FAIL("no error for " << r.key);
    } catch (const Error& e) {
      CHECK(e.kind() == kind);
      CHECK_THAT(e.what(), Catch::Contains(std::string(needle)));
    }
  };
  expect({"missing"}, errc::tensor_not_found, "missing");
  expect({"embed", Selection{{{0, 301}, {0, 130}}}}, errc::invalid_selection, "embed");
  expect({"embed", Selection{{{0, 3}}}}, errc::invalid_selection, "rank 2");
  CHECK(source->pool().in_use() == 0);
}

TEST_CASE("checkpoint source – larger than the pool: RequireBounded fails, chunked streams", "[io][read]") {
  auto kind = GENERATE(ReaderKind::uring, ReaderKind::pread);
  Checkpoint ck;
  asio::io_context ctx;
  auto opts = options_for(kind, DirectMode::automatic, MiB);
  opts.chunk_bytes = 300 * 1024;
  auto source = CheckpointSource::open(ctx.get_executor(), ck.path, opts);
  try {
    run_on(ctx, source->async_read({"big"}, asio::use_awaitable));
    FAIL("expected exceeds_budget");
  } catch (const Error& e) {
    CHECK(e.kind() == errc::exceeds_budget);
    CHECK_THAT(e.what(), Catch::Contains("big") && Catch::Contains("4400000"));
  }
  for (auto sel : {Selection::all(), Selection::columns({1100, 1000}, 100, 900)}) {
    const auto& t = source->catalog().at("big");
    auto expected = select_bytes(ck.bytes("big"), t.shape, t.dtype, sel);
    auto stream = source->stream({"big", sel, ReadPolicy::chunked});
    CHECK(stream.total() == expected.size());
    std::vector<std::byte> got;
    std::size_t chunks = 0;
    source->pool().reset_high_water();
    run_on(ctx, [&]() -> asio::awaitable<void> {
      while (auto chunk = co_await stream.async_next(asio::use_awaitable)) {
        CHECK(chunk->offset() == got.size());
        CHECK(chunk->bytes().size() <= opts.chunk_bytes);
        got.insert(got.end(), chunk->bytes().begin(), chunk->bytes().end());
        ++chunks;
      }
    }());
    CHECK(got == expected);
    CHECK(chunks > 5);
    CHECK(source->pool().high_water() <= source->pool().budget());
  }
  CHECK(source->pool().in_use() == 0);
}

TEST_CASE("checkpoint source – injected short reads are resubmitted, never wrong bytes", "[io][read][faults]") {
  auto kind = GENERATE(ReaderKind::uring, ReaderKind::pread);
  auto direct = GENERATE(DirectMode::off, DirectMode::on);
  Checkpoint ck;
  asio::io_context ctx;
  ShortReads faults;
  auto opts = options_for(kind, direct);
  opts.reader.faults = &faults;
  auto source = CheckpointSource::open(ctx.get_executor(), ck.path, opts);
  for (const auto* name : {"big", "embed", "straddle"}) {
    Lease lease = run_on(ctx, source->async_read({name}, asio::use_awaitable));
    CHECK(copy_of(lease) == ck.bytes(name));
  }
  Lease cols = run_on(ctx, source->async_read({"embed", Selection::columns({300, 130}, 1, 3)}, asio::use_awaitable));
  CHECK(copy_of(cols) ==
        select_bytes(ck.bytes("embed"), {300, 130}, DType::BF16, Selection::columns({300, 130}, 1, 3)));
  CHECK(source->reader().stats().short_reads > 10);
  CHECK(faults.calls > 10);
}

TEST_CASE("checkpoint source – an EIO is a typed io_error naming file, tensor and offset", "[io][read][faults]") {
  auto kind = GENERATE(ReaderKind::uring, ReaderKind::pread);
  Checkpoint ck;
  asio::io_context ctx;
  FailRange faults;
  auto opts = options_for(kind, DirectMode::off);
  opts.reader.faults = &faults;
  opts.reader.max_request = 256 * 1024;  // many pieces: the failure lands mid-batch
  auto source = CheckpointSource::open(ctx.get_executor(), ck.path, opts);
  const auto& big = source->catalog().at("big");
  faults.begin = big.offset + 2 * MiB;
  faults.end = faults.begin + 1;
  try {
    run_on(ctx, source->async_read({"big"}, asio::use_awaitable));
    FAIL("expected io_error");
  } catch (const Error& e) {
    CHECK(e.kind() == errc::io_error);
    CHECK(e.context().tensor == "big");
    CHECK(e.context().file == ck.path.string());
    REQUIRE(e.context().offset.has_value());
    CHECK(*e.context().offset <= faults.begin);
    CHECK(e.context().os_error == std::error_code(EIO, std::system_category()));
    CHECK_THAT(e.what(), Catch::Contains("big") && Catch::Contains(ck.path.string()));
  }
  CHECK(source->pool().in_use() == 0);  // the failed read's lease went back
  // Other tensors still read fine afterwards.
  Lease ok = run_on(ctx, source->async_read({"embed"}, asio::use_awaitable));
  CHECK(copy_of(ok) == ck.bytes("embed"));
}

TEST_CASE("checkpoint source – a file truncated after open gives unexpected_eof", "[io][read][faults]") {
  auto kind = GENERATE(ReaderKind::uring, ReaderKind::pread);
  auto direct = GENERATE(DirectMode::off, DirectMode::on);
  Checkpoint ck;
  asio::io_context ctx;
  auto source = CheckpointSource::open(ctx.get_executor(), ck.path, options_for(kind, direct));
  const auto& big = source->catalog().at("big");
  std::filesystem::resize_file(ck.path, big.offset + 1000);
  try {
    run_on(ctx, source->async_read({"big"}, asio::use_awaitable));
    FAIL("expected unexpected_eof");
  } catch (const Error& e) {
    CHECK(e.kind() == errc::unexpected_eof);
    CHECK(e.context().tensor == "big");
    CHECK_THAT(e.what(), Catch::Contains("truncated"));
  }
  // The file is no longer the one opened (a `cp` over it truncates, then writes new bytes):
  // even a tensor before the cut fails, with file_changed, rather than pass as the file's.
  try {
    run_on(ctx, source->async_read({"tiny"}, asio::use_awaitable));
    FAIL("expected file_changed");
  } catch (const Error& e) {
    CHECK(e.kind() == errc::file_changed);
    CHECK(e.context().tensor == "tiny");
  }
  CHECK(source->pool().in_use() == 0);
}

TEST_CASE("checkpoint source – async_read_into fills caller memory without staging", "[io][read]") {
  auto kind = GENERATE(ReaderKind::uring, ReaderKind::pread);
  Checkpoint ck;
  asio::io_context ctx;
  auto source = CheckpointSource::open(ctx.get_executor(), ck.path, options_for(kind, DirectMode::automatic));
  std::vector<std::byte> dest(ck.bytes("big").size());
  run_on(ctx, source->async_read_into({"big"}, dest, asio::use_awaitable));
  CHECK(dest == ck.bytes("big"));
  CHECK(source->pool().high_water() == 0);
  std::vector<std::byte> wrong(3);
  CHECK_THROWS_AS(run_on(ctx, source->async_read_into({"big"}, wrong, asio::use_awaitable)), Error);
}

TEST_CASE("checkpoint source – many concurrent reads stay within the budget", "[io][read][pool]") {
  auto kind = GENERATE(ReaderKind::uring, ReaderKind::pread);
  Checkpoint ck;
  asio::io_context ctx;
  auto source = CheckpointSource::open(ctx.get_executor(), ck.path, options_for(kind, DirectMode::automatic, 6 * MiB));
  int ok = 0;
  for (int round = 0; round < 8; ++round) {
    for (const auto& t : source->catalog().tensors()) {
      asio::co_spawn(
          ctx,
          // A coroutine lambda's captures (even by reference) die with the lambda object,
          // before the coroutine ends: pass everything as parameters, which live in the frame.
          [](CheckpointSource* src, const Checkpoint* k, int* good, std::string name) -> asio::awaitable<void> {
            // A named request: g++ 12 mis-relocates class temporaries inside co_await expressions.
            TensorReadRequest request{name};
            Lease l = co_await src->async_read(request, asio::use_awaitable);
            if (copy_of(l) == k->bytes(name)) ++*good;
          }(source.get(), &ck, &ok, t.name),
          [](std::exception_ptr e) {
            if (e) std::rethrow_exception(e);
          });
    }
  }
  ctx.run();
  CHECK(ok == 8 * static_cast<int>(ck.specs.size()));
  CHECK(source->pool().high_water() <= source->pool().budget());
  CHECK(source->pool().high_water() > 4 * MiB);  // several reads did overlap
  CHECK(source->pool().in_use() == 0);
}

TEST_CASE("checkpoint source – sharded checkpoints read across files", "[io][read]") {
  test::TempDir dir;
  auto specs = test_specs();
  auto data = test::random_tensor_bytes(specs, 11);
  synth::write_sharded(dir.path(), specs, test::spans_of(data), 2 * MiB);
  asio::io_context ctx;
  auto source =
      CheckpointSource::open(ctx.get_executor(), dir.path(), options_for(ReaderKind::uring, DirectMode::automatic));
  CHECK(source->catalog().files().size() > 1);
  for (std::size_t i = 0; i < specs.size(); ++i) {
    Lease l = run_on(ctx, source->async_read({specs[i].name}, asio::use_awaitable));
    CHECK(copy_of(l) == data[i]);
  }
}

TEST_CASE("checkpoint source – automatic reader falls back to pread with a log line", "[io][read]") {
  Checkpoint ck;
  asio::io_context ctx;
  LogCapture logs;
  ::setenv("EREDU_DISABLE_URING", "1", 1);
  auto source =
      CheckpointSource::open(ctx.get_executor(), ck.path, options_for(ReaderKind::automatic, DirectMode::off));
  CHECK_THROWS_AS(CheckpointSource::open(ctx.get_executor(), ck.path, options_for(ReaderKind::uring, DirectMode::off)),
                  Error);
  ::unsetenv("EREDU_DISABLE_URING");
  CHECK(source->reader().name() == "pread");
  CHECK(logs.contains("io_uring unavailable"));
  Lease l = run_on(ctx, source->async_read({"embed"}, asio::use_awaitable));
  CHECK(copy_of(l) == ck.bytes("embed"));
}

TEST_CASE("uring reader – a small registration limit falls back with a log line", "[io][read][uring]") {
  Checkpoint ck;
  asio::io_context ctx;
  LogCapture logs;
  auto opts = options_for(ReaderKind::uring, DirectMode::off, 8 * MiB);
  opts.reader.max_registered_bytes = 2 * MiB;
  auto source = CheckpointSource::open(ctx.get_executor(), ck.path, opts);
  // Nothing is registered (or populated) until something is staged.
  CHECK(static_cast<UringReader&>(source->reader()).registered_bytes() == 0);
  CHECK_FALSE(source->pool().populated());
  for (const auto& t : source->catalog().tensors()) {
    Lease l = run_on(ctx, source->async_read({t.name}, asio::use_awaitable));
    CHECK(copy_of(l) == ck.bytes(t.name));
  }
  CHECK(logs.contains("fixed buffers"));
  CHECK(static_cast<UringReader&>(source->reader()).registered_bytes() == 2 * MiB);
  CHECK(source->reader().stats().fixed_buffer_requests > 0);
}

TEST_CASE("readers – destroying a reader with reads in flight completes them, touching nothing after", "[io][read]") {
  auto kind = GENERATE(ReaderKind::uring, ReaderKind::pread);
  Checkpoint ck;
  asio::io_context ctx;
  std::vector<OpenFile> files(1);
  files[0].path = ck.path.string();
  files[0].buffered.reset(::open(ck.path.c_str(), O_RDONLY | O_CLOEXEC));
  files[0].size = std::filesystem::file_size(ck.path);
  LeasePool pool(ctx.get_executor(), {.budget = 64 * MiB, .huge_pages = false, .prefault = false});
  ReaderOptions ro;
  ro.max_request = 64 * 1024;
  std::unique_ptr<Reader> reader;
  if (kind == ReaderKind::uring)
    reader = std::make_unique<UringReader>(ctx.get_executor(), files, pool.memory(), ro);
  else
    reader = std::make_unique<PreadReader>(files, ro);
  int completed = 0, cancelled = 0;
  std::vector<StagingBuffer> buffers;
  for (int i = 0; i < 8; ++i) {
    auto b = pool.try_acquire(files[0].size);
    REQUIRE(b);
    reader->async_read({{0, 0, b->data(), files[0].size, files[0].size}}, ctx.get_executor(),
                       [&](std::exception_ptr f) {
                         if (!f)
                           ++completed;
                         else if (kind_of(f) == errc::cancelled)
                           ++cancelled;
                       });
    buffers.push_back(std::move(*b));
  }
  reader.reset();  // must wait for the kernel before the buffers may be reused
  buffers.clear();
  ctx.run();
  CHECK(completed + cancelled == 8);
}

TEST_CASE("readers – a deferred read whose fallback executor temporary is gone still completes there",
          "[io][read][deferred]") {
  // The regression: the initiation captured `fallback` by reference, which a deferred token
  // keeps past the end of the full expression that made the temporary.
  auto kind = GENERATE(ReaderKind::uring, ReaderKind::pread);
  Checkpoint ck;
  asio::io_context ctx;
  auto source = CheckpointSource::open(ctx.get_executor(), ck.path, options_for(kind, DirectMode::off));
  const TensorInfo& t = source->catalog().at("embed");
  std::vector<std::byte> dest(t.nbytes);
  auto read = source->reader().async_read({{t.file, t.offset, dest.data(), t.nbytes, t.nbytes}},
                                          asio::any_io_executor(ctx.get_executor()), asio::experimental::deferred);
  // The executor temporary is gone here (ASan reports a read of its stack slot if the
  // operation kept a reference to it).
  std::exception_ptr error = std::make_exception_ptr(std::runtime_error("never completed"));
  std::move(read)([&](std::exception_ptr e) { error = e; });  // no executor: runs on the fallback
  ctx.run();
  CHECK_FALSE(error);
  CHECK(dest == ck.bytes("embed"));
}

TEST_CASE(
    "checkpoint source – deferred reads launched after their requests are gone, or their stream moved, still work",
    "[io][read][deferred]") {
  Checkpoint ck;
  asio::io_context ctx;
  auto source =
      CheckpointSource::open(ctx.get_executor(), ck.path, options_for(ReaderKind::automatic, DirectMode::off));
  auto read = [&] {
    TensorReadRequest request{"embed"};  // gone before the read runs
    return source->async_read(request, asio::experimental::deferred);
  }();
  auto into = [&](std::span<std::byte> out) {
    TensorReadRequest request{"straddle"};
    return source->async_read_into(request, out, asio::experimental::deferred);
  };
  std::vector<std::byte> straddle(ck.bytes("straddle").size());
  auto read_into = into(straddle);
  std::vector<std::byte> embed;
  std::move(read)([&](std::exception_ptr e, Lease l) {
    if (!e) embed = copy_of(l);
  });
  bool filled = false;
  std::move(read_into)([&](std::exception_ptr e) { filled = !e; });
  // A deferred async_next of a stream that was moved before the launch.
  ChunkStream stream = source->stream(TensorReadRequest{"tiny"});
  auto next = stream.async_next(asio::experimental::deferred);
  ChunkStream moved = std::move(stream);
  std::vector<std::byte> tiny;
  std::move(next)([&](std::exception_ptr e, std::optional<Lease> l) {
    if (!e && l) tiny = copy_of(*l);
  });
  ctx.run();
  CHECK(embed == ck.bytes("embed"));
  CHECK(filled);
  CHECK(straddle == ck.bytes("straddle"));
  CHECK(tiny == ck.bytes("tiny"));
  CHECK(moved.remaining() == 0);
  CHECK(source->pool().in_use() == 0);
}

TEST_CASE("checkpoint source – a small checkpoint pins only what its reads can use of a large pool",
          "[io][read][uring][pool]") {
  Checkpoint ck;
  asio::io_context ctx;
  auto source =
      CheckpointSource::open(ctx.get_executor(), ck.path, options_for(ReaderKind::uring, DirectMode::off, 256 * MiB));
  auto& uring = static_cast<UringReader&>(source->reader());
  for (const auto& t : source->catalog().tensors()) {
    Lease l = run_on(ctx, source->async_read({t.name}, asio::use_awaitable));
    CHECK(copy_of(l) == ck.bytes(t.name));
  }
  // Registering pins every page: the whole 256 MiB would cost the first read its pinning
  // (0.73 s measured for a 1 MiB file) and the process 256 MiB of resident memory.
  // What the file's reads can use: its bytes, an eighth more and 4 MiB, in whole 2 MiB.
  const std::uint64_t file_bytes = std::filesystem::file_size(ck.path);
  CHECK(uring.registered_bytes() >= file_bytes + 4 * MiB);
  CHECK(uring.registered_bytes() < file_bytes + file_bytes / 8 + 6 * MiB);
  CHECK(source->pool().budget() == 256 * MiB);  // the budget stays what was asked
  // Every read landed in the registered part: the pool hands out its lowest blocks first.
  CHECK(source->reader().stats().fixed_buffer_requests == source->reader().stats().requests);
}

TEST_CASE("checkpoint source – staging is registered when first used and let go with the pages when idle",
          "[io][read][uring][pool]") {
  Checkpoint ck;
  asio::io_context ctx;
  auto opts = options_for(ReaderKind::uring, DirectMode::off, 8 * MiB);
  opts.pool.release_after = std::chrono::milliseconds(20);
  auto source = CheckpointSource::open(ctx.get_executor(), ck.path, opts);
  auto& uring = static_cast<UringReader&>(source->reader());
  for (int round = 0; round < 2; ++round) {
    for (const auto& t : source->catalog().tensors()) {
      Lease l = run_on(ctx, source->async_read({t.name}, asio::use_awaitable));
      CHECK(copy_of(l) == ck.bytes(t.name));
    }
    CHECK(uring.registered_bytes() == 8 * MiB);  // the file's reads can use all of it
    CHECK(source->pool().populated());
    // Idle: the timer fires, the reader drops the registration on its strand, the pages go.
    // (On a slow machine a release may already have come between two reads.)
    const std::uint64_t before = source->pool().releases();
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (source->pool().releases() == before && std::chrono::steady_clock::now() < deadline) {
      ctx.restart();
      ctx.run_one_for(std::chrono::milliseconds(5));
    }
    CHECK(source->pool().releases() == before + 1);
    CHECK_FALSE(source->pool().populated());
    CHECK(uring.registered_bytes() == 0);
  }
  // Reads straight into caller memory never touch the pool.
  std::vector<std::byte> out(ck.bytes("embed").size());
  run_on(ctx, source->async_read_into({"embed"}, out, asio::use_awaitable));
  CHECK(out == ck.bytes("embed"));
  CHECK_FALSE(source->pool().populated());
  CHECK(uring.registered_bytes() == 0);
}

TEST_CASE(
    "page-cache guard lock – a file's guarded reads go one at a time until its server answered some in full, and for "
    "good once it answered one short",
    "[io][read]") {
  using namespace std::chrono_literals;
  PageCacheGuardLock g;
  // Whether a hold taken on another thread waits for `held` to go: it must not be ready
  // within 50 ms while `held` is kept, and be ready once it is released.
  const auto waits_for = [&](PageCacheGuardLock::Hold held, bool check) {
    auto other = std::async(std::launch::async, [&] { return check ? g.hold_for_check() : g.hold_for_read(); });
    const bool waited = other.wait_for(50ms) == std::future_status::timeout;
    held = PageCacheGuardLock::Hold();
    REQUIRE(other.wait_for(30s) == std::future_status::ready);
    return waited;
  };
  SECTION("on trial, then shared, then alone for good") {
    CHECK(g.serial());
    CHECK(g.hold_for_read().alone());
    CHECK(waits_for(g.hold_for_read(), false));  // the first reads go one at a time
    CHECK(waits_for(g.hold_for_read(), true));   // and an attribute check waits for a read
    CHECK(g.hold_for_check().alone());
    for (unsigned i = 1; i < PageCacheGuardLock::reads_to_trust; ++i) g.answered_in_full();
    CHECK(g.serial());
    g.answered_in_full();
    CHECK_FALSE(g.serial());
    {
      PageCacheGuardLock::Hold a = g.hold_for_read(), b = g.hold_for_read();  // reads share it
      CHECK((a.held() && !a.alone() && b.held() && !b.alone()));
      CHECK_FALSE(g.hold_for_check().held());  // a check takes nothing
      CHECK(g.go_serial());                    // a read sharing the lock saw a fallback
    }
    CHECK(g.serial());
    for (int i = 0; i < 100; ++i) g.answered_in_full();
    CHECK(g.serial());
    CHECK_FALSE(g.go_serial());  // logged once per file
    CHECK(waits_for(g.hold_for_read(), false));
  }
  SECTION("a short answer on trial keeps reads alone whatever full answers follow") {
    g.answered_in_full();
    CHECK(g.go_serial());
    for (int i = 0; i < 100; ++i) g.answered_in_full();
    CHECK(g.serial());
    CHECK(g.hold_for_check().alone());
  }
  SECTION("a read that waited through the trial shares the lock once the trial ended") {
    // What made SIGINT slow: reads queued to be alone during the trial kept waiting to be
    // alone, behind every read that shared the lock after it, until the load's end.
    PageCacheGuardLock::Hold first = g.hold_for_read();
    auto waiting = std::async(std::launch::async, [&] { return g.hold_for_read(); });
    REQUIRE(waiting.wait_for(50ms) == std::future_status::timeout);
    for (unsigned i = 0; i < PageCacheGuardLock::reads_to_trust; ++i) g.answered_in_full();
    first = PageCacheGuardLock::Hold();
    REQUIRE(waiting.wait_for(30s) == std::future_status::ready);
    PageCacheGuardLock::Hold waited = waiting.get();
    CHECK((waited.held() && !waited.alone()));
    auto another = std::async(std::launch::async, [&] { return g.hold_for_read(); });
    CHECK(another.wait_for(5s) == std::future_status::ready);  // it shares the lock with the read that waited
    waited = PageCacheGuardLock::Hold();
    CHECK_FALSE(another.get().alone());
  }
}
