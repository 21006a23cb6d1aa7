#include "eredu/synth/safetensors_writer.hpp"
#include "eredu/synth/synthetic_checkpoint.hpp"

#include <catch2/catch.hpp>

#include <bit>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <set>
#include <string>
#include <vector>

#include "eredu/core/error.hpp"
#include "eredu/io/formats/open_catalog.hpp"
#include "support/temp_dir.hpp"

using namespace eredu;
using namespace eredu::synth;

namespace {

std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  REQUIRE(in);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// Splits a safetensors file into its header (without prefix) and data, checking the prefix.
struct SplitFile {
  std::string header;
  std::string data;
};

SplitFile split_safetensors(const std::string& file) {
  REQUIRE(file.size() >= 8);
  std::uint64_t n = 0;
  std::memcpy(&n, file.data(), 8);  // little-endian host, as the writer assumes
  REQUIRE(n <= file.size() - 8);
  return {file.substr(8, n), file.substr(8 + n)};
}

std::vector<std::byte> tensor_bytes(std::uint64_t seed, const TensorSpec& t) {
  std::vector<std::byte> out(tensor_nbytes(t));
  fill_tensor_bytes(seed, t, 0, out);
  return out;
}

std::string as_string(std::span<const std::byte> bytes) {
  return {reinterpret_cast<const char*>(bytes.data()), bytes.size()};
}

float element_as_float(DType dtype, const std::byte* p) {
  if (dtype == DType::F32) {
    float f;
    std::memcpy(&f, p, 4);
    return f;
  }
  std::uint16_t h;
  std::memcpy(&h, p, 2);
  if (dtype == DType::BF16) return std::bit_cast<float>(std::uint32_t{h} << 16);
  // binary16 -> float: exponent 31 is Inf/NaN, which the test wants to see as such.
  const int exp = (h >> 10) & 0x1F;
  const int mant = h & 0x3FF;
  float mag = exp == 0    ? std::ldexp(static_cast<float>(mant), -24)
              : exp == 31 ? (mant ? NAN : INFINITY)
                          : std::ldexp(static_cast<float>(mant | 0x400), exp - 25);
  return (h & 0x8000) ? -mag : mag;
}

}  // namespace

// ---------------------------------------------------------------------------------------
// Header bytes
// ---------------------------------------------------------------------------------------

TEST_CASE("synth – header matches the reference writer's example", "[synth][header]") {
  const std::vector<TensorSpec> tensors{{"attn.0", DType::F32, {1, 2, 3}}};
  std::string header = safetensors_header(tensors, {});
  CHECK(header == R"({"attn.0":{"dtype":"F32","shape":[1,2,3],"data_offsets":[0,24]}})");
  CHECK(header.size() == 64);
}

TEST_CASE("synth – an empty dict is {} padded to 8 bytes", "[synth][header]") {
  CHECK(safetensors_header({}, {}) == "{}      ");
}

TEST_CASE("synth – metadata comes first, offsets are contiguous, padding is spaces", "[synth][header]") {
  const std::vector<TensorSpec> tensors{
      {"b", DType::BF16, {2, 3}}, {"a", DType::I64, {}}, {"empty", DType::F32, {0, 4}}, {"c", DType::F4, {4}}};
  std::string header = safetensors_header(tensors, {{"format", "pt"}, {"a", "1"}});
  std::string expected = R"({"__metadata__":{"a":"1","format":"pt"},)"
                         R"("b":{"dtype":"BF16","shape":[2,3],"data_offsets":[0,12]},)"
                         R"("a":{"dtype":"I64","shape":[],"data_offsets":[12,20]},)"
                         R"("empty":{"dtype":"F32","shape":[0,4],"data_offsets":[20,20]},)"
                         R"("c":{"dtype":"F4","shape":[4],"data_offsets":[20,22]}})";
  REQUIRE(header.size() % 8 == 0);
  CHECK(header.substr(0, expected.size()) == expected);
  CHECK(header.find_first_not_of(' ', expected.size()) == std::string::npos);
  CHECK(header.size() - expected.size() < 8);
}

