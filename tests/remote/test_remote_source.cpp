// A checkpoint behind a URL read through CheckpointSource, against nginx serving a directory:
// the same catalog and the same bytes as the local files, sharded and single, headers longer
// than the first GET, an object replaced after open (file_changed, never mixed bytes), missing
// objects and shards as typed errors, and the local cache (a hit is a local io_uring load).
#include <asio/io_context.hpp>
#include <asio/use_awaitable.hpp>
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <string>

#include "eredu/core/error.hpp"
#include "eredu/io/reading/checkpoint_source.hpp"
#include "eredu/synth/synthetic_checkpoint.hpp"
#include "io/read_fixture.hpp"
#include "remote/http_servers.hpp"
#include "support/error_kind.hpp"
#include "support/server_process.hpp"
#include "support/temp_dir.hpp"

using namespace eredu;
using namespace eredu::io;
namespace fs = std::filesystem;

namespace {

// nginx serving `root` over plain HTTP on loopback; the URL of `name` under it.
struct Served {
  explicit Served(const fs::path& root)
      : server({"python3", std::string(EREDU_REMOTE_SERVERS_DIR) + "/nginx.py", "--root", root.string()}) {}
  std::string url(const std::string& name) const {
    const std::string base = server.url().substr(0, server.url().find(' '));
    return base + "/" + name;
  }
  test::ServerProcess server;
};

std::vector<std::byte> read_whole(asio::io_context& ctx, CheckpointSource& source, const std::string& name) {
  Lease lease = test::run_on(ctx, source.async_read({name}, asio::use_awaitable));
  return {lease.bytes().begin(), lease.bytes().end()};
}

// Every tensor of `remote` equals the same tensor of `local`, and the catalogs agree.
void check_same(asio::io_context& ctx, CheckpointSource& local, CheckpointSource& remote) {
  REQUIRE(remote.catalog().size() == local.catalog().size());
  CHECK(remote.catalog().metadata() == local.catalog().metadata());
  REQUIRE(remote.catalog().files().size() == local.catalog().files().size());
  for (const auto& t : local.catalog().tensors()) {
    CAPTURE(t.name);
    const TensorInfo& r = remote.catalog().at(t.name);
    CHECK(r.dtype == t.dtype);
    CHECK(r.shape == t.shape);
    CHECK(r.offset == t.offset);
    CHECK(read_whole(ctx, remote, t.name) == read_whole(ctx, local, t.name));
  }
  CHECK(remote.pool().in_use() == 0);
}

SourceOptions small_pool() {
  SourceOptions o;
  o.pool.budget = std::size_t{8} << 20;
  o.remote.part_bytes = 64 << 10;  // several parts per tensor, in flight together
  o.remote.concurrency = 4;
  return o;
}

}  // namespace

TEST_CASE("remote source – a sharded checkpoint over HTTP reads the files' exact bytes", "[remote-source]") {
  test::TempDir dir;
  synth::write_synthetic(dir / "ck", {.target_bytes = 3 << 20, .shards = 3, .seed = 5, .layers = 2});
  Served served(dir / "ck");
  EREDU_REQUIRE_SERVER(served.server);
  asio::io_context ctx;
  auto local = CheckpointSource::open(ctx.get_executor(), dir / "ck", small_pool());
  SECTION("through its index") {
    auto remote = CheckpointSource::open(ctx.get_executor(), served.url("model.safetensors.index.json"), small_pool());
    CHECK(remote->reader().name() == "http");
    CHECK(remote->catalog().files()[0].path.starts_with("http://127.0.0.1:"));
    check_same(ctx, *local, *remote);
  }
  SECTION("one shard, its header longer than the first GET") {
    SourceOptions o = small_pool();
    o.remote.header_probe_bytes = 64;  // the header takes a second GET
    const std::string shard = local->catalog().files()[1].path;
    auto one_local = CheckpointSource::open(ctx.get_executor(), shard, small_pool());
    auto remote = CheckpointSource::open(ctx.get_executor(), served.url(fs::path(shard).filename().string()), o);
    check_same(ctx, *one_local, *remote);
  }
}

