#include "eredu/io/formats/sharded_index.hpp"

#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>
#include <catch2/catch.hpp>

#include <fstream>
#include <string>

#include "eredu/core/error.hpp"
#include "eredu/io/formats/open_catalog.hpp"
#include "support/st_bytes.hpp"
#include "support/temp_dir.hpp"

using eredu::errc;
using eredu::io::open_catalog;
using eredu::test::st_entry;
using eredu::test::st_file;
using eredu::test::TempDir;
using eredu::test::write_bytes;

namespace {

const std::string shard1 = "model-00001-of-00002.safetensors";
const std::string shard2 = "model-00002-of-00002.safetensors";

void write_text(const std::filesystem::path& p, std::string_view text) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f << text;
}

// A good two-shard checkpoint: a, b in shard 1; c in shard 2.
struct Sharded {
  TempDir dir;
  std::string header1 = R"({"__metadata__":{"format":"pt"},)" + st_entry("a", "F32", "[2]", 0, 8) + "," +
                        st_entry("b", "U8", "[3]", 8, 11) + "}";
  std::string header2 = R"({"__metadata__":{"format":"pt"},)" + st_entry("c", "I64", "[]", 0, 8) + "}";
  std::string weight_map = fmt::format(R"({{"c":"{}","a":"{}","b":"{}"}})", shard2, shard1, shard1);

  Sharded() {
    write_bytes(dir / shard1, st_file(header1, 11));
    write_bytes(dir / shard2, st_file(header2, 8));
    write_index(weight_map);
  }
  void write_index(std::string_view map, std::string_view metadata = R"({"total_size":19,"note":"n"})") {
    write_text(dir / "model.safetensors.index.json",
               fmt::format(R"({{"metadata":{},"weight_map":{}}})", metadata, map));
  }
};

template <class F>
eredu::Error error_of(F&& f) {
  try {
    f();
  } catch (const eredu::Error& e) {
    return e;
  }
  FAIL("no eredu::Error thrown");
  throw std::logic_error("unreachable");
}

}  // namespace

TEST_CASE("sharded – opens a sharded checkpoint via its directory and its index", "[io][sharded]") {
  Sharded s;
  for (const auto& path : {s.dir.path(), s.dir / "model.safetensors.index.json"}) {
    INFO(path);
    const auto catalog = open_catalog(path);
    REQUIRE(catalog.size() == 3);
    REQUIRE(catalog.files().size() == 2);
    CHECK(catalog.files()[0].path == (s.dir / shard1).string());
    CHECK(catalog.files()[1].path == (s.dir / shard2).string());
    CHECK(catalog.files()[0].format == "safetensors");
    CHECK(catalog.files()[0].metadata.at("format") == "pt");
    CHECK(catalog.files()[0].data_offset == 8 + s.header1.size());
    CHECK(catalog.tensors()[0].name == "a");
    CHECK(catalog.tensors()[1].name == "b");
    CHECK(catalog.tensors()[2].name == "c");
    CHECK(catalog.at("b").offset == 8 + s.header1.size() + 8);
    CHECK(catalog.at("b").nbytes == 3);
    CHECK(catalog.at("c").file == 1);
    CHECK(catalog.at("c").shape.empty());
    CHECK(catalog.total_bytes() == 19);
    CHECK(catalog.metadata() == eredu::io::Metadata{{"total_size", "19"}, {"note", "n"}});
  }
}

TEST_CASE("sharded – a shard the index names must exist", "[io][sharded]") {
  Sharded s;
  s.write_index(fmt::format(R"({{"c":"{}","a":"{}","b":"{}","d":"model-00003.safetensors"}})", shard2, shard1, shard1));
  const auto e = error_of([&] { open_catalog(s.dir.path()); });
  CHECK(e.kind() == errc::shard_missing);
  CHECK_THAT(e.what(), Catch::Contains("model-00003.safetensors") && Catch::Contains("model.safetensors.index.json"));
}

