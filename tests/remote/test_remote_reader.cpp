// RemoteReader against nginx and the fault proxy: byte-exact batches split into parts, the
// concurrency bound, a changed object, a truncated one, the first failure stopping the rest,
// cancel and destruction.
#include <catch2/catch.hpp>

#include <chrono>
#include <cstring>
#include <future>
#include <thread>

#include "../../io/src/remote/remote_reader.hpp"
#include "eredu/core/error.hpp"
#include "eredu/io/remote/http_client.hpp"
#include "http_servers.hpp"
#include "support/error_kind.hpp"

using namespace eredu;
using namespace eredu::io;
using namespace std::chrono_literals;

namespace {

HttpOptions reader_http_options() {
  HttpOptions o;
  o.max_transfers = 8;
  o.connect_timeout = 2000ms;
  o.max_retries = 2;
  o.backoff_initial = 5ms;
  o.backoff_max = 20ms;
  o.low_speed_window = 30s;  // a stall here ends by cancellation only
  return o;
}

// The object at `url`, its ETag and size asked of the server.
io::detail::RemoteObject object_at(HttpClient& client, const std::string& url, const std::string& probe_url = {}) {
  std::byte one[1];
  const RangeResult r =
      client.get_blocking(RangeGet{.url = probe_url.empty() ? url : probe_url, .offset = 0, .dest = one});
  return io::detail::RemoteObject{.url = url, .display = url, .etag = r.etag, .size = r.object_size};
}

// Runs one batch to its end (at most `limit`), returning its failure.
std::exception_ptr run_batch(Reader& reader, std::vector<ReadSegment> segments, std::chrono::seconds limit = 20s) {
  std::promise<std::exception_ptr> done;
  reader.read(
      std::move(segments), [&](std::exception_ptr e) { done.set_value(e); }, Reader::new_batch_id());
  auto f = done.get_future();
  REQUIRE(f.wait_for(limit) == std::future_status::ready);
  return f.get();
}

// The proxy's counters (requests, active, max_active).
int proxy_counter(HttpClient& client, const std::string& proxy_url, const std::string& name) {
  const std::string body = client.get_blocking(DocumentGet{.url = proxy_url + "/__stats"}).body;
  const auto at = body.find("\"" + name + "\": ");
  REQUIRE(at != std::string::npos);
  return std::stoi(body.substr(at + name.size() + 4));
}

}  // namespace