TEST_CASE("remote source – an object replaced after open fails with file_changed, never mixed bytes",
          "[remote-source]") {
  test::TempDir dir;
  synth::write_synthetic(dir / "m.safetensors", {.target_bytes = 1 << 20, .seed = 9, .layers = 1});
  Served served(dir.path());
  EREDU_REQUIRE_SERVER(served.server);
  asio::io_context ctx;
  auto remote = CheckpointSource::open(ctx.get_executor(), served.url("m.safetensors"), small_pool());
  const TensorInfo& t = remote->catalog().tensors().back();
  // Same size, other bytes, later mtime: nginx's ETag (mtime-size) changes.
  synth::write_synthetic(dir / "next.safetensors", {.target_bytes = 1 << 20, .seed = 10, .layers = 1});
  fs::last_write_time(dir / "next.safetensors", fs::file_time_type::clock::now() + std::chrono::seconds(5));
  fs::rename(dir / "next.safetensors", dir / "m.safetensors");
  try {
    read_whole(ctx, *remote, t.name);
    FAIL("a read of a replaced object succeeded");
  } catch (const Error& e) {
    CHECK(e.kind() == errc::file_changed);
    CHECK(e.context().tensor == t.name);
    CHECK(e.context().file.starts_with("http://127.0.0.1:"));
  }
}

TEST_CASE("remote source – missing objects and shards are typed errors naming the URL", "[remote-source]") {
  test::TempDir dir;
  synth::write_synthetic(dir / "ck", {.target_bytes = 2 << 20, .shards = 2, .seed = 3, .layers = 1});
  Served served(dir.path());
  EREDU_REQUIRE_SERVER(served.server);
  asio::io_context ctx;
  CHECK(test::kind_of([&] { CheckpointSource::open(ctx.get_executor(), served.url("nothing.safetensors")); }) ==
        errc::remote_not_found);
  fs::remove(dir / "ck" / synth::shard_file_name(1, 2));
  try {
    CheckpointSource::open(ctx.get_executor(), served.url("ck/model.safetensors.index.json"));
    FAIL("opened a checkpoint with a shard missing");
  } catch (const Error& e) {
    CHECK(e.kind() == errc::shard_missing);
    CHECK(std::string(e.what()).find(synth::shard_file_name(1, 2)) != std::string::npos);
  }
}

TEST_CASE("remote source – with a cache, objects are fetched once and then read as local files",
          "[remote-source][cache]") {
  test::TempDir dir, cache;
  synth::write_synthetic(dir / "ck", {.target_bytes = 2 << 20, .shards = 2, .seed = 4, .layers = 1});
  Served served(dir / "ck");
  EREDU_REQUIRE_SERVER(served.server);
  asio::io_context ctx;
  auto local = CheckpointSource::open(ctx.get_executor(), dir / "ck", small_pool());
  SourceOptions o = small_pool();
  o.remote.cache_dir = cache.path();
  for (int round = 0; round < 2; ++round) {
    CAPTURE(round);
    auto remote = CheckpointSource::open(ctx.get_executor(), served.url("model.safetensors.index.json"), o);
    CHECK(remote->reader().name() != "http");  // the cache's copies, read with io_uring (or pread)
    CHECK(remote->catalog().files()[0].path.starts_with("http://127.0.0.1:"));  // messages name the URL
    check_same(ctx, *local, *remote);
  }
  // Each shard is in the cache once, byte for byte.
  for (const auto& f : local->catalog().files()) {
    std::ifstream in(f.path, std::ios::binary);
    const std::string want((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::size_t copies = 0;
    for (const auto& e : fs::recursive_directory_iterator(cache.path())) {
      if (!e.is_regular_file() || e.file_size() != want.size()) continue;
      std::ifstream c(e.path(), std::ios::binary);
      copies += std::string((std::istreambuf_iterator<char>(c)), std::istreambuf_iterator<char>()) == want;
    }
    CHECK(copies == 1);
  }
}