TEST_CASE("sharded – every weight_map tensor is in the shard it names", "[io][sharded]") {
  Sharded s;
  SECTION("absent everywhere") {
    s.write_index(fmt::format(R"({{"c":"{}","a":"{}","b":"{}","d":"{}"}})", shard2, shard1, shard1, shard1));
    const auto e = error_of([&] { open_catalog(s.dir.path()); });
    CHECK(e.kind() == errc::tensor_missing_from_shard);
    CHECK(e.context().tensor == "d");
    CHECK_THAT(e.what(), Catch::Contains(shard1) && Catch::Contains("no shard does"));
  }
  SECTION("in another shard") {
    s.write_index(fmt::format(R"({{"c":"{}","a":"{}","b":"{}"}})", shard1, shard1, shard1));
    // shard 2 is no longer named, so c is only in an unlisted file: missing from shard 1.
    const auto e = error_of([&] { open_catalog(s.dir.path()); });
    CHECK(e.kind() == errc::tensor_missing_from_shard);
    CHECK(e.context().tensor == "c");
  }
  SECTION("named in the wrong shard") {
    s.write_index(fmt::format(R"({{"c":"{}","a":"{}","b":"{}"}})", shard2, shard2, shard1));
    const auto e = error_of([&] { open_catalog(s.dir.path()); });
    CHECK(e.kind() == errc::tensor_missing_from_shard);
    CHECK(e.context().tensor == "a");
    CHECK_THAT(e.what(), Catch::Contains("it is in") && Catch::Contains(shard1));
  }
}

TEST_CASE("sharded – a tensor in two shards is refused with the sharded kind", "[io][sharded]") {
  Sharded s;
  write_bytes(s.dir / shard2,
              st_file("{" + st_entry("a", "F32", "[2]", 0, 8) + "," + st_entry("c", "I64", "[]", 8, 16) + "}", 16));
  const auto e = error_of([&] { open_catalog(s.dir.path()); });
  CHECK(e.kind() == errc::tensor_in_two_shards);
  CHECK(e.context().tensor == "a");
  CHECK_THAT(e.what(), Catch::Contains(shard1) && Catch::Contains(shard2));
}

TEST_CASE("sharded – a shard tensor the index does not list is refused", "[io][sharded]") {
  Sharded s;
  write_bytes(s.dir / shard2,
              st_file("{" + st_entry("c", "I64", "[]", 0, 8) + "," + st_entry("x", "U8", "[1]", 8, 9) + "}", 9));
  const auto e = error_of([&] { open_catalog(s.dir.path()); });
  CHECK(e.kind() == errc::tensor_not_in_index);
  CHECK(e.context().tensor == "x");
  CHECK_THAT(e.what(), Catch::Contains(shard2));
}

TEST_CASE("sharded – a malformed shard reports its own error and path", "[io][sharded]") {
  Sharded s;
  write_bytes(s.dir / shard2, st_file(s.header2, 9));
  const auto e = error_of([&] { open_catalog(s.dir.path()); });
  CHECK(e.kind() == errc::incomplete_data);
  CHECK(e.context().file == (s.dir / shard2).string());
}

TEST_CASE("sharded – malformed indexes are invalid_index naming the index", "[io][sharded]") {
  Sharded s;
  const auto index = (s.dir / "model.safetensors.index.json").string();
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"not JSON", R"({"weight_map":{"a":"x.safetensors",}})"},
      {"not an object", R"([1,2])"},
      {"no weight_map", R"({"metadata":{}})"},
      {"weight_map an array", R"({"weight_map":["a"]})"},
      {"shard not a string", R"({"weight_map":{"a":1}})"},
      {"duplicate tensor", fmt::format(R"({{"weight_map":{{"a":"{0}","b":"{0}","a":"{0}"}}}})", shard1)},
      {"weight_map twice", fmt::format(R"({{"weight_map":{{}},"weight_map":{{"a":"{}"}}}})", shard1)},
      {"metadata a string", R"({"metadata":"x","weight_map":{}})"},
      {"absolute shard", R"({"weight_map":{"a":"/etc/passwd"}})"},
      {"parent shard", R"({"weight_map":{"a":"../model.safetensors"}})"},
      {"dot-dot shard", R"({"weight_map":{"a":".."}})"},
      {"subdirectory shard", R"({"weight_map":{"a":"sub/model.safetensors"}})"},
      {"empty shard name", R"({"weight_map":{"a":""}})"},
      {"invalid UTF-8", "{\"weight_map\":{\"\xFF\":\"x\"}}"},
  };
  for (const auto& c : cases) {
    const std::string& text = c.second;  // not a binding: clang 14 cannot capture those
    DYNAMIC_SECTION(c.first) {
      write_text(index, text);
      const auto e = error_of([&] { open_catalog(s.dir.path()); });
      INFO(e.what());
      CHECK(e.kind() == errc::invalid_index);
      CHECK(e.context().file == index);
      const auto e2 = error_of([&] { eredu::io::parse_sharded_index(text, "idx.json"); });
      CHECK(e2.kind() == errc::invalid_index);
      CHECK_THAT(e2.what(), Catch::Contains("idx.json"));
    }
  }
}

