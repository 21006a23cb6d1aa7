// The GGUF parser: ggml's fixtures and real files against their manifests, every check of
// ggml's gguf.cpp on hand-made files, the writer's round trip, and split GGUF sets.
#include "eredu/io/formats/gguf.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdlib>
#include <functional>

#include "eredu/core/error.hpp"
#include "eredu/io/formats/open_catalog.hpp"
#include "eredu/io/formats/split_gguf.hpp"
#include "eredu/synth/gguf_writer.hpp"
#include "eredu/synth/synthetic_gguf.hpp"
#include "gguf/gguf_fixture.hpp"

using namespace eredu;
namespace gguf = eredu::io::gguf;
namespace fs = std::filesystem;
using test::GgufBytes;
using test::member;

namespace {

io::gguf::Header parse_bytes(const std::vector<std::byte>& b) {
  return gguf::parse_header(b, b.size(), "hand-made.gguf");
}

// The error parse_bytes throws, checked for kind and message.
void expect_error(const std::vector<std::byte>& b, errc kind, std::string_view fragment) {
  try {
    parse_bytes(b);
    FAIL("no exception; expected " << errc_name(kind));
  } catch (const Error& e) {
    INFO(e.what());
    CHECK(e.kind() == kind);
    CHECK_THAT(e.what(), Catch::Contains(std::string(fragment)));
    CHECK_THAT(e.what(), Catch::Contains("hand-made.gguf"));
  }
}

// One F32 tensor "t" of 8 values after `kv_count` KV pairs written by `kvs`.
std::vector<std::byte> one_tensor_file(std::int64_t kv_count, const std::function<void(GgufBytes&)>& kvs) {
  GgufBytes b;
  b.preamble(1, kv_count);
  kvs(b);
  b.tensor("t", {8}, 0, 0).pad(32).data(32);
  return b.bytes;
}

// True when the JSON value `j` (from a manifest) equals element `i` of `v`.
bool same_value(const gguf::Value& v, std::uint64_t i, const io::json::Value& j) {
  namespace json = io::json;
  if (v.element_type == gguf::ValueType::string) return j.kind() == json::Kind::string && v.strings[i] == j.as_string();
  if (v.element_type == gguf::ValueType::boolean)
    return j.kind() == json::Kind::boolean && (v.bytes[i] != 0) == j.as_bool();
  if (j.kind() != json::Kind::number) return false;
  if (v.element_type == gguf::ValueType::f32 || v.element_type == gguf::ValueType::f64) {
    const double expected = std::strtod(std::string(j.number_text()).c_str(), nullptr);
    const double got = std::strtod(v.element_json(i).c_str(), nullptr);
    if (v.element_type == gguf::ValueType::f32) return static_cast<float>(got) == static_cast<float>(expected);
    return got == expected;
  }
  return v.element_json(i) == j.number_text();
}

}  // namespace

