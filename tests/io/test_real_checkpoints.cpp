// Every real checkpoint in ../shared/data/real against MANIFEST.json: tensor lists, byte
// ranges (checked by sha256 of the stored bytes), and the expected rejections.

#include <fcntl.h>
#include <unistd.h>
#include <catch2/catch.hpp>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "eredu/core/error.hpp"
#include "eredu/io/formats/open_catalog.hpp"
#include "eredu/io/formats/safetensors.hpp"
#include "eredu/io/integrity/sha256.hpp"
#include "json.hpp"
#include "support/temp_dir.hpp"

using eredu::errc;
namespace json = eredu::io::json;
namespace fs = std::filesystem;

namespace {

std::string read_text(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

std::optional<json::Value> field(const json::Value& object, std::string_view key) {
  for (const auto& m : object.members()) {
    if (m.key.as_string() == key) return m.value;
  }
  return std::nullopt;
}

std::string sha256_of_range(int fd, std::uint64_t offset, std::uint64_t n) {
  eredu::io::Sha256 h;
  std::vector<std::byte> buf(64 * 1024);
  while (n > 0) {
    const auto want = static_cast<std::size_t>(std::min<std::uint64_t>(n, buf.size()));
    const ssize_t r = ::pread(fd, buf.data(), want, static_cast<off_t>(offset));
    REQUIRE(r > 0);
    h.update(std::span(buf.data(), static_cast<std::size_t>(r)));
    offset += static_cast<std::uint64_t>(r);
    n -= static_cast<std::uint64_t>(r);
  }
  return h.hex_digest();
}

// MANIFEST.json parsed with the project's own parser; the text must outlive the document.
struct Manifest {
  std::string text;
  json::Document doc;
  explicit Manifest(const fs::path& dir) : text(read_text(dir / "MANIFEST.json")), doc(json::Document::parse(text)) {}
  std::vector<json::Value> files() const {
    std::vector<json::Value> out;
    for (const auto& f : field(doc.root(), "files")->items()) out.push_back(f);
    return out;
  }
};

}  // namespace

TEST_CASE("real checkpoints – sha256 of the FIPS 180-4 examples, whole and fed piecewise", "[io][real]") {
  CHECK(eredu::io::sha256_hex({}) == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  const std::string abc = "abc";
  CHECK(eredu::io::sha256_hex(std::as_bytes(std::span(abc))) ==
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  const std::string two_blocks = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
  CHECK(eredu::io::sha256_hex(std::as_bytes(std::span(two_blocks))) ==
        "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  // Updates that straddle block boundaries must give the same digest as one update.
  std::string long_text;
  for (int i = 0; i < 300; ++i) long_text += two_blocks;
  const auto whole = eredu::io::sha256_hex(std::as_bytes(std::span(long_text)));
  for (std::size_t step : {1u, 7u, 63u, 64u, 65u, 1000u}) {
    eredu::io::Sha256 h;
    for (std::size_t at = 0; at < long_text.size(); at += step)
      h.update(std::as_bytes(std::span(long_text).subspan(at, std::min(step, long_text.size() - at))));
    CHECK(h.hex_digest() == whole);
  }
}

TEST_CASE("real checkpoints – every safetensors file matches MANIFEST.json", "[io][real]") {
  const fs::path dir = eredu::test::real_data_dir();
  if (dir.empty() || !fs::exists(dir / "MANIFEST.json")) {
    WARN("no real checkpoints under ../shared/data/real: skipping");
    return;
  }
  const Manifest manifest(dir);
  int checked_files = 0, checked_tensors = 0;
  for (const auto& entry : manifest.files()) {
    if (field(entry, "format")->as_string() != "safetensors" || !field(entry, "valid")->as_bool()) continue;
    const std::string path = (dir / std::string(field(entry, "file")->as_string())).string();
    INFO(path);
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    REQUIRE(fd >= 0);
    const auto size = static_cast<std::uint64_t>(fs::file_size(path));
    const auto layout = eredu::io::safetensors::read_layout(fd, size, path);
    const auto tensors = field(entry, "tensors")->items();
    REQUIRE(layout.tensors.size() == *field(entry, "tensor_count")->as_u64());
    REQUIRE(layout.tensors.size() == tensors.size());
    CHECK(layout.data_offset == 8 + *field(entry, "header_len")->as_u64());
    const auto metadata = *field(entry, "metadata");
    if (metadata.kind() == json::Kind::object) {
      eredu::io::Metadata expected;
      for (const auto& m : metadata.members()) expected[std::string(m.key.as_string())] = m.value.as_string();
      CHECK(layout.metadata == expected);
    } else {
      CHECK(layout.metadata.empty());
    }
    for (const auto& t : tensors) {
      const std::string name(field(t, "name")->as_string());
      INFO(name);
      const auto it = std::find_if(layout.tensors.begin(), layout.tensors.end(),
                                   [&](const eredu::io::TensorInfo& x) { return x.name == name; });
      REQUIRE(it != layout.tensors.end());
      CHECK(eredu::dtype_name(it->dtype) == field(t, "dtype")->as_string());
      eredu::Shape shape;
      for (const auto& d : field(t, "shape")->items()) shape.push_back(*d.as_u64());
      CHECK(it->shape == shape);
      std::vector<std::uint64_t> offsets;
      for (const auto& o : field(t, "data_offsets")->items()) offsets.push_back(*o.as_u64());
      REQUIRE(offsets.size() == 2);
      CHECK(it->offset == layout.data_offset + offsets[0]);
      CHECK(it->nbytes == offsets[1] - offsets[0]);
      CHECK(sha256_of_range(fd, it->offset, it->nbytes) == field(t, "sha256")->as_string());
      ++checked_tensors;
    }
    // Offsets ascend and tile the data exactly.
    std::uint64_t next = layout.data_offset;
    for (const auto& t : layout.tensors) {
      CHECK(t.offset == next);
      next = t.offset + t.nbytes;
    }
    CHECK(next == size);
    ::close(fd);
    ++checked_files;
  }
  CHECK(checked_files >= 20);
  CHECK(checked_tensors > 100);
}

TEST_CASE("real checkpoints – each file opens alone as a catalog", "[io][real]") {
  const fs::path dir = eredu::test::real_data_dir();
  if (dir.empty()) {
    WARN("no real checkpoints under ../shared/data/real: skipping");
    return;
  }
  for (const auto& e : fs::recursive_directory_iterator(dir / "safetensors")) {
    if (e.path().extension() != ".safetensors") continue;
    INFO(e.path());
    const auto catalog = eredu::io::open_catalog(e.path());
    CHECK(catalog.files().size() == 1);
    CHECK(catalog.files()[0].format == "safetensors");
  }
}

TEST_CASE("real checkpoints – the malformed safetensors files are rejected", "[io][real]") {
  const fs::path dir = eredu::test::real_data_dir();
  if (dir.empty()) {
    WARN("no real checkpoints under ../shared/data/real: skipping");
    return;
  }
  SECTION("a Git LFS pointer") {
    const auto path = dir / "malformed/lfs-pointer-pusht-frame_0.safetensors";
    try {
      eredu::io::open_catalog(path);
      FAIL("accepted");
    } catch (const eredu::Error& e) {
      CHECK(e.kind() == errc::header_too_large);
      CHECK_THAT(e.what(), Catch::Contains("Git LFS") && Catch::Contains("2336927755350992246") &&
                               Catch::Contains(path.string()));
    }
  }
  SECTION("a header length larger than the file") {
    const auto path = dir / "malformed/safetensors_abuse_attempt_1.safetensors";
    try {
      eredu::io::open_catalog(path);
      FAIL("accepted");
    } catch (const eredu::Error& e) {
      CHECK(e.kind() == errc::invalid_header_length);
      CHECK_THAT(e.what(), Catch::Contains("1000") && Catch::Contains("1008") && Catch::Contains("88"));
    }
  }
}

TEST_CASE("real checkpoints – the sharded fluxml checkpoint is one catalog", "[io][real]") {
  const fs::path dir = eredu::test::real_data_dir();
  if (dir.empty()) {
    WARN("no real checkpoints under ../shared/data/real: skipping");
    return;
  }
  const auto sharded = dir / "safetensors/fluxml-sharded";
  for (const auto& path : {sharded, sharded / "model.safetensors.index.json"}) {
    const auto catalog = eredu::io::open_catalog(path);
    CHECK(catalog.size() == 36);
    CHECK(catalog.files().size() == 6);
    CHECK(catalog.metadata().at("total_size") == "4305");
    CHECK(catalog.total_bytes() == 4305);
    for (std::size_t i = 1; i < catalog.files().size(); ++i) {
      CHECK(catalog.files()[i - 1].path < catalog.files()[i].path);
    }
    CHECK(catalog.files()[0].metadata.at("format") == "pt");
  }
}
