// Remote locations: which strings are URLs, how they parse, what messages show of them.
#include <catch2/catch.hpp>

#include "eredu/core/error.hpp"
#include "eredu/io/remote/remote_options.hpp"
#include "eredu/io/remote/remote_url.hpp"
#include "support/error_kind.hpp"

using namespace eredu;
using namespace eredu::io;

TEST_CASE("is_remote tells URLs from local paths", "[remote][url]") {
  CHECK(is_remote("https://example.com/m.safetensors"));
  CHECK(is_remote("HTTP://example.com/m.safetensors"));
  CHECK(is_remote("s3://bucket/key"));
  CHECK_FALSE(is_remote("/tmp/https://x"));
  CHECK_FALSE(is_remote("model.safetensors"));
  CHECK_FALSE(is_remote("s3:/bucket"));
  CHECK_FALSE(is_remote("file:///tmp/x"));
}

TEST_CASE("parse_remote_url splits host, port, path and query", "[remote][url]") {
  const RemoteUrl u = parse_remote_url("https://host.example:8443/org/model/resolve/main/model.safetensors?sig=SECRET");
  CHECK(u.scheme == RemoteUrl::Scheme::https);
  CHECK(u.host == "host.example");
  CHECK(u.port == 8443);
  CHECK(u.path == "org/model/resolve/main/model.safetensors");
  CHECK(u.query == "sig=SECRET");
  // The query may be a presigned signature: never shown.
  CHECK(redacted(u) == "https://host.example:8443/org/model/resolve/main/model.safetensors?…");

  const RemoteUrl s = parse_remote_url("s3://my-bucket/models/llama/");
  CHECK(s.scheme == RemoteUrl::Scheme::s3);
  CHECK(s.host == "my-bucket");
  CHECK(s.path == "models/llama/");
  CHECK(redacted(s) == "s3://my-bucket/models/llama/");

  const RemoteUrl v6 = parse_remote_url("http://[::1]:8080/x");
  CHECK(v6.host == "[::1]");
  CHECK(v6.port == 8080);
}

TEST_CASE("parse_remote_url refuses what it cannot use, without printing the query", "[remote][url]") {
  for (const char* bad :
       {"https://", "https://user:pw@host/x", "http://host:99999/x", "http://host:port/x", "s3:///key",
        "https://host/a b", "https://host/x#frag", "ftp://host/x", "https://host:/x", "s3://b/k?x=1"}) {
    INFO(bad);
    CHECK(test::kind_of([&] { parse_remote_url(bad); }) == errc::invalid_argument);
  }
  try {
    parse_remote_url("https://user:pw@host/x?token=SECRET");
    FAIL("accepted user info");
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find("SECRET") == std::string::npos);
  }
}

TEST_CASE("sibling names a shard beside its index, and refuses names that leave it", "[remote][url]") {
  const RemoteUrl index = parse_remote_url("https://h/repo/resolve/main/model.safetensors.index.json?download=1");
  const RemoteUrl shard = sibling(index, "model-00001-of-00002.safetensors");
  CHECK(shard.path == "repo/resolve/main/model-00001-of-00002.safetensors");
  CHECK(shard.query.empty());
  CHECK(shard.text == "https://h/repo/resolve/main/model-00001-of-00002.safetensors");
  CHECK(sibling(index, "a b.safetensors").path == "repo/resolve/main/a%20b.safetensors");
  const RemoteUrl s3 = parse_remote_url("s3://b/p/model.safetensors.index.json");
  CHECK(sibling(s3, "x.safetensors").text == "s3://b/p/x.safetensors");
  for (const char* bad : {"", "..", "../x", "a/b", "a\\b", "a\nb"}) {
    INFO(bad);
    CHECK(test::kind_of([&] { sibling(index, bad); }) == errc::invalid_index);
  }
}

TEST_CASE("RemoteOptions are validated with the field named", "[remote][options]") {
  CHECK_NOTHROW(validate(RemoteOptions{}));
  RemoteOptions o;
  o.concurrency = 0;
  CHECK(test::kind_of([&] { validate(o); }) == errc::invalid_argument);
  o = {};
  o.part_bytes = 10;
  try {
    validate(o);
    FAIL("accepted part_bytes 10");
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find("part_bytes") != std::string::npos);
  }
}