TEST_CASE("gguf – ggml's quantized fixtures match their manifest: types, row-major shapes, bytes, every KV",
          "[gguf][format][fixtures]") {
  const fs::path dir = test::gguf_quant_dir();
  if (dir.empty()) {
    WARN("no ../shared/data/gguf-quant: skipping");
    return;
  }
  const test::JsonFile manifest(dir / "MANIFEST.json");
  int files = 0, tensors = 0, kvs = 0;
  for (const char* name : {"quant-types.gguf", "tiny-llama-q4_k_m.gguf"}) {
    INFO(name);
    const auto entry = *member(*member(manifest.doc.root(), "files"), name);
    const std::string path = (dir / name).string();
    const auto bytes = test::read_range(path, 0, fs::file_size(path));
    const gguf::Header h = gguf::parse_header(bytes, bytes.size(), path);
    CHECK(h.version == *member(entry, "version")->as_u64());
    CHECK(h.alignment == *member(entry, "alignment")->as_u64());
    CHECK(h.data_offset == *member(entry, "data_offset")->as_u64());
    const auto kv = *member(entry, "kv");
    CHECK(h.kv.size() == kv.size());
    for (const auto& m : kv.members()) {
      const std::string key(m.key.as_string());
      INFO(key);
      const gguf::Value* v = h.find(key);
      REQUIRE(v != nullptr);
      if (m.value.kind() == io::json::Kind::array) {
        REQUIRE(v->is_array());
        REQUIRE(v->count == m.value.size());
        std::uint64_t i = 0;
        for (const auto& item : m.value.items()) CHECK(same_value(*v, i++, item));
      } else {
        CHECK(same_value(*v, 0, m.value));
      }
      ++kvs;
    }
    const io::Catalog catalog = io::open_catalog(path);
    const auto list = member(entry, "tensors")->items();
    REQUIRE(catalog.size() == member(entry, "tensors")->size());
    for (const auto& t : list) {
      const std::string tname(member(t, "name")->as_string());
      INFO(tname);
      const io::TensorInfo& info = catalog.at(tname);
      CHECK(dtype_name(info.dtype) == member(t, "ggml_type")->as_string());
      Shape shape;
      for (const auto& d : member(t, "shape_row_major")->items()) shape.push_back(*d.as_u64());
      CHECK(info.shape == shape);
      CHECK(info.offset == h.data_offset + *member(t, "offset")->as_u64());
      CHECK(info.nbytes == *member(t, "nbytes")->as_u64());
      const auto stored = test::read_range(path, info.offset, info.nbytes);
      CHECK(io::sha256_hex(stored) == member(t, "sha256")->as_string());
      ++tensors;
    }
    CHECK(catalog.files().front().format == "gguf");
    ++files;
  }
  CHECK(files == 2);
  CHECK(tensors == 25 + 39);
  CHECK(kvs > 20);
}

TEST_CASE("gguf – the llama fixture's key metadata reaches the catalog as text", "[gguf][format][fixtures]") {
  const fs::path dir = test::gguf_quant_dir();
  if (dir.empty()) {
    WARN("no ../shared/data/gguf-quant: skipping");
    return;
  }
  const io::Catalog catalog = io::open_catalog(dir / "tiny-llama-q4_k_m.gguf");
  const io::Metadata& m = catalog.metadata();
  CHECK(m.at("general.architecture") == "llama");
  CHECK(m.at("llama.block_count") == "4");
  CHECK(m.at("general.file_type") == "15");
  CHECK(m.at("tokenizer.ggml.tokens") == R"(["<unk>","<s>","</s>","hello","world"])");
  CHECK(catalog.at("blk.0.ffn_down.weight").dtype == DType::Q6_K);
  CHECK(catalog.at("blk.0.ffn_down.weight").shape == Shape{256, 512});
}