TEST_CASE("synth – names are escaped as serde_json escapes them", "[synth][header]") {
  const std::vector<TensorSpec> tensors{{"q\"b\\s/\b\f\n\r\t\x01\x1f\x7f\xc3\xa9\xf0\x9f\x98\x80", DType::U8, {1}},
                                        {"", DType::U8, {1}},
                                        {std::string("n\0l", 3), DType::U8, {1}}};
  std::string header = safetensors_header(tensors, {{"k\"", "v\n"}});
  CHECK(header.rfind(R"({"__metadata__":{"k\"":"v\n"},)"
                     "\"q\\\"b\\\\s/\\b\\f\\n\\r\\t\\u0001\\u001f\x7f\xc3\xa9\xf0\x9f\x98\x80\":",
                     0) == 0);
  CHECK(header.find(R"("":{"dtype":"U8","shape":[1],"data_offsets":[1,2]})") != std::string::npos);
  CHECK(header.find(R"("n\u0000l":{"dtype":"U8","shape":[1],"data_offsets":[2,3]})") != std::string::npos);
}

TEST_CASE("synth – names that are not valid UTF-8 are refused", "[synth][header]") {
  for (std::string bad : {std::string("\xff"), std::string("\xc0\x80"), std::string("\xed\xa0\x80"),
                          std::string("\xe2\x82"), std::string("\xf4\x90\x80\x80")}) {
    const std::vector<TensorSpec> tensors{{bad, DType::U8, {1}}};
    try {
      (void)safetensors_header(tensors, {});
      FAIL("accepted " << bad.size() << " bad bytes");
    } catch (const Error& e) {
      CHECK(e.kind() == errc::invalid_argument);
    }
  }
}

TEST_CASE("synth – sizes that overflow are size_overflow errors", "[synth][header]") {
  const std::vector<TensorSpec> huge{{"w", DType::F32, {1ull << 62, 8}}};
  CHECK_THROWS_MATCHES(safetensors_header(huge, {}), Error,
                       Catch::Predicate<Error>([](const Error& e) { return e.kind() == errc::size_overflow; }));
  const std::vector<TensorSpec> odd{{"f4", DType::F4, {3}}};
  CHECK_THROWS_AS(tensor_nbytes(odd[0]), Error);
}

// ---------------------------------------------------------------------------------------
// Files
// ---------------------------------------------------------------------------------------

TEST_CASE("synth – write_safetensors writes prefix, header and data", "[synth][file]") {
  test::TempDir dir;
  const std::vector<TensorSpec> tensors{{"attn.0", DType::F32, {1, 2, 3}}, {"b", DType::U8, {3}}};
  std::vector<std::byte> a(24), b(3);
  for (std::size_t i = 0; i < a.size(); ++i) a[i] = std::byte(i);
  for (std::size_t i = 0; i < b.size(); ++i) b[i] = std::byte(0xA0 + i);
  const std::vector<std::span<const std::byte>> data{a, b};
  write_safetensors(dir / "x.safetensors", tensors, data);

  std::string file = read_file(dir / "x.safetensors");
  SplitFile split = split_safetensors(file);
  CHECK(split.header == safetensors_header(tensors, {}));
  CHECK(split.data == as_string(a) + as_string(b));
  CHECK(file.size() == 8 + split.header.size() + 27);
}

TEST_CASE("synth – write_safetensors refuses data of the wrong size", "[synth][file]") {
  test::TempDir dir;
  const std::vector<TensorSpec> tensors{{"t", DType::F32, {2}}};
  std::vector<std::byte> seven(7);
  const std::vector<std::span<const std::byte>> data{seven};
  CHECK_THROWS_AS(write_safetensors(dir / "x.safetensors", tensors, data), Error);
  const std::vector<std::span<const std::byte>> none;
  CHECK_THROWS_AS(write_safetensors(dir / "y.safetensors", tensors, none), Error);
}

