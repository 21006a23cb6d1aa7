// io::Checksums: digests from metadata and sidecars, their validation, and verification
// through a source catching a tensor whose bytes changed.
#include "eredu/io/checksums.hpp"

#include <asio/thread_pool.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/use_future.hpp>
#include <catch2/catch.hpp>
#include <cerrno>
#include <chrono>
#include <future>

#include "eredu/core/error.hpp"
#include "eredu/io/open_catalog.hpp"
#include "eredu/io/sha256.hpp"
#include "eredu/synth/safetensors_writer.hpp"
#include "io/read_fixture.hpp"

using namespace eredu;
using namespace eredu::io;

namespace {

struct Fixture {
  test::TempDir dir;
  std::filesystem::path path = dir / "model.safetensors";
  std::vector<synth::TensorSpec> specs{{"a", DType::F32, {300, 17}}, {"b", DType::BF16, {9}}};
  std::vector<std::vector<std::byte>> data = test::random_tensor_bytes(specs, 3);

  explicit Fixture(const Metadata& metadata = {}) {
    synth::write_safetensors(path, specs, test::spans_of(data), metadata);
  }
  std::string digest(std::size_t i) const { return sha256_hex(data[i]); }
};

template <class Fn>
errc kind_of(Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.kind();
  }
  return errc{};
}

}  // namespace

TEST_CASE("checksums – metadata keys and sidecars are read and validated", "[io][checksums]") {
  Fixture f;
  Metadata metadata{{"sha256:a", f.digest(0)}, {"format", "pt"}};
  Fixture with_metadata(metadata);
  Catalog catalog = open_catalog(with_metadata.path);
  Checksums from_meta = Checksums::from_metadata(catalog);
  REQUIRE(from_meta.size() == 1);
  CHECK(*from_meta.find("a") == f.digest(0));

  CHECK(Checksums::sidecar_path(f.path) == f.dir / "model.safetensors.sha256.json");
  CHECK(Checksums::sidecar_path(f.dir.path()) == f.dir / "checksums.sha256.json");

  Checksums sums;
  sums.add("a", f.digest(0));
  sums.add("b", f.digest(1));
  synth::write_text_file(Checksums::sidecar_path(f.path), sums.to_json());
  Checksums read_back = Checksums::from_sidecar(Checksums::sidecar_path(f.path));
  CHECK(read_back.digests() == sums.digests());

  auto sidecar = f.dir / "bad.json";
  synth::write_text_file(sidecar, R"({"a": "abc"})");
  CHECK(kind_of([&] { Checksums::from_sidecar(sidecar); }) == errc::invalid_metadata);
  synth::write_text_file(sidecar, R"(["a"])");
  CHECK(kind_of([&] { Checksums::from_sidecar(sidecar); }) == errc::invalid_metadata);
  synth::write_text_file(sidecar, R"({"a": )");
  CHECK(kind_of([&] { Checksums::from_sidecar(sidecar); }) == errc::invalid_metadata);
  CHECK(kind_of([&] { Checksums::from_sidecar(f.dir / "absent.json"); }) == errc::io_error);
  CHECK(kind_of([&] { sums.add("c", "not hex"); }) == errc::invalid_argument);
  Metadata bad_meta{{"sha256:a", "123"}};
  Fixture bad(bad_meta);
  CHECK(kind_of([&] { Checksums::from_metadata(open_catalog(bad.path)); }) == errc::invalid_metadata);

  // Metadata and sidecar must agree where both speak.
  Metadata other{{"sha256:b", f.digest(0)}};  // a wrong digest for b
  Fixture disagree(other);
  synth::write_text_file(Checksums::sidecar_path(disagree.path), sums.to_json());
  CHECK(kind_of([&] { Checksums::discover(disagree.path, open_catalog(disagree.path)); }) == errc::invalid_metadata);
}

