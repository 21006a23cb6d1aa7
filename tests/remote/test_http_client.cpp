// HttpClient against nginx (plain and TLS with HTTP/2) and the fault proxy in front of it:
// byte-exact ranges, connection reuse, the status mapping, retries that resume, stalls,
// cancellation and destruction with transfers in flight.
#include <catch2/catch.hpp>

#include <algorithm>
#include <asio/io_context.hpp>
#include <atomic>
#include <chrono>
#include <cstring>
#include <future>
#include <mutex>
#include <random>
#include <thread>

#include "eredu/core/error.hpp"
#include "eredu/io/remote/http_client.hpp"
#include "http_servers.hpp"
#include "support/error_kind.hpp"

using namespace eredu;
using namespace eredu::io;
using namespace std::chrono_literals;
using eredu::test::error_of;

namespace {

// Small limits: every fault resolves in well under a second.
HttpOptions quick_options() {
  HttpOptions o;
  o.max_transfers = 4;
  o.connect_timeout = 2000ms;
  o.max_retries = 3;
  o.backoff_initial = 5ms;
  o.backoff_max = 20ms;
  o.low_speed_bytes = 1000;
  o.low_speed_window = 1s;
  return o;
}

bool same(std::span<const std::byte> got, const std::vector<std::byte>& data, std::uint64_t offset) {
  return offset + got.size() <= data.size() && std::memcmp(got.data(), data.data() + offset, got.size()) == 0;
}

// Counts the attempts it signed, and the URLs, to see what a retry and a redirect sign.
class CountingSigner final : public RequestSigner {
 public:
  HttpHeaders sign(std::string_view method, std::string_view url) const override {
    std::lock_guard lock(mutex_);
    urls_.emplace_back(url);
    return {{"x-eredu-test", std::string(method)}};
  }
  std::vector<std::string> urls() const {
    std::lock_guard lock(mutex_);
    return urls_;
  }

 private:
  mutable std::mutex mutex_;
  mutable std::vector<std::string> urls_;
};

}  // namespace