TEST_CASE("synth – the file writer checks the declared data size", "[synth][file]") {
  test::TempDir dir;
  const std::vector<TensorSpec> tensors{{"t", DType::F32, {4}}};
  std::vector<std::byte> bytes(16);

  SECTION("too much") {
    SafetensorsFileWriter w(dir / "a.safetensors", tensors);
    w.write(std::span(bytes).first(10));
    try {
      w.write(std::span(bytes).first(7));
      FAIL("wrote past the declared size");
    } catch (const Error& e) {
      CHECK(e.kind() == errc::invalid_argument);
      CHECK(e.context().file == (dir / "a.safetensors").string());
    }
    CHECK(w.data_written() == 10);
  }
  SECTION("too little, then finished properly") {
    SafetensorsFileWriter w(dir / "b.safetensors", tensors, {{"format", "pt"}});
    w.write(std::span(bytes).first(15));
    CHECK_THROWS_AS(w.finish(), Error);
    w.write(std::span(bytes).subspan(15));
    w.finish(true);
    CHECK(std::filesystem::file_size(dir / "b.safetensors") == w.file_size());
    CHECK(w.file_size() == 8 + w.header_size() + 16);
  }
  SECTION("destroyed unfinished: the short file stays") {
    {
      SafetensorsFileWriter w(dir / "c.safetensors", tensors);
      w.write(std::span(bytes).first(4));
    }
    CHECK(std::filesystem::file_size(dir / "c.safetensors") == 8 + safetensors_header(tensors, {}).size() + 4);
  }
}

TEST_CASE("synth – a file that cannot be created is an io_error naming it", "[synth][file]") {
  test::TempDir dir;
  const std::vector<TensorSpec> tensors{{"t", DType::U8, {1}}};
  try {
    SafetensorsFileWriter w(dir / "missing" / "x.safetensors", tensors);
    FAIL("created a file in a missing directory");
  } catch (const Error& e) {
    CHECK(e.kind() == errc::io_error);
    CHECK(e.context().os_error == std::errc::no_such_file_or_directory);
    CHECK(e.context().file == (dir / "missing" / "x.safetensors").string());
  }
}

// ---------------------------------------------------------------------------------------
// Sharding
// ---------------------------------------------------------------------------------------

TEST_CASE("synth – split_by_max_bytes fills shards in order", "[synth][shard]") {
  const std::vector<TensorSpec> t{{"a", DType::U8, {4}}, {"b", DType::U8, {4}}, {"c", DType::U8, {9}},
                                  {"d", DType::U8, {0}}, {"e", DType::U8, {1}}, {"f", DType::U8, {8}}};
  CHECK(split_by_max_bytes(t, 8) == std::vector<std::size_t>{0, 2, 4, 5});
  CHECK(split_by_max_bytes(t, 100) == std::vector<std::size_t>{0});
  CHECK(split_by_max_bytes(std::span(t).first(0), 8).empty());
}

TEST_CASE("synth – split_evenly makes exactly n non-empty, balanced shards", "[synth][shard]") {
  SyntheticOptions o;
  o.target_bytes = 64ull << 20;
  SyntheticModel m = plan_model(o);
  for (std::uint32_t n : {1u, 2u, 3u, 5u, 8u}) {
    std::vector<std::size_t> starts = split_evenly(m.tensors, n);
    REQUIRE(starts.size() == n);
    CHECK(starts[0] == 0);
    for (std::size_t i = 1; i < n; ++i) CHECK(starts[i] > starts[i - 1]);
    CHECK(starts.back() < m.tensors.size());
  }
  const std::vector<TensorSpec> two{{"a", DType::U8, {1}}, {"b", DType::U8, {1}}};
  CHECK(split_evenly(two, 2) == std::vector<std::size_t>{0, 1});
  CHECK_THROWS_AS(split_evenly(two, 3), Error);
  CHECK_THROWS_AS(split_evenly(two, 0), Error);
}

TEST_CASE("synth – write_sharded writes shards and an index like transformers", "[synth][shard]") {
  test::TempDir dir;
  const std::vector<TensorSpec> tensors{{"a", DType::F32, {2}}, {"b", DType::F32, {2}}, {"c", DType::U8, {3}}};
  std::vector<std::byte> a(8, std::byte{1}), b(8, std::byte{2}), c(3, std::byte{3});
  const std::vector<std::span<const std::byte>> data{a, b, c};
  write_sharded(dir / "ckpt", tensors, data, 11);

  CHECK(read_file(dir / "ckpt" / "model.safetensors.index.json") ==
        "{\n  \"metadata\": {\n    \"total_size\": 19\n  },\n  \"weight_map\": {\n"
        "    \"a\": \"model-00001-of-00002.safetensors\",\n"
        "    \"b\": \"model-00002-of-00002.safetensors\",\n"
        "    \"c\": \"model-00002-of-00002.safetensors\"\n  }\n}");
  SplitFile s1 = split_safetensors(read_file(dir / "ckpt" / "model-00001-of-00002.safetensors"));
  SplitFile s2 = split_safetensors(read_file(dir / "ckpt" / "model-00002-of-00002.safetensors"));
  CHECK(s1.header == safetensors_header(std::span(tensors).first(1), {{"format", "pt"}}));
  CHECK(s2.header == safetensors_header(std::span(tensors).subspan(1), {{"format", "pt"}}));
  CHECK(s1.data == as_string(a));
  CHECK(s2.data == as_string(b) + as_string(c));
  CHECK(shard_file_name(0, 3) == "model-00001-of-00003.safetensors");
}