TEST_CASE("checksums – verification reads through the source and names a changed tensor", "[io][checksums]") {
  Fixture f;
  asio::io_context ctx;
  SourceOptions options;
  options.pool.budget = 64 << 10;
  options.chunk_bytes = 8 << 10;  // "a" spans several chunks
  auto source = CheckpointSource::open(ctx.get_executor(), f.path, options);
  Checksums good;
  good.add("a", f.digest(0));
  good.add("b", f.digest(1));
  auto verify = [&](Checksums sums) {
    return test::run_on(ctx, [](CheckpointSource& s, Checksums c) -> asio::awaitable<std::uint64_t> {
      co_return co_await async_verify_checksums(s, std::move(c), asio::use_awaitable);
    }(*source, std::move(sums)));
  };
  CHECK(verify(good) == f.data[0].size() + f.data[1].size());

  Checksums wrong;
  wrong.add("a", f.digest(1));
  try {
    verify(wrong);
    FAIL("a wrong digest passed");
  } catch (const Error& e) {
    CHECK(e.kind() == errc::checksum_mismatch);
    CHECK(e.context().tensor == "a");
    CHECK(e.context().file == f.path.string());
  }
  Checksums unknown;
  unknown.add("zzz", f.digest(0));
  CHECK(kind_of([&] { verify(unknown); }) == errc::tensor_not_found);
  CHECK(source->pool().in_use() == 0);
}

TEST_CASE("checksums – a tensor larger than the whole staging pool is verified chunk by chunk", "[io][checksums]") {
  Fixture f;
  asio::io_context ctx;
  SourceOptions options;
  options.pool.budget = 8 << 10;  // "a" is 20 400 bytes: more than the pool
  options.chunk_bytes = 8 << 10;  // a chunk may take the whole pool
  auto source = CheckpointSource::open(ctx.get_executor(), f.path, options);
  Checksums sums;
  sums.add("a", f.digest(0));
  auto op = [](CheckpointSource& s, Checksums c) -> asio::awaitable<std::uint64_t> {
    co_return co_await async_verify_checksums(s, std::move(c), asio::use_awaitable);
  };
  auto done = asio::co_spawn(ctx, op(*source, sums), asio::use_future);
  // Bounded: a verification that waits for staging it holds itself would never finish.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (done.wait_for(std::chrono::seconds(0)) != std::future_status::ready &&
         std::chrono::steady_clock::now() < deadline) {
    ctx.restart();
    ctx.run_one_for(std::chrono::milliseconds(5));
  }
  REQUIRE(done.wait_for(std::chrono::seconds(0)) == std::future_status::ready);
  CHECK(done.get() == f.data[0].size());
  CHECK(source->pool().in_use() == 0);
}

TEST_CASE("checksums – a read error while a chunk is being hashed is reported, nothing leaks", "[io][checksums]") {
  Fixture f;
  struct FailSecondChunk final : FaultInjector {
    std::uint64_t at = 0;
    ReadFault on_complete(std::uint32_t, std::uint64_t offset, std::uint64_t length) override {
      return offset <= at && at < offset + length ? ReadFault{.error = EIO} : ReadFault{};
    }
  } faults;
  asio::io_context ctx;
  SourceOptions options;
  options.pool.budget = 64 << 10;
  options.chunk_bytes = 8 << 10;
  options.reader.faults = &faults;
  auto source = CheckpointSource::open(ctx.get_executor(), f.path, options);
  faults.at = source->catalog().at("a").offset + 12000;  // inside the second chunk
  Checksums sums;
  sums.add("a", f.digest(0));
  asio::thread_pool hashers(1);
  auto op = [](CheckpointSource& s, Checksums c, asio::any_io_executor h) -> asio::awaitable<std::uint64_t> {
    co_return co_await async_verify_checksums(s, std::move(c), h, asio::use_awaitable);
  };
  CHECK(kind_of([&] { test::run_on(ctx, op(*source, sums, hashers.get_executor())); }) == errc::io_error);
  CHECK(source->pool().in_use() == 0);
}