TEST_CASE("a batch of segments over two objects lands byte-exact, in parts", "[remote-reader]") {
  test::NginxDir served;
  const auto a = served.add("a.bin", 300'000, 11);
  const auto b = served.add("b.bin", 100'000, 12);
  served.start();
  EREDU_REQUIRE_SERVER(served.server());
  HttpClient client(reader_http_options());
  io::detail::RemoteReader reader(
      client, {object_at(client, served.url() + "/a.bin"), object_at(client, served.url() + "/b.bin")}, 16 << 10, 3);
  CHECK(reader.name() == "http");
  const std::string line = reader.describe();
  CHECK(line.find("127.0.0.1") != std::string::npos);
  CHECK(line.find("16384") != std::string::npos);
  CHECK(line.find("3 in flight") != std::string::npos);

  std::vector<std::byte> out(500'000, std::byte{0xa5});
  std::vector<ReadSegment> segs{
      {.file = 0, .offset = 0, .dest = out.data(), .length = 100'000},
      {.file = 1, .offset = 5, .dest = out.data() + 100'000, .length = 99'995},
      {.file = 0, .offset = 250'000, .dest = out.data() + 200'000, .length = 50'000},
      {.file = 0, .offset = 123'457, .dest = out.data() + 250'000, .length = 1},
      // A window past the object's end: only its required part exists.
      {.file = 1, .offset = 90'000, .dest = out.data() + 260'000, .length = 20'000, .required = 10'000},
  };
  CHECK_FALSE(run_batch(reader, segs));
  CHECK(std::memcmp(out.data(), a.data(), 100'000) == 0);
  CHECK(std::memcmp(out.data() + 100'000, b.data() + 5, 99'995) == 0);
  CHECK(std::memcmp(out.data() + 200'000, a.data() + 250'000, 50'000) == 0);
  CHECK(out[250'000] == a[123'457]);
  CHECK(std::memcmp(out.data() + 260'000, b.data() + 90'000, 10'000) == 0);
  const ReaderStats s = reader.stats();
  // 100,000/16 KiB -> 7 parts, 99,995 -> 7, 50,000 -> 4, 1 -> 1, 10,000 -> 1.
  CHECK(s.requests == 20);
  CHECK(s.bytes == 100'000 + 99'995 + 50'000 + 1 + 10'000);
  CHECK(client.stats().connections <= 3);
}

TEST_CASE("at most `concurrency` parts are in flight", "[remote-reader]") {
  test::NginxDir served;
  const auto a = served.add("a.bin", 200'000, 13);
  served.start();
  EREDU_REQUIRE_SERVER(served.server());
  auto proxy = test::fault_proxy(served.url(), "pass", 0, 0, {"--delay-ms", "40"});
  EREDU_REQUIRE_SERVER(*proxy);
  HttpClient client(reader_http_options());
  io::detail::RemoteReader reader(client, {object_at(client, proxy->url() + "/a.bin")}, 8192, 3);
  std::vector<std::byte> out(200'000);
  CHECK_FALSE(run_batch(reader, {{.file = 0, .offset = 0, .dest = out.data(), .length = out.size()}}));
  CHECK(std::memcmp(out.data(), a.data(), out.size()) == 0);
  CHECK(proxy_counter(client, proxy->url(), "requests") == 1 + 25);  // the probe, then 25 parts
  const int most = proxy_counter(client, proxy->url(), "max_active");
  CHECK(most <= 3);
  CHECK(most >= 2);  // 40 ms each: they did overlap
}

TEST_CASE("a changed object fails the batch with file_changed", "[remote-reader]") {
  test::NginxDir served;
  served.add("a.bin", 100'000, 14);
  served.add("b.bin", 100'001, 15);  // another size: another ETag
  served.start();
  EREDU_REQUIRE_SERVER(served.server());
  // The probe passes; every later request is answered from b.bin.
  auto proxy = test::fault_proxy(served.url(), "replace", 1, 0, {"--replace-path", "/b.bin"});
  EREDU_REQUIRE_SERVER(*proxy);
  HttpClient client(reader_http_options());
  io::detail::RemoteReader reader(client, {object_at(client, proxy->url() + "/a.bin")}, 8192, 1);
  std::vector<std::byte> out(30'000);
  const std::exception_ptr e = run_batch(reader, {{.file = 0, .offset = 0, .dest = out.data(), .length = out.size()}});
  CHECK(test::kind_of(e) == errc::file_changed);
  try {
    std::rethrow_exception(e);
  } catch (const Error& err) {
    CHECK(err.context().file == proxy->url() + "/a.bin");
  }
  // The first failure dropped the queued parts: one part was asked for, not four.
  CHECK(proxy_counter(client, proxy->url(), "requests") == 2);
}

TEST_CASE("an object shorter than pinned is unexpected_eof, naming it and the offset", "[remote-reader]") {
  test::NginxDir served;
  served.add("a.bin", 10'000, 16);
  served.start();
  EREDU_REQUIRE_SERVER(served.server());
  HttpClient client(reader_http_options());
  io::detail::RemoteObject o = object_at(client, served.url() + "/a.bin");
  o.display = "s3://bucket/a.bin";
  o.size = 20'000;  // as an index that promised more says
  io::detail::RemoteReader reader(client, {o}, 4096, 2);
  std::vector<std::byte> out(8000);
  std::exception_ptr e = run_batch(reader, {{.file = 0, .offset = 6000, .dest = out.data(), .length = 8000}});
  REQUIRE(test::kind_of(e) == errc::unexpected_eof);
  try {
    std::rethrow_exception(e);
  } catch (const Error& err) {
    CHECK(err.context().file == "s3://bucket/a.bin");
    REQUIRE(err.context().offset.has_value());
    CHECK(*err.context().offset == 10'000);
  }
  // Past the pinned size: refused without a request.
  const auto before = reader.stats().requests;
  e = run_batch(reader, {{.file = 0, .offset = 19'000, .dest = out.data(), .length = 2000}});
  CHECK(test::kind_of(e) == errc::unexpected_eof);
  CHECK(reader.stats().requests == before);
}

TEST_CASE("cancel, a failing part and destruction stop stalled batches promptly", "[remote-reader]") {
  test::NginxDir served;
  served.add("a.bin", 200'000, 17);
  served.start();
  EREDU_REQUIRE_SERVER(served.server());
  auto proxy = test::fault_proxy(served.url(), "stall", -1, 100);
  EREDU_REQUIRE_SERVER(*proxy);
  HttpClient client(reader_http_options());
  // Probed past the proxy, which stalls every GET.
  const io::detail::RemoteObject stalled = object_at(client, proxy->url() + "/a.bin", served.url() + "/a.bin");
  std::vector<std::byte> out(200'000);
  const std::vector<ReadSegment> all{{.file = 0, .offset = 0, .dest = out.data(), .length = out.size()}};

  SECTION("cancel") {
    io::detail::RemoteReader reader(client, {stalled}, 20'000, 2);
    std::promise<std::exception_ptr> done;
    const BatchId id = Reader::new_batch_id();
    reader.read(
        all, [&](std::exception_ptr e) { done.set_value(e); }, id);
    std::this_thread::sleep_for(300ms);
    CHECK(proxy_counter(client, proxy->url(), "active") == 2);  // 2 of 10 parts asked
    const auto t0 = std::chrono::steady_clock::now();
    reader.cancel(id);
    auto f = done.get_future();
    REQUIRE(f.wait_for(2s) == std::future_status::ready);
    CHECK(test::kind_of(f.get()) == errc::cancelled);
    CHECK(std::chrono::steady_clock::now() - t0 < 2s);
    reader.cancel(id);  // harmless once completed
  }
  SECTION("the first failure cancels the other parts") {
    io::detail::RemoteObject missing = stalled;
    missing.url = served.url() + "/missing.bin";
    io::detail::RemoteReader reader(client, {stalled, missing}, 20'000, 4);
    // The failing part goes first, beside three stalled ones.
    std::vector<ReadSegment> segs{{.file = 1, .offset = 0, .dest = out.data(), .length = 100}};
    segs.insert(segs.end(), all.begin(), all.end());
    const auto t0 = std::chrono::steady_clock::now();
    CHECK(test::kind_of(run_batch(reader, segs, 5s)) == errc::remote_not_found);
    CHECK(std::chrono::steady_clock::now() - t0 < 3s);
  }
  SECTION("destruction") {
    std::promise<std::exception_ptr> done;
    const auto t0 = std::chrono::steady_clock::now();
    {
      io::detail::RemoteReader reader(client, {stalled}, 20'000, 2);
      reader.read(
          all, [&](std::exception_ptr e) { done.set_value(e); }, Reader::new_batch_id());
      std::this_thread::sleep_for(200ms);
    }
    auto f = done.get_future();
    REQUIRE(f.wait_for(0s) == std::future_status::ready);
    CHECK(test::kind_of(f.get()) == errc::cancelled);
    CHECK(std::chrono::steady_clock::now() - t0 < 3s);
  }
}