// ---------------------------------------------------------------------------------------
// Planning
// ---------------------------------------------------------------------------------------

TEST_CASE("synth – plans come within a few percent of the target", "[synth][plan]") {
  for (DType dtype : {DType::BF16, DType::F16, DType::F32}) {
    for (bool tie : {false, true}) {
      for (std::uint64_t target : {1ull << 20, 64ull << 20, 1ull << 30, 16ull << 30}) {
        SyntheticOptions o;
        o.target_bytes = target;
        o.dtype = dtype;
        o.tie_embeddings = tie;
        SyntheticModel m = plan_model(o);
        INFO("target " << target << " dtype " << dtype_name(dtype) << " tied " << tie);
        double err =
            std::abs(static_cast<double>(m.total_bytes) - static_cast<double>(target)) / static_cast<double>(target);
        CHECK(err < 0.05);
        CHECK(m.total_bytes == total_nbytes(m.tensors));
        CHECK(m.tensors.size() == 2 + 9 * m.layers + (tie ? 0 : 1));
        CHECK(m.layers >= 1);
        CHECK((m.hidden == 64 || m.hidden % 128 == 0));
        CHECK(m.heads * (m.hidden <= 2048 ? 64 : 128) == m.hidden);
        CHECK(m.heads % m.kv_heads == 0);
        CHECK(m.intermediate % 256 == 0);
        CHECK(m.vocab <= 32000);
        for (const auto& t : m.tensors) CHECK(t.dtype == dtype);
      }
    }
  }
}

TEST_CASE("synth – plans have Llama names and shapes", "[synth][plan]") {
  SyntheticOptions o;
  o.target_bytes = 1ull << 30;
  SyntheticModel m = plan_model(o);
  const std::uint64_t h = m.hidden, v = m.vocab, i = m.intermediate;
  const std::uint64_t kv = m.kv_heads * (h / m.heads);
  CHECK(m.vocab == 32000);
  CHECK(m.layers >= 8);
  REQUIRE(m.tensors.size() >= 12);
  CHECK(m.tensors.front() == TensorSpec{"model.embed_tokens.weight", DType::BF16, {v, h}});
  const std::vector<TensorSpec> layer0{{"model.layers.0.input_layernorm.weight", DType::BF16, {h}},
                                       {"model.layers.0.self_attn.q_proj.weight", DType::BF16, {h, h}},
                                       {"model.layers.0.self_attn.k_proj.weight", DType::BF16, {kv, h}},
                                       {"model.layers.0.self_attn.v_proj.weight", DType::BF16, {kv, h}},
                                       {"model.layers.0.self_attn.o_proj.weight", DType::BF16, {h, h}},
                                       {"model.layers.0.post_attention_layernorm.weight", DType::BF16, {h}},
                                       {"model.layers.0.mlp.gate_proj.weight", DType::BF16, {i, h}},
                                       {"model.layers.0.mlp.up_proj.weight", DType::BF16, {i, h}},
                                       {"model.layers.0.mlp.down_proj.weight", DType::BF16, {h, i}}};
  for (std::size_t k = 0; k < layer0.size(); ++k) CHECK(m.tensors[1 + k] == layer0[k]);
  CHECK(m.tensors[m.tensors.size() - 2] == TensorSpec{"model.norm.weight", DType::BF16, {h}});
  CHECK(m.tensors.back() == TensorSpec{"lm_head.weight", DType::BF16, {v, h}});
  std::set<std::string> names;
  for (const auto& t : m.tensors) names.insert(t.name);
  CHECK(names.size() == m.tensors.size());

  o.tie_embeddings = true;
  CHECK(plan_model(o).tensors.back().name == "model.norm.weight");
}