TEST_CASE("gguf – real GGUF files open and their deliberately bad ones are refused as ggml refuses them",
          "[gguf][format][real]") {
  const fs::path real = test::real_data_dir();
  if (real.empty()) {
    WARN("no ../shared/data/real: skipping");
    return;
  }
  const test::JsonFile manifest(real / "MANIFEST.json");
  int opened = 0;
  for (const auto& entry : member(manifest.doc.root(), "files")->items()) {
    if (member(entry, "format")->as_string() != "gguf" || !member(entry, "valid")->as_bool()) continue;
    const std::string path = (real / std::string(member(entry, "file")->as_string())).string();
    INFO(path);
    const io::Catalog catalog = io::open_catalog(path);
    REQUIRE(catalog.size() == *member(entry, "tensor_count")->as_u64());
    CHECK(catalog.metadata().at("general.architecture") == member(entry, "architecture")->as_string());
    for (const auto& t : member(entry, "tensors")->items()) {
      const io::TensorInfo& info = catalog.at(member(t, "name")->as_string());
      Shape ne;
      for (const auto& d : member(t, "shape")->items()) ne.push_back(*d.as_u64());
      std::reverse(ne.begin(), ne.end());  // the manifest lists ggml's ne
      CHECK(info.shape == ne);
      CHECK(info.nbytes == *member(t, "nbytes")->as_u64());
      CHECK(io::sha256_hex(test::read_range(path, info.offset, info.nbytes)) == member(t, "sha256")->as_string());
    }
    ++opened;
  }
  CHECK(opened == 4);
  struct Bad {
    const char* file;
    errc kind;
    const char* fragment;
  };
  const Bad bad[] = {{"malformed/llama.cpp-draft-example.gguf", errc::bad_magic, "byte-reversed"},
                     {"malformed/llama.cpp-pr5143-test_writer.gguf", errc::invalid_value_type, "'dict1'"}};
  for (const Bad& b : bad) {
    INFO(b.file);
    try {
      io::open_catalog(real / b.file);
      FAIL("accepted");
    } catch (const Error& e) {
      CHECK(e.kind() == b.kind);
      CHECK_THAT(e.what(), Catch::Contains(b.fragment));
      CHECK_THAT(e.what(), Catch::Contains(b.file));
    }
  }
  const fs::path quant = test::gguf_quant_dir();
  if (!quant.empty()) {
    try {
      io::open_catalog(quant / "align64-offsets-ignore-alignment.gguf");
      FAIL("accepted");
    } catch (const Error& e) {
      CHECK(e.kind() == errc::invalid_offset);
      CHECK_THAT(e.what(), Catch::Contains("c.q4_0") && Catch::Contains("offset 352, expected 384"));
    }
  }
}

