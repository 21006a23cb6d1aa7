// io::ByteSource has two models: the local-file CheckpointSource and the in-memory
// test::VectorSource. Generic code written against the concept alone reads the same bytes
// from both, in all three ways (into memory, one lease, a chunk stream), so the concept is
// what a caller needs and not one class's shape.
#include "eredu/io/reading/byte_source.hpp"

#include <asio/io_context.hpp>
#include <asio/use_awaitable.hpp>
#include <catch2/catch.hpp>

#include "eredu/core/error.hpp"
#include "eredu/io/reading/checkpoint_source.hpp"
#include "io/read_fixture.hpp"
#include "support/vector_source.hpp"

using namespace eredu;
using namespace eredu::io;

static_assert(ByteSource<CheckpointSource>);
static_assert(ByteSource<test::VectorSource>);
static_assert(LeaseStream<ChunkStream>);
static_assert(LeaseStream<test::VectorChunks>);
static_assert(!ByteSource<int>);
static_assert(!ByteSource<Catalog>);

namespace {

/// What each of the three reads of `request` delivered.
struct ThreeReads {
  std::vector<std::byte> into, lease, streamed;
  std::size_t chunks = 0;
};

/// Reads `request` three ways through the concept alone.
template <ByteSource S>
asio::awaitable<ThreeReads> read_three_ways(S& source, TensorReadRequest request) {
  ThreeReads out;
  out.into.resize(source.selected_bytes(request));
  co_await source.async_read_into(request, std::span(out.into), asio::use_awaitable);
  Lease lease = co_await source.async_read(request, asio::use_awaitable);
  out.lease.assign(lease.bytes().begin(), lease.bytes().end());
  lease.release();
  auto chunks = source.stream(request);
  while (std::optional<Lease> chunk = co_await chunks.async_next(asio::use_awaitable)) {
    out.streamed.insert(out.streamed.end(), chunk->bytes().begin(), chunk->bytes().end());
    ++out.chunks;
  }
  co_return out;
}

struct Fixture {
  std::vector<synth::TensorSpec> specs{{"rows", DType::F32, {64, 33}}, {"bytes", DType::U8, {5000}}};
  std::vector<std::vector<std::byte>> data = test::random_tensor_bytes(specs, 11);
};

}  // namespace

TEST_CASE("a generic reader gets the same bytes from a file source and an in-memory source") {
  Fixture f;
  test::TempDir dir;
  const auto path = dir / "model.safetensors";
  synth::write_safetensors(path, f.specs, test::spans_of(f.data));
  asio::io_context ctx;
  SourceOptions options;
  options.pool = {.budget = std::size_t{1} << 20, .huge_pages = false, .prefault = false};
  options.chunk_bytes = 4096;
  auto file = CheckpointSource::open(ctx.get_executor(), path, options);
  test::VectorSource memory(ctx.get_executor(), std::size_t{1} << 20, 4096);
  for (std::size_t i = 0; i < f.specs.size(); ++i)
    memory.add(f.specs[i].name, f.specs[i].dtype, f.specs[i].shape, f.data[i]);

  for (const Selection& sel : {Selection::all(), Selection{{{3, 40}, {0, 33}}}, Selection{{{0, 64}, {5, 9}}}}) {
    TensorReadRequest request{"rows", sel};
    const std::vector<std::byte> expected = test::select_bytes(f.data[0], f.specs[0].shape, DType::F32, sel);
    const ThreeReads from_file = test::run_on(ctx, read_three_ways(*file, request));
    const ThreeReads from_memory = test::run_on(ctx, read_three_ways(memory, request));
    CHECK(from_file.into == expected);
    CHECK(from_file.lease == expected);
    CHECK(from_file.streamed == expected);
    CHECK(from_memory.into == expected);
    CHECK(from_memory.lease == expected);
    CHECK(from_memory.streamed == expected);
    // Both stream in bounded chunks: more than one for the whole 8 KiB tensor.
    if (sel.is_all()) {
      CHECK(from_file.chunks > 1);
      CHECK(from_memory.chunks == (expected.size() + 4095) / 4096);
    }
  }
  TensorReadRequest whole{"bytes"};
  CHECK(test::run_on(ctx, read_three_ways(memory, whole)).streamed == f.data[1]);
  CHECK(memory.reads() > 0);
}

TEST_CASE("byte sources report an unknown tensor and a wrong destination as typed errors") {
  asio::io_context ctx;
  test::VectorSource memory(ctx.get_executor(), std::size_t{1} << 20, 4096);
  const std::vector<std::byte> four(4, std::byte{1});
  memory.add("w", DType::U8, {4}, four);
  TensorReadRequest missing{"nope"};
  CHECK_THROWS_AS(memory.selected_bytes(missing), Error);
  std::vector<std::byte> small(3);
  TensorReadRequest w{"w"};
  try {
    test::run_on(ctx, memory.async_read_into(w, std::span(small), asio::use_awaitable));
    FAIL("a destination of the wrong size was accepted");
  } catch (const Error& e) {
    CHECK(e.kind() == errc::invalid_argument);
  }
}

TEST_CASE("sources declare their capabilities: a file source maps and windows, an in-memory one only reads") {
  Fixture f;
  test::TempDir dir;
  const auto path = dir / "model.safetensors";
  synth::write_safetensors(path, f.specs, test::spans_of(f.data));
  asio::io_context ctx;
  SourceOptions options;
  options.pool = {.budget = std::size_t{1} << 20, .huge_pages = false, .prefault = false};
  options.reader.kind = ReaderKind::pread;
  options.reader.depth = 7;
  options.reader.max_request = std::size_t{1} << 16;
  auto file = CheckpointSource::open(ctx.get_executor(), path, options);
  const SourceCapabilities caps = file->capabilities();
  CHECK(caps.request_bytes == options.reader.max_request);
  CHECK(caps.concurrency == 7);
  CHECK(caps.trusted_errors);
  // The direct-window capability follows the reader: whether this file system takes O_DIRECT.
  CHECK(caps.direct_windows == (caps.window_alignment != 0));
  TensorReadRequest rows{"rows"};
  // A whole tensor is one run: a source that declares it maps pages maps it, one that does
  // not never does.
  CHECK(caps.maps_pages == file->map_tensor(rows).has_value());

  options.reader.direct = DirectMode::off;
  CHECK_FALSE(CheckpointSource::open(ctx.get_executor(), path, options)->capabilities().direct_windows);

  test::VectorSource memory(ctx.get_executor(), std::size_t{1} << 20, 512);
  memory.add("rows", DType::U8, {4}, std::vector<std::byte>(4));
  const SourceCapabilities none = memory.capabilities();
  CHECK_FALSE(none.maps_pages);
  CHECK_FALSE(none.direct_windows);
  CHECK(none.request_bytes == 512);
  CHECK_FALSE(memory.map_tensor(rows));
  CHECK_FALSE(memory.map_resident(rows));
  CHECK_FALSE(memory.direct_window(rows));
}