TEST_CASE("synth – a pinned layer count is honoured", "[synth][plan]") {
  SyntheticOptions o;
  o.target_bytes = 64ull << 20;
  o.layers = 2;
  SyntheticModel m = plan_model(o);
  CHECK(m.layers == 2);
  CHECK(m.tensors.size() == 3 + 18);
  CHECK(std::abs(static_cast<double>(m.total_bytes) - (64 << 20)) / (64 << 20) < 0.05);
}

TEST_CASE("synth – bad options are invalid_argument", "[synth][plan]") {
  SyntheticOptions o;
  o.dtype = DType::I32;
  CHECK_THROWS_AS(plan_model(o), Error);
  o.dtype = DType::BF16;
  o.target_bytes = 0;
  CHECK_THROWS_AS(plan_model(o), Error);
  o.target_bytes = 1 << 20;
  o.layers = 1'000'000;
  CHECK_THROWS_AS(plan_model(o), Error);
  o.layers = 0;
  o.shards = 0;
  test::TempDir dir;
  CHECK_THROWS_AS(write_synthetic(dir / "x", o), Error);
}

// ---------------------------------------------------------------------------------------
// Values
// ---------------------------------------------------------------------------------------

TEST_CASE("synth – values are deterministic per seed and tensor", "[synth][values]") {
  const TensorSpec t{"model.layers.0.mlp.up_proj.weight", DType::BF16, {64, 33}};
  CHECK(tensor_bytes(7, t) == tensor_bytes(7, t));
  CHECK(tensor_bytes(7, t) != tensor_bytes(8, t));
  TensorSpec renamed = t;
  renamed.name = "model.layers.1.mlp.up_proj.weight";
  CHECK(tensor_bytes(7, t) != tensor_bytes(7, renamed));
  // The shape does not matter: a tensor's first bytes are the same at any size.
  TensorSpec bigger = t;
  bigger.shape = {128, 33};
  std::vector<std::byte> big = tensor_bytes(7, bigger);
  big.resize(tensor_nbytes(t));
  CHECK(big == tensor_bytes(7, t));
}

TEST_CASE("synth – any byte range equals the slice of the whole tensor", "[synth][values]") {
  for (DType dtype : {DType::BF16, DType::F16, DType::F32}) {
    const TensorSpec t{"w", dtype, {3, 67}};
    const std::vector<std::byte> whole = tensor_bytes(42, t);
    for (std::size_t begin : {0, 1, 3, 7, 8, 9, 15, 100, 401}) {
      for (std::size_t len : {0, 1, 2, 5, 8, 13, 64}) {
        if (begin + len > whole.size()) continue;
        std::vector<std::byte> part(len);
        fill_tensor_bytes(42, t, begin, part);
        INFO(dtype_name(dtype) << " [" << begin << ", +" << len << ")");
        CHECK(std::equal(part.begin(), part.end(), whole.begin() + static_cast<std::ptrdiff_t>(begin)));
      }
    }
    std::vector<std::byte> tail(2);
    CHECK_THROWS_AS(fill_tensor_bytes(42, t, whole.size() - 1, tail), Error);
    CHECK_THROWS_AS(fill_tensor_bytes(42, t, whole.size() + 1, std::span(tail).first(0)), Error);
  }
  std::vector<std::byte> out(8);
  CHECK_THROWS_AS(fill_tensor_bytes(1, TensorSpec{"x", DType::I32, {2}}, 0, out), Error);
}

TEST_CASE("synth – values look like weights and norms, never NaN or Inf", "[synth][values]") {
  for (DType dtype : {DType::BF16, DType::F16, DType::F32}) {
    for (bool norm : {false, true}) {
      const TensorSpec t{norm ? "model.norm.weight" : "model.layers.3.self_attn.q_proj.weight", dtype, {1 << 16}};
      const std::vector<std::byte> bytes = tensor_bytes(3, t);
      const std::size_t width = dtype == DType::F32 ? 4 : 2;
      double sum = 0, sum2 = 0;
      std::size_t non_finite = 0;
      const std::size_t n = bytes.size() / width;
      for (std::size_t k = 0; k < n; ++k) {
        float v = element_as_float(dtype, bytes.data() + k * width);
        if (!std::isfinite(v)) ++non_finite;
        sum += v;
        sum2 += static_cast<double>(v) * v;
      }
      const double mean = sum / static_cast<double>(n);
      const double sd = std::sqrt(sum2 / static_cast<double>(n) - mean * mean);
      INFO(dtype_name(dtype) << (norm ? " norm" : " weight") << " mean " << mean << " sd " << sd);
      CHECK(non_finite == 0);
      if (norm) {
        CHECK(std::abs(mean - 1.0) < 0.01);
        CHECK(sd == Approx(0.05).epsilon(0.1));
      } else {
        CHECK(std::abs(mean) < 0.001);
        CHECK(sd == Approx(0.02).epsilon(0.1));
      }
    }
  }
}

