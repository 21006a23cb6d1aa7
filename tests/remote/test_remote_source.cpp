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
    // Read outside CHECK: a failure must reach the caller, not become a failed check.
    const std::vector<std::byte> got = read_whole(ctx, remote, t.name);
    CHECK(got == read_whole(ctx, local, t.name));
  }
  CHECK(remote.pool().in_use() == 0);
}

SourceOptions small_pool() {
  SourceOptions o;
  o.pool.budget = std::size_t{8} << 20;
  // No idle-release timer: run_on() runs the loop until it has no work, and the timer is work.
  o.pool.release_after = std::chrono::milliseconds(0);
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

TEST_CASE("remote source – an s3:// prefix is listed and its sharded checkpoint read with signed requests",
          "[remote-source][s3]") {
  test::TempDir dir;
  synth::write_synthetic(dir / "models" / "tiny", {.target_bytes = 2 << 20, .shards = 2, .seed = 8, .layers = 1});
  test::ServerProcess server({"/usr/bin/python3", std::string(EREDU_REMOTE_SERVERS_DIR) + "/s3_server.py", "--root",
                              dir.path().string(), "--secret", "s3-source-secret", "--max-keys", "1"});
  EREDU_REQUIRE_SERVER(server);
  asio::io_context ctx;
  auto local = CheckpointSource::open(ctx.get_executor(), dir / "models" / "tiny", small_pool());
  // Credentials from the environment (the test's own process: restored at the end).
  ::setenv("AWS_ACCESS_KEY_ID", "S3RVER", 1);
  ::setenv("AWS_SECRET_ACCESS_KEY", "s3-source-secret", 1);
  struct Restore {
    ~Restore() {
      ::unsetenv("AWS_ACCESS_KEY_ID");
      ::unsetenv("AWS_SECRET_ACCESS_KEY");
    }
  } restore;
  SourceOptions o = small_pool();
  o.remote.s3.endpoint = server.url();
  o.remote.s3.region = "us-east-1";
  SECTION("signed: the prefix's index found by listing (one key per page), every tensor exact") {
    auto remote = CheckpointSource::open(ctx.get_executor(), "s3://eredu-test/models/tiny/", o);
    CHECK(remote->catalog().files()[0].path.starts_with("s3://eredu-test/models/tiny/"));
    check_same(ctx, *local, *remote);
  }
  SECTION("a wrong secret is access_denied, naming the object and not the secret") {
    ::setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret", 1);
    try {
      CheckpointSource::open(ctx.get_executor(), "s3://eredu-test/models/tiny/model.safetensors.index.json", o);
      FAIL("a request with a wrong signature was accepted");
    } catch (const Error& e) {
      CHECK(e.kind() == errc::access_denied);
      CHECK(std::string(e.what()).find("not-the-secret") == std::string::npos);
    }
  }
  SECTION("a prefix without a checkpoint is unknown_format; an empty one remote_not_found") {
    CHECK(test::kind_of([&] { CheckpointSource::open(ctx.get_executor(), "s3://eredu-test/models/", o); }) ==
          errc::unknown_format);
    CHECK(test::kind_of([&] { CheckpointSource::open(ctx.get_executor(), "s3://eredu-test/nothing/", o); }) ==
          errc::remote_not_found);
  }
}

TEST_CASE("remote source – fault matrix: every fault gives the file's bytes or a typed error, never wrong bytes",
          "[remote-source][faults]") {
  struct Case {
    const char* mode;
    int count;    // faulted requests (the first ones: the header GET, then tensor parts); -1: all
    errc expect;  // errc{}: the exact bytes after retries
  };
  const Case cases[] = {
      {"replace", 1, errc::file_changed},
      {"reset", 3, errc{}},
      {"short", 3, errc{}},
      {"503", 3, errc{}},
      {"429", 2, errc{}},
      {"stall", 2, errc{}},
      {"reset", -1, errc::remote_error},
      {"503", -1, errc::remote_error},
      {"stall", -1, errc::timed_out},
      {"ignore_range", -1, errc::range_unsupported},
      {"403", -1, errc::access_denied},
      {"404", -1, errc::remote_not_found},
  };
  test::TempDir dir;
  synth::write_synthetic(dir / "m.safetensors", {.target_bytes = 1 << 20, .seed = 12, .layers = 1});
  synth::write_synthetic(dir / "other.safetensors", {.target_bytes = 1 << 20, .seed = 13, .layers = 1});
  // nginx's ETag is the modification time (seconds) and the size: same-size files written in the
  // same second would share it (docs/remote.md says what an ETag can and cannot tell).
  fs::last_write_time(dir / "other.safetensors", fs::last_write_time(dir / "m.safetensors") + std::chrono::seconds(7));
  Served served(dir.path());
  EREDU_REQUIRE_SERVER(served.server);
  asio::io_context ctx;
  auto local = CheckpointSource::open(ctx.get_executor(), dir / "m.safetensors", small_pool());
  for (const Case& c : cases) {
    CAPTURE(c.mode, c.count);
    std::vector<std::string> extra;
    if (std::string(c.mode) == "replace") extra = {"--replace-path", "/other.safetensors"};
    // A stall sends nothing at all: libcurl averages the speed over seconds, so bytes sent before
    // a stall would stretch each attempt's timeout well past the 1 s window.
    const std::size_t after = std::string(c.mode) == "stall" ? 0 : 1000;
    auto proxy = test::fault_proxy(served.url("").substr(0, served.url("").size() - 1), c.mode, c.count, after, extra);
    EREDU_REQUIRE_SERVER(*proxy);
    SourceOptions o = small_pool();
    o.remote.http.max_retries = 3;
    o.remote.http.backoff_initial = std::chrono::milliseconds(10);
    o.remote.http.backoff_max = std::chrono::milliseconds(50);
    o.remote.http.low_speed_bytes = 1;
    o.remote.http.low_speed_window = std::chrono::seconds(1);
    errc got{};
    try {
      auto remote = CheckpointSource::open(ctx.get_executor(), proxy->url() + "/m.safetensors", o);
      check_same(ctx, *local, *remote);
    } catch (const Error& e) {
      got = e.kind();
      CHECK(std::string(e.what()).find("127.0.0.1") != std::string::npos);  // it names the URL
    }
    CHECK(got == c.expect);
  }
}