TEST_CASE("sharded – index metadata values are stringified", "[io][sharded]") {
  const auto index = eredu::io::parse_sharded_index(
      R"({"metadata":{"total_size":4305,"b":true,"n":null,"o":{"k":[1, 2.5]},"s":"x"},"weight_map":{"t":"m.safetensors","u":"a.safetensors"},"other":1})",
      "idx.json");
  CHECK(
      index.metadata ==
      eredu::io::Metadata{{"total_size", "4305"}, {"b", "true"}, {"n", "null"}, {"o", R"({"k":[1,2.5]})"}, {"s", "x"}});
  REQUIRE(index.weight_map.size() == 2);
  CHECK(index.weight_map[0] == std::pair<std::string, std::string>{"t", "m.safetensors"});
  CHECK(index.shards() == std::vector<std::string>{"a.safetensors", "m.safetensors"});
  CHECK(eredu::io::parse_sharded_index(R"({"weight_map":{}})", "i").metadata.empty());
  CHECK(eredu::io::parse_sharded_index(R"({"metadata":null,"weight_map":{}})", "i").metadata.empty());
}

TEST_CASE("open_catalog – a single file, by path or by its directory", "[io][catalog]") {
  TempDir dir;
  const std::string header = R"({"__metadata__":{"k":"v"},)" + st_entry("w", "F16", "[2,2]", 0, 8) + "}";
  write_bytes(dir / "only.safetensors", st_file(header, 8));
  write_text(dir / "README.md", "not a checkpoint");
  for (const auto& path : {dir / "only.safetensors", dir.path()}) {
    const auto catalog = open_catalog(path);
    REQUIRE(catalog.size() == 1);
    CHECK(catalog.files()[0].path == (dir / "only.safetensors").string());
    CHECK(catalog.files()[0].size == 8 + header.size() + 8);
    CHECK(catalog.metadata() == eredu::io::Metadata{{"k", "v"}});
    CHECK(catalog.at("w").dtype == eredu::DType::F16);
    CHECK(catalog.at("w").offset == 8 + header.size());
  }
  // Any file name works for a single file: the format falls back to safetensors.
  write_bytes(dir / "weights.bin", st_file(header, 8));
  CHECK(open_catalog(dir / "weights.bin").size() == 1);
}

TEST_CASE("open_catalog – directories without exactly one checkpoint are unknown_format", "[io][catalog]") {
  TempDir dir;
  auto e = error_of([&] { open_catalog(dir.path()); });
  CHECK(e.kind() == errc::unknown_format);
  CHECK_THAT(e.what(), Catch::Contains("no checkpoint"));
  write_bytes(dir / "a.safetensors", st_file("{}"));
  write_bytes(dir / "b.safetensors", st_file("{}"));
  e = error_of([&] { open_catalog(dir.path()); });
  CHECK(e.kind() == errc::unknown_format);
  CHECK_THAT(e.what(), Catch::Contains("2 *.safetensors files"));
}

TEST_CASE("open_catalog – a missing path is io_error with the errno", "[io][catalog]") {
  TempDir dir;
  const auto e = error_of([&] { open_catalog(dir / "nope.safetensors"); });
  CHECK(e.kind() == errc::io_error);
  CHECK(e.context().os_error == std::errc::no_such_file_or_directory);
  CHECK_THAT(e.what(), Catch::Contains("nope.safetensors"));
}

TEST_CASE("open_catalog – an unreadable file is io_error with the errno", "[io][catalog]") {
  if (::geteuid() == 0) {
    WARN("running as root: permissions are not enforced, skipping");
    return;
  }
  TempDir dir;
  const auto file = dir / "locked.safetensors";
  write_bytes(file, st_file("{}"));
  ::chmod(file.c_str(), 0);
  const auto e = error_of([&] { open_catalog(file); });
  CHECK(e.kind() == errc::io_error);
  CHECK(e.context().os_error == std::errc::permission_denied);
}