TEST_CASE("gguf – every check of ggml's loader fails with its own kind, naming the numbers", "[gguf][format][errors]") {
  const auto no_kv = [](GgufBytes&) {};
  SECTION("preamble") {
    expect_error(GgufBytes{}.raw("GGU", 3).bytes, errc::truncated_header, "too few");
    expect_error(GgufBytes{}.raw("GGML", 4).u32(3).i64(0).i64(0).bytes, errc::bad_magic, "'GGML'");
    expect_error(GgufBytes{}.preamble(0, 0, 1).bytes, errc::unsupported_version, "v1");
    expect_error(GgufBytes{}.preamble(0, 0, 4).bytes, errc::unsupported_version, "version 4");
    expect_error(GgufBytes{}.preamble(0, 0, 0x03000000).bytes, errc::unsupported_version, "endianness");
    expect_error(GgufBytes{}.preamble(-1, 0).bytes, errc::invalid_count, "-1 tensors");
    expect_error(GgufBytes{}.preamble(0, 1'000'000).data(100).bytes, errc::invalid_count, "1000000 key-value");
    expect_error(GgufBytes{}.preamble(1'000'000'000'000, 0).data(100).bytes, errc::invalid_count, "1000000000000");
  }
  SECTION("key-value pairs") {
    expect_error(one_tensor_file(1, [](GgufBytes& b) { b.kv_u32("", 1); }), errc::invalid_key, "empty key");
    expect_error(one_tensor_file(2, [](GgufBytes& b) { b.kv_u32("a.b", 1).kv_u32("a.b", 2); }), errc::duplicate_key,
                 "'a.b'");
    expect_error(one_tensor_file(1, [](GgufBytes& b) { b.str("k").u32(13).u32(0); }), errc::invalid_value_type,
                 "type 13");
    expect_error(one_tensor_file(1, [](GgufBytes& b) { b.str("k").u32(9).u32(9).u64(1); }), errc::invalid_value_type,
                 "array of arrays");
    expect_error(one_tensor_file(1, [](GgufBytes& b) { b.str("k").u32(9).u32(12).u64(1'000'000); }),
                 errc::truncated_header, "1000000 FLOAT64");
    expect_error(one_tensor_file(1, [](GgufBytes& b) { b.str("k").u32(8).u64(1'000'000); }), errc::truncated_header,
                 "1000000 bytes");
    expect_error(one_tensor_file(1, [](GgufBytes& b) { b.str("k").u32(9).u32(8).u64(999'999); }),
                 errc::truncated_header, "999999 strings");
  }
  SECTION("general.alignment") {
    expect_error(one_tensor_file(1, [](GgufBytes& b) { b.str("general.alignment").u32(10).u64(32); }),
                 errc::invalid_alignment, "UINT64");
    expect_error(one_tensor_file(1, [](GgufBytes& b) { b.kv_u32("general.alignment", 48); }), errc::invalid_alignment,
                 "48");
    expect_error(one_tensor_file(1, [](GgufBytes& b) { b.kv_u32("general.alignment", 0); }), errc::invalid_alignment,
                 "is 0");
  }
  SECTION("tensor infos") {
    auto file = [](const std::function<void(GgufBytes&)>& infos, std::int64_t n = 1) {
      GgufBytes b;
      b.preamble(n, 0);
      infos(b);
      b.pad(32).data(4096);
      return b.bytes;
    };
    const std::string long_name(64, 'n');
    expect_error(file([&](GgufBytes& b) { b.tensor(long_name, {8}, 0, 0); }), errc::invalid_tensor_name, "64-byte");
    CHECK_NOTHROW(parse_bytes(file([&](GgufBytes& b) { b.tensor(long_name.substr(1), {8}, 0, 0); })));
    expect_error(file([](GgufBytes& b) { b.tensor(std::string("a\0b", 3), {8}, 0, 0); }), errc::invalid_tensor_name,
                 "NUL");
    expect_error(file([](GgufBytes& b) { b.tensor("t", {8}, 0, 0).tensor("t", {8}, 0, 32); }, 2),
                 errc::duplicate_tensor, "'t'");
    expect_error(file([](GgufBytes& b) { b.tensor("t", {1, 1, 1, 1, 1}, 0, 0); }), errc::invalid_shape, "5 dimensions");
    expect_error(file([](GgufBytes& b) { b.tensor("t", {8, -2}, 0, 0); }), errc::invalid_shape, "-2");
    expect_error(file([](GgufBytes& b) { b.tensor("t", {1ll << 32, 1ll << 31}, 0, 0); }), errc::size_overflow, "2^63");
    expect_error(file([](GgufBytes& b) { b.tensor("t", {32}, 4, 0); }), errc::unknown_dtype, "no longer supported");
    expect_error(file([](GgufBytes& b) { b.tensor("t", {32}, 40, 0); }), errc::unknown_dtype, "not a ggml type");
    expect_error(file([](GgufBytes& b) { b.tensor("t", {48, 2}, 2, 0); }), errc::partial_block, "ne[0] = 48");
    expect_error(file([](GgufBytes& b) { b.tensor("t", {8}, 0, 0).tensor("u", {8}, 0, 16); }, 2), errc::invalid_offset,
                 "offset 16, expected 32");
    expect_error(file([](GgufBytes& b) { b.tensor("t", {8}, 0, 8); }), errc::invalid_offset, "offset 8, expected 0");
    expect_error(file([](GgufBytes& b) { b.tensor("t", {4096}, 0, 0); }), errc::incomplete_data, "truncated");
    expect_error(GgufBytes{}.preamble(1, 0).str("t").u32(3).i64(8).i64(8).bytes, errc::truncated_header, "a dimension");
  }
  SECTION("what ggml accepts is accepted") {
    // v2, no tensors, a zero-sized tensor, trailing bytes after the data.
    CHECK(parse_bytes(GgufBytes{}.preamble(0, 0, 2).bytes).version == 2);
    const auto h = parse_bytes(GgufBytes{}
                                   .preamble(2, 1)
                                   .kv_u32("general.alignment", 64)
                                   .tensor("empty", {0, 4}, 1, 0)
                                   .tensor("q", {32, 2}, 2, 0)
                                   .pad(64)
                                   .data(36 + 100)
                                   .bytes);
    REQUIRE(h.tensors.size() == 2);
    CHECK(h.alignment == 64);
    CHECK(h.tensors[0].shape == Shape{4, 0});
    CHECK(h.tensors[0].nbytes == 0);
    CHECK(h.tensors[1].dtype == DType::Q4_0);
    CHECK(h.tensors[1].shape == Shape{2, 32});
    CHECK(h.tensors[1].nbytes == 36);
    CHECK(h.tensors[1].offset == h.data_offset);
  }
  (void)no_kv;
}

TEST_CASE("gguf – every prefix of a valid file fails with a typed error, never worse", "[gguf][format][errors]") {
  GgufBytes b;
  b.preamble(2, 2).kv_u32("general.alignment", 32).str("s").u32(8).str("héllo");
  b.tensor("a", {32, 2}, 8, 0).tensor("b", {256}, 12, 96).pad(32).data(96 + 144);
  REQUIRE_NOTHROW(parse_bytes(b.bytes));
  for (std::size_t n = 0; n < b.bytes.size(); ++n) {
    const std::vector<std::byte> prefix(b.bytes.begin(), b.bytes.begin() + static_cast<std::ptrdiff_t>(n));
    try {
      parse_bytes(prefix);
      // Only prefixes that cut the padding after the last tensor's data... none here.
      FAIL("prefix of " << n << " bytes accepted");
    } catch (const Error& e) {
      CHECK(e.family() == error_family::format);
    }
  }
}

TEST_CASE("gguf – the writer's files parse back with every dtype GGUF holds and typed KV values", "[gguf][synth]") {
  test::TempDir tmp;
  std::vector<synth::TensorSpec> specs;
  for (std::size_t i = 0; i < dtype_count; ++i) {
    const auto t = static_cast<DType>(i);
    if (!gguf::ggml_type_of(t)) continue;
    specs.push_back({std::string("t.") + std::string(dtype_name(t)), t, {3, dtype_block(t).elements * 2}});
  }
  std::vector<std::vector<std::byte>> data;
  std::vector<std::span<const std::byte>> spans;
  for (const auto& s : specs) {
    data.emplace_back(synth::tensor_nbytes(s));
    for (std::size_t j = 0; j < data.back().size(); ++j) data.back()[j] = std::byte(j * 7 + s.name.size());
  }
  for (const auto& d : data) spans.emplace_back(d);
  const std::int32_t ints[] = {1, -2, 3};
  const std::vector<synth::GgufKeyValue> kv = {
      {"general.architecture", synth::gguf_string("test")},
      {"general.alignment", synth::gguf_u32(64)},
      {"k.u8", synth::gguf_u8(200)},
      {"k.i64", synth::gguf_i64(-5)},
      {"k.f64", synth::gguf_f64(0.25)},
      {"k.bool", synth::gguf_bool(true)},
      {"k.ints", synth::gguf_i32_array(ints)},
      {"k.strings", synth::gguf_string_array({"a", "b\"c"})},
  };
  const fs::path path = tmp / "all.gguf";
  synth::write_gguf(path, specs, spans, kv);
  const io::Catalog catalog = io::open_catalog(path);
  REQUIRE(catalog.size() == specs.size());
  CHECK(specs.size() == 32);  // F32 F16 BF16 I8-I64 F64 and the 24 block types
  for (std::size_t i = 0; i < specs.size(); ++i) {
    const io::TensorInfo& t = catalog.at(specs[i].name);
    INFO(specs[i].name);
    CHECK(t.dtype == specs[i].dtype);
    CHECK(t.shape == specs[i].shape);
    CHECK(t.offset % 64 == 0);
    CHECK(test::read_range(path.string(), t.offset, t.nbytes) == data[i]);
  }
  const auto& m = catalog.metadata();
  CHECK(m.at("k.u8") == "200");
  CHECK(m.at("k.i64") == "-5");
  CHECK(m.at("k.f64") == "0.25");
  CHECK(m.at("k.bool") == "true");
  CHECK(m.at("k.ints") == "[1,-2,3]");
  CHECK(m.at("k.strings") == R"(["a","b\"c"])");
  const auto bytes = test::read_range(path.string(), 0, fs::file_size(path));
  const auto h = gguf::parse_header(bytes, bytes.size(), path.string());
  CHECK(h.find("k.i64")->as_i64() == -5);
  CHECK(h.find("k.u8")->type == gguf::ValueType::u8);
  CHECK(h.find("k.strings")->element_type == gguf::ValueType::string);
}

TEST_CASE("split gguf – a set opens as one checkpoint from any of its files or its directory", "[gguf][split]") {
  test::TempDir tmp;
  synth::SyntheticOptions options;
  options.target_bytes = 4 << 20;
  options.dtype = DType::Q4_K;
  options.shards = 3;
  options.layers = 2;
  synth::write_synthetic_gguf(tmp.path(), options);
  const synth::SyntheticModel model = synth::plan_gguf_model(options);
  for (const fs::path& open : {tmp / "model-00002-of-00003.gguf", tmp.path()}) {
    INFO(open);
    const io::Catalog catalog = io::open_catalog(open);
    CHECK(catalog.files().size() == 3);
    REQUIRE(catalog.size() == model.tensors.size());
    for (const auto& spec : model.tensors) {
      const io::TensorInfo& t = catalog.at(spec.name);
      CHECK(t.dtype == spec.dtype);
      CHECK(t.shape == spec.shape);
    }
    CHECK(catalog.metadata().at("general.architecture") == "llama");
    CHECK(catalog.metadata().at("llama.block_count") == "2");
  }
  CHECK(gguf::parse_split_name("model-00002-of-00003.gguf")->number == 2);
  CHECK_FALSE(gguf::parse_split_name("model-00004-of-00003.gguf"));
  CHECK_FALSE(gguf::parse_split_name("model-0002-of-00003.gguf"));
  CHECK_FALSE(gguf::parse_split_name("-00001-of-00003.gguf"));
}

TEST_CASE("split gguf – missing files, disagreeing keys and tensors in two files are refused",
          "[gguf][split][errors]") {
  test::TempDir tmp;
  const synth::TensorSpec a{"a", DType::F32, {8}}, b{"b", DType::F32, {8}};
  const std::vector<std::byte> zeros(32);
  const std::span<const std::byte> one[] = {zeros};
  auto split_kv = [](std::uint16_t no, std::uint16_t count, std::int32_t total) {
    return std::vector<synth::GgufKeyValue>{{"split.no", synth::gguf_u16(no)},
                                            {"split.count", synth::gguf_u16(count)},
                                            {"split.tensors.count", synth::gguf_i32(total)}};
  };
  auto write = [&](const std::string& name, const synth::TensorSpec& t, std::vector<synth::GgufKeyValue> kv) {
    synth::write_gguf(tmp / name, std::span(&t, 1), one, kv);
  };
  auto expect = [&](errc kind, std::string_view fragment) {
    try {
      io::open_catalog(tmp / "m-00001-of-00002.gguf");
      FAIL("accepted");
    } catch (const Error& e) {
      INFO(e.what());
      CHECK(e.kind() == kind);
      CHECK_THAT(e.what(), Catch::Contains(std::string(fragment)));
    }
  };
  write("m-00001-of-00002.gguf", a, split_kv(0, 2, 2));
  expect(errc::shard_missing, "m-00002-of-00002.gguf");
  write("m-00002-of-00002.gguf", b, split_kv(1, 3, 2));
  expect(errc::split_mismatch, "split.count is 3");
  write("m-00002-of-00002.gguf", b, split_kv(0, 2, 2));
  expect(errc::split_mismatch, "split.no is 0");
  write("m-00002-of-00002.gguf", b, split_kv(1, 2, 2));
  write("m-00001-of-00002.gguf", a, split_kv(0, 2, 5));
  expect(errc::split_mismatch, "split.tensors.count is 5");
  write("m-00001-of-00002.gguf", b, split_kv(0, 2, 2));
  expect(errc::tensor_in_two_shards, "'b'");
  write("m-00001-of-00002.gguf", a, split_kv(0, 2, 2));
  CHECK(io::open_catalog(tmp / "m-00001-of-00002.gguf").size() == 2);
}