// ---------------------------------------------------------------------------------------
// Whole synthetic checkpoints
// ---------------------------------------------------------------------------------------

TEST_CASE("synth – write_synthetic writes one file with the planned layout", "[synth][write]") {
  test::TempDir dir;
  SyntheticOptions o;
  o.target_bytes = 1 << 20;
  o.seed = 7;
  std::vector<std::pair<std::uint64_t, std::uint64_t>> progress;
  write_synthetic(dir / "m.safetensors", o,
                  [&](std::uint64_t done, std::uint64_t total) { progress.emplace_back(done, total); });

  const SyntheticModel m = plan_model(o);
  const std::string file = read_file(dir / "m.safetensors");
  const SplitFile split = split_safetensors(file);
  CHECK(split.header == safetensors_header(m.tensors, {{"format", "pt"}, {"generator", "eredu-synth"}, {"seed", "7"}}));
  CHECK(split.header.rfind(R"({"__metadata__":{"format":"pt","generator":"eredu-synth","seed":"7"},)", 0) == 0);
  REQUIRE(split.data.size() == m.total_bytes);
  std::uint64_t offset = 0;
  for (const auto& t : m.tensors) {
    const std::vector<std::byte> expected = tensor_bytes(7, t);
    INFO(t.name);
    CHECK(split.data.compare(offset, expected.size(), as_string(expected)) == 0);
    offset += expected.size();
  }
  REQUIRE(!progress.empty());
  CHECK(progress.back() == std::pair{m.total_bytes, m.total_bytes});
  for (std::size_t k = 1; k < progress.size(); ++k) CHECK(progress[k].first > progress[k - 1].first);

  // The same seed gives the same file; an existing directory gets model.safetensors.
  write_synthetic(dir.path(), o);
  CHECK(read_file(dir / "model.safetensors") == file);
}

TEST_CASE("synth – write_synthetic writes three balanced shards and an index", "[synth][write]") {
  test::TempDir dir;
  SyntheticOptions o;
  o.target_bytes = 2 << 20;
  o.dtype = DType::F32;
  o.shards = 3;
  o.seed = 11;
  write_synthetic(dir / "ckpt", o);

  const SyntheticModel m = plan_model(o);
  const std::vector<std::size_t> starts = split_evenly(m.tensors, 3);
  CHECK(read_file(dir / "ckpt" / "model.safetensors.index.json") == sharded_index_json(m.tensors, starts));
  const std::string index = read_file(dir / "ckpt" / "model.safetensors.index.json");
  CHECK(index.find("\"total_size\": " + std::to_string(m.total_bytes) + "\n") != std::string::npos);

  std::uint64_t data_total = 0;
  for (std::size_t s = 0; s < 3; ++s) {
    const auto path = dir / "ckpt" / shard_file_name(s, 3);
    INFO(path);
    const SplitFile split = split_safetensors(read_file(path));
    const std::size_t begin = starts[s];
    const std::size_t end = s + 1 < 3 ? starts[s + 1] : m.tensors.size();
    const auto shard = std::span(m.tensors).subspan(begin, end - begin);
    CHECK(split.header == safetensors_header(shard, {{"format", "pt"}}));
    CHECK(split.data.size() == total_nbytes(shard));
    // Balanced: no shard holds more than half of the data (an even split is a third).
    CHECK(split.data.size() * 2 < m.total_bytes);
    const std::vector<std::byte> last = tensor_bytes(11, shard.back());
    CHECK(split.data.compare(split.data.size() - last.size(), last.size(), as_string(last)) == 0);
    data_total += split.data.size();
  }
  CHECK(data_total == m.total_bytes);
  CHECK(std::distance(std::filesystem::directory_iterator(dir / "ckpt"), std::filesystem::directory_iterator()) == 4);
}