TEST_CASE("ranged GETs are byte-exact, concurrent, and reuse their connections", "[http]") {
  test::NginxDir served;
  const auto data = served.add("blob.bin", 1 << 20, 1);
  served.start();
  EREDU_REQUIRE_SERVER(served.server());
  HttpClient client(quick_options());
  const std::string url = served.url() + "/blob.bin";

  std::mt19937 gen(7);
  constexpr int n = 48;
  std::vector<std::vector<std::byte>> bufs(n);
  std::vector<std::uint64_t> offsets(n);
  std::vector<std::promise<RangeResult>> done(n);
  for (int i = 0; i < n; ++i) {
    offsets[i] = gen() % (data.size() - 1);
    bufs[i].resize(1 + gen() % std::min<std::uint64_t>(200'000, data.size() - offsets[i]));
    client.get(RangeGet{.url = url, .offset = offsets[i], .dest = bufs[i]},
               [&, i](std::exception_ptr e, RangeResult r) {
                 if (e) {
                   done[i].set_exception(e);
                 } else {
                   done[i].set_value(r);
                 }
               });
  }
  std::string etag;
  for (int i = 0; i < n; ++i) {
    const RangeResult r = done[i].get_future().get();
    CHECK(r.bytes == bufs[i].size());
    CHECK(r.object_size == data.size());
    CHECK(r.attempts == 1);
    CHECK(r.http_version == 1);
    CHECK_FALSE(r.etag.empty());
    if (etag.empty()) etag = r.etag;
    CHECK(r.etag == etag);
    CHECK(same(bufs[i], data, offsets[i]));
  }
  // Keep-alive: 48 GETs over at most max_transfers connections.
  const HttpStats s = client.stats();
  CHECK(s.requests == n);
  CHECK(s.retries == 0);
  CHECK(s.connections >= 1);
  CHECK(s.connections <= client.options().max_transfers);

  // The whole object asked for at once may come back as 200 or 206; a range past the end is
  // accepted short only when allowed.
  std::vector<std::byte> whole(data.size() + 100);
  const RangeResult r = client.get_blocking(RangeGet{.url = url, .offset = 0, .dest = whole, .allow_short = true});
  CHECK(r.bytes == data.size());
  CHECK(same(std::span(whole).first(r.bytes), data, 0));
  CHECK(test::kind_of([&] { client.get_blocking(RangeGet{.url = url, .offset = 0, .dest = whole}); }) ==
        errc::remote_error);
  // If-Match with the object's own ETag passes; another is file_changed (412).
  std::vector<std::byte> small(100);
  CHECK(client.get_blocking(RangeGet{.url = url, .offset = 5, .dest = small, .if_match = etag}).bytes == 100);
  CHECK(test::kind_of([&] {
          client.get_blocking(RangeGet{.url = url, .offset = 5, .dest = small, .if_match = "\"other\""});
        }) == errc::file_changed);
}

TEST_CASE("document GETs return the body, within max_bytes", "[http]") {
  test::NginxDir served;
  const auto data = served.add("index.json", 5000, 2);
  served.start();
  EREDU_REQUIRE_SERVER(served.server());
  HttpClient client(quick_options());
  const DocumentResult d = client.get_blocking(DocumentGet{.url = served.url() + "/index.json"});
  REQUIRE(d.body.size() == data.size());
  CHECK(std::memcmp(d.body.data(), data.data(), data.size()) == 0);
  CHECK_FALSE(d.etag.empty());
  CHECK(test::kind_of([&] {
          client.get_blocking(DocumentGet{.url = served.url() + "/index.json", .max_bytes = 4999});
        }) == errc::remote_error);
}

TEST_CASE("HTTPS verifies against the given CA and negotiates HTTP/2", "[http]") {
  test::NginxDir served(true);
  const auto data = served.add("blob.bin", 300'000, 3);
  served.start();
  EREDU_REQUIRE_SERVER(served.server());
  REQUIRE_FALSE(served.ca_file().empty());
  const std::string url = served.url() + "/blob.bin";

  HttpOptions o = quick_options();
  o.ca_file = served.ca_file();
  {
    HttpClient client(o);
    std::vector<std::vector<std::byte>> bufs(16, std::vector<std::byte>(10'000));
    std::vector<std::promise<RangeResult>> done(bufs.size());
    for (std::size_t i = 0; i < bufs.size(); ++i) {
      client.get(RangeGet{.url = url, .offset = i * 17'000, .dest = bufs[i]},
                 [&, i](std::exception_ptr e, RangeResult r) {
                   if (e) {
                     done[i].set_exception(e);
                   } else {
                     done[i].set_value(r);
                   }
                 });
    }
    for (std::size_t i = 0; i < bufs.size(); ++i) {
      const RangeResult r = done[i].get_future().get();
      CHECK(r.http_version == 2);
      CHECK(same(bufs[i], data, i * 17'000));
    }
    // HTTP/2 multiplexes: the 16 GETs share few connections.
    CHECK(client.stats().connections <= 2);
  }
  {
    o.http2 = false;
    HttpClient client(o);
    std::vector<std::byte> buf(1000);
    CHECK(client.get_blocking(RangeGet{.url = url, .offset = 123, .dest = buf}).http_version == 1);
    CHECK(same(buf, data, 123));
  }
  {
    HttpClient client(quick_options());  // the system store does not know the test CA
    std::vector<std::byte> buf(1000);
    const Error e = error_of([&] { client.get_blocking(RangeGet{.url = url, .offset = 0, .dest = buf}); });
    CHECK(e.kind() == errc::tls_error);
    CHECK(client.stats().requests == 1);  // not retried
  }
}

TEST_CASE("statuses map to their error kinds, naming the URL without its query", "[http]") {
  test::NginxDir served;
  served.add("blob.bin", 10'000, 4);
  served.start();
  EREDU_REQUIRE_SERVER(served.server());
  HttpClient client(quick_options());
  std::vector<std::byte> buf(100);
  const Error e = error_of([&] {
    client.get_blocking(RangeGet{.url = served.url() + "/missing.bin?token=SECRET", .offset = 42, .dest = buf});
  });
  CHECK(e.kind() == errc::remote_not_found);
  CHECK(client.stats().requests == 1);
  const std::string what = e.what();
  CHECK(what.find("missing.bin") != std::string::npos);
  CHECK(what.find("SECRET") == std::string::npos);
  CHECK(what.find("404") != std::string::npos);
  REQUIRE(e.context().offset.has_value());
  CHECK(*e.context().offset == 42);
  // A range that starts past the end: 416, not retried.
  CHECK(test::kind_of([&] {
          client.get_blocking(RangeGet{.url = served.url() + "/blob.bin", .offset = 20'000, .dest = buf});
        }) == errc::remote_error);
  // Redirects to another scheme, or more than 10 of them, are refused.
  for (const char* where : {"/__redirect/ftp", "/__redirect/loop"}) {
    INFO(where);
    const Error r = error_of([&] { client.get_blocking(DocumentGet{.url = served.url() + where}); });
    CHECK(r.kind() == errc::remote_error);
    CHECK(std::string(r.what()).find("redirect") != std::string::npos);
  }
  // Nothing listens: retried, then remote_error.
  HttpOptions o = quick_options();
  o.max_retries = 1;
  HttpClient nobody(o);
  CHECK(test::kind_of([&] {
          nobody.get_blocking(RangeGet{.url = "http://127.0.0.1:1/x", .offset = 0, .dest = buf});
        }) == errc::remote_error);
  CHECK(nobody.stats().requests == 2);
}

TEST_CASE("faults are retried to the exact bytes, or fail with the kind the contract names", "[http]") {
  test::NginxDir served;
  const auto data = served.add("blob.bin", 200'000, 5);
  served.add("other.bin", 200'001, 6);  // nginx's ETag is mtime and size: this one differs
  served.start();
  EREDU_REQUIRE_SERVER(served.server());

  struct Case {
    std::string mode;
    int count;
    errc expect;  // errc{}: the exact bytes
    unsigned attempts;
    std::size_t after = 50'000;  // body bytes before the fault
  };
  const std::vector<Case> cases{
      {"reset", 2, errc{}, 3},
      {"short", 1, errc{}, 2},
      {"503", 2, errc{}, 3},
      {"429", 1, errc{}, 2},
      {"stall", 1, errc{}, 2, 1000},
      {"reset", -1, errc::remote_error, 4, 0},
      {"503", -1, errc::remote_error, 4},
      {"ignore_range", 1, errc::range_unsupported, 1},
      {"403", 1, errc::access_denied, 1},
      {"404", 1, errc::remote_not_found, 1},
  };
  for (const Case& c : cases) {
    DYNAMIC_SECTION(c.mode << " x" << c.count) {
      auto proxy = test::fault_proxy(served.url(), c.mode, c.count, c.after);
      EREDU_REQUIRE_SERVER(*proxy);
      HttpClient client(quick_options());
      std::vector<std::byte> buf(150'000, std::byte{0xa5});
      const std::uint64_t offset = 1234;
      RangeResult r;
      std::exception_ptr e;
      try {
        r = client.get_blocking(RangeGet{.url = proxy->url() + "/blob.bin", .offset = offset, .dest = buf});
      } catch (...) {
        e = std::current_exception();
      }
      CHECK(test::kind_of(e) == c.expect);
      CHECK(client.stats().requests == c.attempts);
      if (!e) {
        CHECK(r.attempts == c.attempts);
        CHECK(r.bytes == buf.size());
        CHECK(same(buf, data, offset));
      } else {
        // Whatever landed is the object's bytes, never others: each byte is the object's or
        // still the fill.
        std::size_t wrong = 0;
        for (std::size_t i = 0; i < buf.size(); ++i) {
          if (buf[i] != data[offset + i] && buf[i] != std::byte{0xa5}) ++wrong;
        }
        CHECK(wrong == 0);
      }
    }
  }
  SECTION("ignore_range: the whole object asked for is fine") {
    auto proxy = test::fault_proxy(served.url(), "ignore_range", -1);
    EREDU_REQUIRE_SERVER(*proxy);
    HttpClient client(quick_options());
    std::vector<std::byte> buf(data.size());
    CHECK(client.get_blocking(RangeGet{.url = proxy->url() + "/blob.bin", .offset = 0, .dest = buf}).bytes ==
          data.size());
    CHECK(same(buf, data, 0));
  }
  SECTION("replace: the changed object is file_changed under If-Match") {
    auto proxy = test::fault_proxy(served.url(), "replace", 1, 0, {"--replace-path", "/other.bin"});
    EREDU_REQUIRE_SERVER(*proxy);
    HttpClient client(quick_options());
    std::vector<std::byte> buf(1000);
    const RangeResult first =
        client.get_blocking(RangeGet{.url = proxy->url() + "/blob.bin", .offset = 0, .dest = buf});
    CHECK(same(buf, data, 0));
    const Error e = error_of([&] {
      client.get_blocking(
          RangeGet{.url = proxy->url() + "/blob.bin", .offset = 1000, .dest = buf, .if_match = first.etag});
    });
    CHECK(e.kind() == errc::file_changed);
    CHECK(client.stats().requests == 2);
  }
  SECTION("a reset resumes from the last byte received") {
    auto proxy = test::fault_proxy(served.url(), "reset", 1, 100'000);
    EREDU_REQUIRE_SERVER(*proxy);
    HttpClient client(quick_options());
    std::vector<std::byte> buf(150'000);
    const RangeResult r = client.get_blocking(RangeGet{.url = proxy->url() + "/blob.bin", .offset = 10, .dest = buf});
    CHECK(r.attempts == 2);
    CHECK(same(buf, data, 10));
    // 100,000 body bytes came before the reset (maybe fewer reached us); the retry asked only
    // for the rest, so the bytes received stay well under twice the range.
    CHECK(client.stats().bytes < 2 * buf.size());
    CHECK(client.stats().bytes >= buf.size());
  }
}

TEST_CASE("a stalled transfer is retried, then timed_out", "[http]") {
  test::NginxDir served;
  served.add("blob.bin", 200'000, 8);
  served.start();
  EREDU_REQUIRE_SERVER(served.server());
  auto proxy = test::fault_proxy(served.url(), "stall", -1, 1000);
  EREDU_REQUIRE_SERVER(*proxy);
  HttpOptions o = quick_options();
  o.max_retries = 1;
  HttpClient client(o);
  std::vector<std::byte> buf(100'000);
  const auto t0 = std::chrono::steady_clock::now();
  const Error e =
      error_of([&] { client.get_blocking(RangeGet{.url = proxy->url() + "/blob.bin", .offset = 0, .dest = buf}); });
  CHECK(e.kind() == errc::timed_out);
  CHECK(client.stats().requests == 2);
  CHECK(std::chrono::steady_clock::now() - t0 < 10s);
}

TEST_CASE("cancel and destruction end stalled transfers promptly with cancelled", "[http]") {
  test::NginxDir served;
  served.add("blob.bin", 200'000, 9);
  served.start();
  EREDU_REQUIRE_SERVER(served.server());
  auto proxy = test::fault_proxy(served.url(), "stall", -1, 1000);
  EREDU_REQUIRE_SERVER(*proxy);
  HttpOptions o = quick_options();
  o.low_speed_window = 30s;  // only cancel can end these
  const std::string url = proxy->url() + "/blob.bin";

  SECTION("cancel") {
    HttpClient client(o);
    std::vector<std::byte> buf(100'000);
    std::promise<std::exception_ptr> done;
    const RequestId id = HttpClient::new_request_id();
    client.get(
        RangeGet{.url = url, .offset = 0, .dest = buf}, [&](std::exception_ptr e, RangeResult) { done.set_value(e); },
        id);
    std::this_thread::sleep_for(300ms);
    const auto t0 = std::chrono::steady_clock::now();
    client.cancel(id);
    auto f = done.get_future();
    REQUIRE(f.wait_for(2s) == std::future_status::ready);
    CHECK(test::kind_of(f.get()) == errc::cancelled);
    CHECK(std::chrono::steady_clock::now() - t0 < 2s);
    client.cancel(id);  // harmless now
  }
  SECTION("destruction, with transfers running and queued") {
    std::atomic<int> cancelled{0};
    std::atomic<int> called{0};
    std::vector<std::vector<std::byte>> bufs(8, std::vector<std::byte>(100'000));
    auto t0 = std::chrono::steady_clock::now();
    {
      HttpClient client(o);  // 4 run, 4 wait in its queue
      for (auto& b : bufs) {
        client.get(RangeGet{.url = url, .offset = 0, .dest = b}, [&](std::exception_ptr e, RangeResult) {
          ++called;
          if (test::kind_of(e) == errc::cancelled) ++cancelled;
        });
      }
      std::this_thread::sleep_for(300ms);
      // max_transfers: only 4 reached the server.
      HttpClient other(o);
      const std::string stats = other.get_blocking(DocumentGet{.url = proxy->url() + "/__stats"}).body;
      CHECK(stats.find("\"requests\": 4,") != std::string::npos);
      CHECK(stats.find("\"active\": 4,") != std::string::npos);
      CHECK(called == 0);
      t0 = std::chrono::steady_clock::now();
    }
    CHECK(called == 8);
    CHECK(cancelled == 8);
    CHECK(std::chrono::steady_clock::now() - t0 < 2s);  // the destructor's own time
  }
}

TEST_CASE("async_get completes on the handler's executor", "[http]") {
  test::NginxDir served;
  const auto data = served.add("blob.bin", 10'000, 10);
  served.start();
  EREDU_REQUIRE_SERVER(served.server());
  asio::io_context ioc;  // outlives the client, whose thread posts the completion to it
  HttpClient client(quick_options());
  std::vector<std::byte> buf(500);
  bool ran = false;
  client.async_get(RangeGet{.url = served.url() + "/blob.bin", .offset = 77, .dest = buf}, ioc.get_executor(),
                   [&](std::exception_ptr e, RangeResult r) {
                     CHECK_FALSE(e);
                     CHECK(r.bytes == 500);
                     ran = true;
                   });
  ioc.run();
  CHECK(ran);
  CHECK(same(buf, data, 77));
}

TEST_CASE("every attempt is signed afresh, and a redirect to another origin is not signed", "[http]") {
  test::NginxDir served;
  const auto data = served.add("blob.bin", 50'000, 20);
  std::filesystem::create_directory(served.dir() / "d");
  const auto index = served.add("d/index.html", 3000, 21);
  served.start();
  EREDU_REQUIRE_SERVER(served.server());
  HttpClient client(quick_options());
  CountingSigner signer;

  SECTION("retries") {
    auto proxy = test::fault_proxy(served.url(), "503", 2);
    EREDU_REQUIRE_SERVER(*proxy);
    std::vector<std::byte> buf(1000);
    const std::string url = proxy->url() + "/blob.bin";
    CHECK(client.get_blocking(RangeGet{.url = url, .offset = 9, .dest = buf, .signer = &signer}).attempts == 3);
    CHECK(same(buf, data, 9));
    CHECK(signer.urls() == std::vector<std::string>(3, url));
  }
  SECTION("a redirect within the origin is signed") {
    const DocumentResult d = client.get_blocking(DocumentGet{.url = served.url() + "/d", .signer = &signer});
    REQUIRE(d.body.size() == index.size());
    CHECK(std::memcmp(d.body.data(), index.data(), index.size()) == 0);
    CHECK(signer.urls() == std::vector<std::string>{served.url() + "/d", served.url() + "/d/"});
  }
  SECTION("a redirect to another origin is not") {
    // Behind the proxy, nginx redirects to its own port: another origin than the proxy's.
    auto proxy = test::fault_proxy(served.url(), "pass", 0);
    EREDU_REQUIRE_SERVER(*proxy);
    const DocumentResult d = client.get_blocking(DocumentGet{.url = proxy->url() + "/d", .signer = &signer});
    CHECK(d.body.size() == index.size());
    CHECK(signer.urls() == std::vector<std::string>{proxy->url() + "/d"});
  }
}