// ---------------------------------------------------------------------------------------
// Read back by the project's own parser
// ---------------------------------------------------------------------------------------

TEST_CASE("synth – open_catalog reads written checkpoints back exactly", "[synth][write][io]") {
  test::TempDir dir;
  SyntheticOptions o;
  o.target_bytes = 1 << 20;
  o.seed = 5;

  SECTION("single file") {
    write_synthetic(dir / "m.safetensors", o);
    const SyntheticModel m = plan_model(o);
    const io::Catalog catalog = io::open_catalog(dir / "m.safetensors");
    REQUIRE(catalog.size() == m.tensors.size());
    REQUIRE(catalog.files().size() == 1);
    CHECK(catalog.total_bytes() == m.total_bytes);
    CHECK(catalog.metadata() == io::Metadata{{"format", "pt"}, {"generator", "eredu-synth"}, {"seed", "5"}});
    std::uint64_t offset = catalog.files()[0].data_offset;
    CHECK(offset % 8 == 0);
    for (std::size_t k = 0; k < m.tensors.size(); ++k) {
      const io::TensorInfo& t = catalog.tensors()[k];
      INFO(m.tensors[k].name);
      CHECK(t.name == m.tensors[k].name);
      CHECK(t.dtype == m.tensors[k].dtype);
      CHECK(t.shape == m.tensors[k].shape);
      CHECK(t.offset == offset);
      CHECK(t.nbytes == tensor_nbytes(m.tensors[k]));
      offset += t.nbytes;
    }
    CHECK(offset == std::filesystem::file_size(dir / "m.safetensors"));
  }
  SECTION("three shards") {
    o.shards = 3;
    write_synthetic(dir / "ckpt", o);
    const SyntheticModel m = plan_model(o);
    const io::Catalog catalog = io::open_catalog(dir / "ckpt");
    REQUIRE(catalog.size() == m.tensors.size());
    REQUIRE(catalog.files().size() == 3);
    CHECK(catalog.total_bytes() == m.total_bytes);
    const std::vector<std::size_t> starts = split_evenly(m.tensors, 3);
    for (std::size_t s = 0; s < 3; ++s) {
      const std::size_t begin = starts[s];
      const std::size_t end = s + 1 < 3 ? starts[s + 1] : m.tensors.size();
      const io::CheckpointFile& file = catalog.files()[s];
      CHECK(std::filesystem::path(file.path).filename() == shard_file_name(s, 3));
      CHECK(file.metadata == io::Metadata{{"format", "pt"}});
      std::uint64_t offset = file.data_offset;
      for (std::size_t k = begin; k < end; ++k) {
        const io::TensorInfo& t = catalog.at(m.tensors[k].name);
        INFO(m.tensors[k].name);
        CHECK(t.file == s);
        CHECK(t.offset == offset);
        CHECK(t.nbytes == tensor_nbytes(m.tensors[k]));
        offset += t.nbytes;
      }
      CHECK(offset == file.size);
    }
  }
}

TEST_CASE("synth – escaped names survive a round trip through open_catalog", "[synth][io]") {
  test::TempDir dir;
  const std::vector<TensorSpec> tensors{{"q\"b\\s/\b\f\n\r\t\x01\x1f\x7f\xc3\xa9\xf0\x9f\x98\x80", DType::U8, {1}},
                                        {"", DType::F32, {}},
                                        {std::string("n\0l", 3), DType::BF16, {0, 3}},
                                        {"__metadata__x", DType::I16, {2}}};
  std::vector<std::byte> b1(1), b4(4), b0, b2(4);
  const std::vector<std::span<const std::byte>> data{b1, b4, b0, b2};
  write_safetensors(dir / "names.safetensors", tensors, data, {{"k\"\n", "\xc3\xa9"}});
  const io::Catalog catalog = io::open_catalog(dir / "names.safetensors");
  REQUIRE(catalog.size() == tensors.size());
  for (const auto& t : tensors) {
    const io::TensorInfo* found = catalog.find(t.name);
    REQUIRE(found != nullptr);
    CHECK(found->dtype == t.dtype);
    CHECK(found->shape == t.shape);
  }
  CHECK(catalog.metadata() == io::Metadata{{"k\"\n", "\xc3\xa9"}});
}
