#include "eredu/io/formats/safetensors.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>
#include <catch2/catch.hpp>

#include <set>
#include <string>
#include <vector>

#include "eredu/core/error.hpp"
#include "support/st_bytes.hpp"
#include "support/temp_dir.hpp"

using namespace std::literals;
using eredu::errc;
using eredu::io::FileLayout;
using eredu::test::raw_bytes;
using eredu::test::st_entry;
using eredu::test::st_file;
namespace st = eredu::io::safetensors;

namespace {

const std::string file_name = "test.safetensors";

// The spec's `T`: one F32 [2] tensor "t" in 8 bytes.
const std::string T = R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";

// T with the tensor object's body replaced.
std::string t_with(std::string_view body) { return fmt::format(R"({{"t":{{{}}}}})", body); }

// T with a different shape (data_offsets [0,8]).
std::string t_shape(std::string_view shape) {
  return t_with(fmt::format(R"("dtype":"F32","shape":{},"data_offsets":[0,8])", shape));
}

FileLayout parse(const std::vector<std::byte>& bytes) { return st::parse_file_prefix(bytes, bytes.size(), file_name); }

std::vector<std::byte> with_length(std::uint64_t n, std::string_view rest) {
  std::vector<std::byte> out;
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<std::byte>(n >> (8 * i)));
  for (char c : rest) out.push_back(static_cast<std::byte>(c));
  return out;
}

// A hand-made malformed file, the kind it must be rejected with and what the message names.
struct BadFile {
  std::string label;
  std::vector<std::byte> bytes;
  errc kind;
  std::vector<std::string> needles;  // besides the path, which every message names
};

// Every "Hand-made cases" row of checkpoint-formats.md that the reference rejects (or that
// eredu rejects as a duplicate), plus more cases for each kind.
std::vector<BadFile> bad_files() {
  std::vector<BadFile> v;
  auto add = [&](std::string label, std::vector<std::byte> bytes, errc kind, std::vector<std::string> needles = {}) {
    v.push_back({std::move(label), std::move(bytes), kind, std::move(needles)});
  };
  // 1. header_too_small
  add("0 bytes", {}, errc::header_too_small, {"0 bytes"});
  add("7 bytes", raw_bytes("\x08\0\0\0\0\0\0"sv), errc::header_too_small, {"7 bytes"});
  // 2-3. header_too_large
  add("N = 100,000,001", with_length(100'000'001, "{}"), errc::header_too_large, {"100000001"});
  add("N = 2^64-1", with_length(~std::uint64_t{0}, "{}"), errc::header_too_large, {"18446744073709551615"});
  // 4. invalid_header_length
  add("N larger than the file", with_length(100, "{}"), errc::invalid_header_length, {"100", "108", "10"});
  add("N = 100,000,000 but short file", with_length(100'000'000, "{}"), errc::invalid_header_length, {"100000000"});
  // 5. invalid_header_utf8
  add("byte 0xFF in the header", st_file("{\"\xFF\":1}"), errc::invalid_header_utf8, {"0xFF", "offset 10"});
  add("encoded surrogate ED A0 80", st_file("{\"\xED\xA0\x80\":1}"), errc::invalid_header_utf8, {"0xED"});
  add("overlong C0 AF", st_file("{\"\xC0\xAF\":1}"), errc::invalid_header_utf8, {"0xC0"});
  add("overlong E0 80 AF", st_file("{\"\xE0\x80\xAF\":1}"), errc::invalid_header_utf8);
  add("above U+10FFFF", st_file("{\"\xF4\x90\x80\x80\":1}"), errc::invalid_header_utf8);
  add("truncated sequence", st_file("{\"a\":\"\xE2\x82\"}"), errc::invalid_header_utf8);
  // 6. invalid_header_json (syntax)
  add("N = 0", st_file(""), errc::invalid_header_json, {"EOF"});
  add("{", st_file("{"), errc::invalid_header_json, {"EOF"});
  add("BOM + T", st_file("\xEF\xBB\xBF" + T, 8), errc::invalid_header_json, {"expected value"});
  add("T followed by NUL", st_file(T + std::string(1, '\0'), 8), errc::invalid_header_json, {"trailing"});
  add("T followed by x", st_file(T + "x", 8), errc::invalid_header_json, {"trailing characters"});
  add("T followed by // c", st_file(T + "// c", 8), errc::invalid_header_json, {"trailing"});
  add("trailing comma in object", st_file(R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},})", 8),
      errc::invalid_header_json, {"trailing comma"});
  add("trailing comma in array", st_file(t_shape("[2,]"), 8), errc::invalid_header_json, {"trailing comma"});
  add("single quotes", st_file(R"({'t':{'dtype':'F32','shape':[2],'data_offsets':[0,8]}})", 8),
      errc::invalid_header_json);
  add("comment inside", st_file(R"({/* c */"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 8),
      errc::invalid_header_json);
  add("shape [NaN]", st_file(t_shape("[NaN]"), 8), errc::invalid_header_json);
  add("shape [Infinity]", st_file(t_shape("[Infinity]"), 8), errc::invalid_header_json);
  add("shape [+2]", st_file(t_shape("[+2]"), 8), errc::invalid_header_json);
  add("shape [02]", st_file(t_shape("[02]"), 8), errc::invalid_header_json, {"leading zero"});
  add("lone surrogate escape in a key", st_file(R"({"t\ud800":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 8),
      errc::invalid_header_json, {"surrogate"});
  add("lone trailing surrogate escape", st_file(R"({"t\udc00":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 8),
      errc::invalid_header_json, {"surrogate"});
  add("raw U+0001 in a key", st_file("{\"t\x01\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8),
      errc::invalid_header_json, {"control character"});
  add("invalid escape \\x", st_file(R"({"t\x":{}})"), errc::invalid_header_json, {"escape"});
  add("number out of range in an extra field",
      st_file(t_with(R"("dtype":"F32","shape":[2],"data_offsets":[0,8],"x":1e400)"), 8), errc::invalid_header_json,
      {"out of range"});
  add("128 nested arrays",
      st_file(t_with(R"("dtype":"F32","shape":[2],"data_offsets":[0,8],"x":)" + std::string(126, '[') +
                     std::string(126, ']')),
              8),
      errc::invalid_header_json, {"recursion limit"});
  // 6. header_not_object
  add("[]", st_file("[]"), errc::header_not_object, {"array"});
  add("a string", st_file(R"("t")"), errc::header_not_object, {"string"});
  // 6. schema: __metadata__
  add("__metadata__ {\"n\":1}", st_file(R"({"__metadata__":{"n":1}})"), errc::invalid_metadata, {"\"n\"", "number"});
  add("__metadata__ {\"n\":{}}", st_file(R"({"__metadata__":{"n":{}}})"), errc::invalid_metadata, {"object"});
  add("__metadata__ [\"a\"]", st_file(R"({"__metadata__":["a"]})"), errc::invalid_metadata, {"array"});
  add("__metadata__ a string", st_file(R"({"__metadata__":"a"})"), errc::invalid_metadata);
  add("__metadata__ twice", st_file(R"({"__metadata__":{},"__metadata__":{}})"), errc::duplicate_field,
      {"__metadata__", "twice"});
  add("__metadata__ invalid after a bad tensor", st_file(R"({"t":[1,2],"__metadata__":1})"), errc::invalid_metadata);
  // 6. schema: tensor entries
  add("tensor value [1,2]", st_file(R"({"t":[1,2]})"), errc::invalid_tensor_entry, {"'t'", "array"});
  add("tensor value null", st_file(R"({"t":null})"), errc::invalid_tensor_entry, {"'t'"});
  add("missing dtype", st_file(t_with(R"("shape":[2],"data_offsets":[0,8])"), 8), errc::missing_field,
      {"'t'", "dtype"});
  add("missing shape", st_file(t_with(R"("dtype":"F32","data_offsets":[0,8])"), 8), errc::missing_field,
      {"'t'", "shape"});
  add("missing data_offsets", st_file(t_with(R"("dtype":"F32","shape":[2])"), 8), errc::missing_field,
      {"'t'", "data_offsets"});
  add("dtype twice", st_file(t_with(R"("dtype":"F32","dtype":"F32","shape":[2],"data_offsets":[0,8])"), 8),
      errc::duplicate_field, {"'t'", "dtype"});
  add("shape twice", st_file(t_with(R"("dtype":"F32","shape":[2],"shape":[2],"data_offsets":[0,8])"), 8),
      errc::duplicate_field, {"'t'", "shape"});
  add("dtype F128", st_file(t_with(R"("dtype":"F128","shape":[2],"data_offsets":[0,8])"), 8), errc::unknown_dtype,
      {"'t'", "F128"});
  add("dtype f32", st_file(t_with(R"("dtype":"f32","shape":[2],"data_offsets":[0,8])"), 8), errc::unknown_dtype,
      {"f32", "case-sensitive"});
  add("dtype 32", st_file(t_with(R"("dtype":32,"shape":[2],"data_offsets":[0,8])"), 8), errc::unknown_dtype,
      {"number"});
  add("shape [2.0]", st_file(t_shape("[2.0]"), 8), errc::invalid_shape, {"'t'", "2.0"});
  add("shape [2e0]", st_file(t_shape("[2e0]"), 8), errc::invalid_shape, {"2e0"});
  add("shape [-0]", st_file(t_shape("[-0]"), 8), errc::invalid_shape, {"-0"});
  add("shape [-2]", st_file(t_shape("[-2]"), 8), errc::invalid_shape, {"-2"});
  add("shape [true]", st_file(t_shape("[true]"), 8), errc::invalid_shape, {"true"});
  add("shape [\"2\"]", st_file(t_shape(R"(["2"])"), 8), errc::invalid_shape, {"string"});
  add("shape null", st_file(t_shape("null"), 8), errc::invalid_shape, {"null"});
  add("shape [2^64]", st_file(t_shape("[18446744073709551616]"), 8), errc::invalid_shape, {"18446744073709551616"});
  add("data_offsets [0]", st_file(t_with(R"("dtype":"F32","shape":[2],"data_offsets":[0])"), 8),
      errc::invalid_data_offsets, {"'t'", "1 elements"});
  add("data_offsets [0,4,8]", st_file(t_with(R"("dtype":"F32","shape":[2],"data_offsets":[0,4,8])"), 8),
      errc::invalid_data_offsets, {"3 elements"});
  add("data_offsets an object", st_file(t_with(R"("dtype":"F32","shape":[2],"data_offsets":{"a":0,"b":8})"), 8),
      errc::invalid_data_offsets, {"object"});
  add("data_offsets [0,8.0]", st_file(t_with(R"("dtype":"F32","shape":[2],"data_offsets":[0,8.0])"), 8),
      errc::invalid_data_offsets, {"data_offsets[1]", "8.0"});
  // 6. duplicate tensor names (the reference keeps the last one; eredu refuses)
  add("the same tensor entry twice",
      st_file("{" + st_entry("t", "F32", "[2]", 0, 8) + "," + st_entry("t", "F32", "[2]", 0, 8) + "}", 8),
      errc::duplicate_tensor, {"'t'", "twice"});
  add("t twice, [0,4] then [4,8]",
      st_file("{" + st_entry("t", "F32", "[1]", 0, 4) + "," + st_entry("t", "F32", "[1]", 4, 8) + "}", 8),
      errc::duplicate_tensor, {"'t'"});
  add("t twice, [0,8] then [0,4]",
      st_file("{" + st_entry("t", "F32", "[2]", 0, 8) + "," + st_entry("t", "F32", "[1]", 0, 4) + "}", 8),
      errc::duplicate_tensor, {"'t'"});
  add("t and its escaped spelling \\u0074",
      st_file("{" + st_entry("t", "F32", "[1]", 0, 4) + "," + st_entry("\\u0074", "F32", "[1]", 4, 8) + "}", 8),
      errc::duplicate_tensor, {"'t'"});
  // 7. offsets
  add("first tensor at [8,16]", st_file("{" + st_entry("t", "F32", "[2]", 8, 16) + "}", 16), errc::invalid_offset,
      {"'t'", "[8, 16] begin at 8", "ends at 0"});
  add("gap [0,4],[8,12]",
      st_file("{" + st_entry("a", "F32", "[1]", 0, 4) + "," + st_entry("b", "F32", "[1]", 8, 12) + "}", 12),
      errc::invalid_offset, {"'b'", "[8, 12]", "ends at 4", "gap"});
  add("overlap [0,8],[4,12]",
      st_file("{" + st_entry("a", "F32", "[2]", 0, 8) + "," + st_entry("b", "F32", "[2]", 4, 12) + "}", 12),
      errc::invalid_offset, {"'b'", "[4, 12]", "ends at 8", "overlap"});
  add("two tensors at [0,8]",
      st_file("{" + st_entry("a", "F32", "[2]", 0, 8) + "," + st_entry("b", "F32", "[2]", 0, 8) + "}", 8),
      errc::invalid_offset, {"[0, 8]"});
  add("[8,4]", st_file("{" + st_entry("t", "F32", "[1]", 8, 4) + "}", 8), errc::invalid_offset,
      {"[8, 4]", "end before"});
  add("zero-size tensor at [4,4] inside another's range",
      st_file("{" + st_entry("a", "F32", "[2]", 0, 8) + "," + st_entry("z", "F32", "[0]", 4, 4) + "}", 8),
      errc::invalid_offset, {"'z'", "[4, 4] begin at 4", "ends at 8"});
  add("I32 [2,2] in [0,4]", st_file("{" + st_entry("t", "I32", "[2,2]", 0, 4) + "}", 4), errc::tensor_size_mismatch,
      {"'t'", "[0, 4]", "4 bytes", "I32 [2, 2]", "16"});
  add("I32 [2,18446744073709551614]", st_file("{" + st_entry("t", "I32", "[2,18446744073709551614]", 0, 8) + "}", 8),
      errc::size_overflow, {"'t'", "[2, 18446744073709551614]"});
  add("I32 [2,9223372036854775807]", st_file("{" + st_entry("t", "I32", "[2,9223372036854775807]", 0, 8) + "}", 8),
      errc::size_overflow, {"'t'", "18446744073709551614 elements x 32 bits"});
  add("[2, 2^64-2, 0] overflows before the 0",
      st_file("{" + st_entry("t", "U8", "[2,18446744073709551614,0]", 0, 0) + "}"), errc::size_overflow);
  add("F4 [3]", st_file("{" + st_entry("t", "F4", "[3]", 0, 2) + "}", 2), errc::misaligned_slice, {"'t'", "12 bits"});
  add("F6_E3M2 [2]", st_file("{" + st_entry("t", "F6_E3M2", "[2]", 0, 2) + "}", 2), errc::misaligned_slice,
      {"F6_E3M2", "12 bits"});
  // 8. coverage
  add("T with 9 data bytes", st_file(T, 9), errc::incomplete_data, {"data offset 8", "1 bytes after"});
  add("T with 7 data bytes", st_file(T, 7), errc::incomplete_data, {"data offset 8", "1 bytes are missing"});
  add("{} followed by one byte", st_file("{}", 1), errc::incomplete_data, {"data offset 0", "11 bytes"});
  return v;
}

}  // namespace

TEST_CASE("safetensors – rejects every hand-made malformed file with its exact kind", "[io][safetensors]") {
  for (const auto& bad : bad_files()) {
    DYNAMIC_SECTION(bad.label) {
      try {
        parse(bad.bytes);
        FAIL("accepted: " << bad.label);
      } catch (const eredu::Error& e) {
        INFO(e.what());
        CHECK(eredu::errc_name(e.kind()) == std::string(eredu::errc_name(bad.kind)));
        CHECK(e.context().file == file_name);
        CHECK_THAT(e.what(), Catch::Contains(file_name));
        for (const auto& needle : bad.needles) CHECK_THAT(e.what(), Catch::Contains(needle));
      }
    }
  }
}

TEST_CASE("safetensors – the malformed table covers every header error kind", "[io][safetensors]") {
  std::set<errc> covered;
  for (const auto& bad : bad_files()) covered.insert(bad.kind);
  for (int k = static_cast<int>(errc::header_too_small); k <= static_cast<int>(errc::incomplete_data); ++k) {
    INFO(eredu::errc_name(static_cast<errc>(k)));
    CHECK(covered.count(static_cast<errc>(k)) == 1);
  }
}

TEST_CASE("safetensors – a Git LFS pointer is named as such", "[io][safetensors]") {
  const auto bytes = raw_bytes("version https://git-lfs.github.com/spec/v1\noid sha256:abc\nsize 1234\n");
  try {
    parse(bytes);
    FAIL("accepted");
  } catch (const eredu::Error& e) {
    CHECK(e.kind() == errc::header_too_large);
    CHECK_THAT(e.what(), Catch::Contains("Git LFS pointer") && Catch::Contains("git lfs pull"));
  }
}

TEST_CASE("safetensors – error offsets are absolute file offsets", "[io][safetensors]") {
  // "{"t":... the bad byte in `"dtype":"F128"` sits at header offset 15, file offset 23.
  const auto bytes = st_file(t_with(R"("dtype":"F128","shape":[2],"data_offsets":[0,8])"), 8);
  try {
    parse(bytes);
    FAIL("accepted");
  } catch (const eredu::Error& e) {
    REQUIRE(e.context().offset);
    CHECK(*e.context().offset == 8 + std::string_view(R"({"t":{"dtype":)").size());
    CHECK(e.context().tensor == "t");
  }
  try {
    parse(st_file("{\"t\" 1}"));
    FAIL("accepted");
  } catch (const eredu::Error& e) {
    CHECK(e.kind() == errc::invalid_header_json);
    REQUIRE(e.context().offset);
    CHECK(*e.context().offset == 8 + 5);
    CHECK_THAT(e.what(), Catch::Contains("header offset 5"));
  }
}

TEST_CASE("safetensors – accepts T with whitespace, padding and extra fields", "[io][safetensors]") {
  for (const std::string& header :
       {T, " \t\n\r" + T, T + "   ", T + "\n", t_with(R"("dtype":"F32","shape":[2],"data_offsets":[0,8],"extra":1)"),
        t_with(R"("extra":{"a":[1,{"b":null}],"a":"\ud83d\ude00"},"dtype":"F32","shape":[2],"data_offsets":[0,8])")}) {
    INFO(header);
    const auto layout = parse(st_file(header, 8));
    REQUIRE(layout.tensors.size() == 1);
    const auto& t = layout.tensors[0];
    CHECK(t.name == "t");
    CHECK(t.dtype == eredu::DType::F32);
    CHECK(t.shape == eredu::Shape{2});
    CHECK(layout.data_offset == 8 + header.size());
    CHECK(t.offset == 8 + header.size());
    CHECK(t.nbytes == 8);
    CHECK(layout.format == "safetensors");
  }
}

TEST_CASE("safetensors – 127 nested arrays in an extra field are accepted", "[io][safetensors]") {
  // The top-level object and the tensor object are two levels; 125 more make 127.
  const auto header =
      t_with(R"("dtype":"F32","shape":[2],"data_offsets":[0,8],"x":)" + std::string(125, '[') + std::string(125, ']'));
  CHECK(parse(st_file(header, 8)).tensors.size() == 1);
}

TEST_CASE("safetensors – __metadata__ null, empty, and last-wins duplicates", "[io][safetensors]") {
  auto layout = parse(st_file(R"({"__metadata__":null,"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 8));
  CHECK(layout.metadata.empty());
  CHECK(layout.tensors.size() == 1);

  layout = parse(st_file(R"({"__metadata__":{}})"));
  CHECK(layout.metadata.empty());
  CHECK(layout.tensors.empty());

  layout = parse(st_file(R"({"__metadata__":{"a":"b","a":"c","format":"pt"}})"));
  CHECK(layout.metadata == eredu::io::Metadata{{"a", "c"}, {"format", "pt"}});

  // Names merely starting with __metadata__ are tensors.
  layout = parse(st_file("{" + st_entry("__metadata__x", "U8", "[1]", 0, 1) + "}", 1));
  REQUIRE(layout.tensors.size() == 1);
  CHECK(layout.tensors[0].name == "__metadata__x");
}

TEST_CASE("safetensors – N = 100,000,000 exactly is accepted", "[io][safetensors]") {
  std::string header = "{}";
  header.resize(st::max_header_size, ' ');
  const auto layout = parse(st_file(header));
  CHECK(layout.tensors.empty());
  CHECK(layout.data_offset == 100'000'008);
}

TEST_CASE("safetensors – sub-byte and rare dtypes with exact sizes are accepted", "[io][safetensors]") {
  const auto layout = parse(
      st_file("{" + st_entry("f4", "F4", "[4]", 0, 2) + "," + st_entry("f6", "F6_E2M3", "[4]", 2, 5) + "," +
                  st_entry("e8", "F8_E8M0", "[3]", 5, 8) + "," + st_entry("c64", "C64", "[1]", 8, 16) + "," +
                  st_entry("fnuz1", "F8_E4M3FNUZ", "[2]", 16, 18) + "," +
                  st_entry("fnuz2", "F8_E5M2FNUZ", "[2]", 18, 20) + "," + st_entry("u64", "U64", "[1]", 20, 28) + "}",
              28));
  REQUIRE(layout.tensors.size() == 7);
  CHECK(layout.tensors[0].dtype == eredu::DType::F4);
  CHECK(layout.tensors[0].nbytes == 2);
  CHECK(layout.tensors[1].dtype == eredu::DType::F6_E2M3);
  CHECK(layout.tensors[1].nbytes == 3);
  CHECK(layout.tensors[4].dtype == eredu::DType::F8_E4M3FNUZ);
  CHECK(layout.tensors[5].dtype == eredu::DType::F8_E5M2FNUZ);
  CHECK(layout.tensors[6].dtype == eredu::DType::U64);
}

TEST_CASE("safetensors – keys out of order, zero-size tensors, scalars and empty names", "[io][safetensors]") {
  const std::string header = "{" + st_entry("b", "F32", "[2]", 8, 16) + "," + st_entry("", "F64", "[]", 16, 24) + "," +
                             st_entry("a", "F32", "[2]", 0, 8) + "," + st_entry("z0", "F32", "[2,0]", 0, 0) + "," +
                             st_entry("zend", "I8", "[0]", 24, 24) + "}";
  const auto layout = parse(st_file(header, 24));
  REQUIRE(layout.tensors.size() == 5);
  const std::uint64_t base = 8 + header.size();
  // Ascending (begin, end); ties keep header order.
  CHECK(layout.tensors[0].name == "z0");
  CHECK(layout.tensors[0].offset == base);
  CHECK(layout.tensors[0].nbytes == 0);
  CHECK(layout.tensors[0].shape == eredu::Shape{2, 0});
  CHECK(layout.tensors[1].name == "a");
  CHECK(layout.tensors[1].offset == base);
  CHECK(layout.tensors[2].name == "b");
  CHECK(layout.tensors[2].offset == base + 8);
  CHECK(layout.tensors[3].name == "");
  CHECK(layout.tensors[3].shape.empty());
  CHECK(layout.tensors[3].dtype == eredu::DType::F64);
  CHECK(layout.tensors[3].offset == base + 16);
  CHECK(layout.tensors[4].name == "zend");
  CHECK(layout.tensors[4].offset == base + 24);
  CHECK(layout.tensors[4].nbytes == 0);
}

TEST_CASE("safetensors – the reference writer's example and an empty dict", "[io][safetensors]") {
  const std::string header = R"({"attn.0":{"dtype":"F32","shape":[1,2,3],"data_offsets":[0,24]}})";
  REQUIRE(header.size() == 64);
  auto layout = parse(st_file(header, 24));
  REQUIRE(layout.tensors.size() == 1);
  CHECK(layout.tensors[0].offset == 72);
  CHECK(layout.tensors[0].shape == eredu::Shape{1, 2, 3});

  layout = parse(st_file("{}      "));
  CHECK(layout.tensors.empty());
  CHECK(layout.data_offset == 16);
}

TEST_CASE("safetensors – unaligned headers are fine", "[io][safetensors]") {
  const std::string header = R"({"t":{"dtype":"U16","shape":[3],"data_offsets":[0,6]}} )";
  REQUIRE(header.size() % 8 != 0);
  const auto layout = parse(st_file(header, 6));
  CHECK(layout.tensors.at(0).offset == 8 + header.size());
}

TEST_CASE("safetensors – parse_file_prefix needs the whole header", "[io][safetensors]") {
  const auto bytes = st_file(T, 8);
  try {
    st::parse_file_prefix(std::span(bytes).first(20), bytes.size(), file_name);
    FAIL("accepted");
  } catch (const eredu::Error& e) {
    CHECK(e.kind() == errc::invalid_argument);
  }
  // The prefix alone is enough to reject a bad length.
  const auto short_prefix = with_length(100, "");
  CHECK_THROWS_MATCHES(
      st::parse_file_prefix(short_prefix, 50, file_name), eredu::Error,
      Catch::Predicate<eredu::Error>([](const eredu::Error& e) { return e.kind() == errc::invalid_header_length; }));
}

TEST_CASE("safetensors – read_layout reads the header from a file", "[io][safetensors]") {
  eredu::test::TempDir dir;
  const auto file = (dir / "a.safetensors").string();
  const auto bytes = st_file("{" + st_entry("w", "BF16", "[2,2]", 0, 8) + "}", 8);
  eredu::test::write_bytes(file, bytes);
  const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
  REQUIRE(fd >= 0);
  const auto layout = st::read_layout(fd, bytes.size(), file);
  CHECK(layout.tensors.at(0).name == "w");
  CHECK(layout.tensors.at(0).nbytes == 8);
  // A size larger than the file (it shrank since fstat) ends the header read early.
  eredu::test::write_bytes(file, st_file("{" + st_entry("w", "BF16", "[2,2]", 0, 8) + "}"));
  try {
    st::read_layout(fd, 4096, file);
    FAIL("accepted");
  } catch (const eredu::Error& e) {
    CHECK(e.kind() == errc::incomplete_data);
  }
  ::close(fd);

  // Too-large lengths are refused before anything is allocated.
  eredu::test::write_bytes(file, with_length(~std::uint64_t{0} - 3, "{}"));
  const int fd2 = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
  REQUIRE(fd2 >= 0);
  CHECK_THROWS_AS(st::read_layout(fd2, 10, file), eredu::Error);
  ::close(fd2);
}

TEST_CASE("safetensors – the format probes and is the fallback", "[io][safetensors]") {
  st::SafetensorsFormat f;
  CHECK(f.name() == "safetensors");
  const auto bytes = st_file(T, 8);
  CHECK(f.probe(std::span(bytes).first(16), "model.bin"));
  CHECK(f.probe({}, "x.safetensors"));
  const auto gguf = raw_bytes("GGUF\x03\0\0\0\0\0\0\0\0\0\0\0"sv);
  CHECK_FALSE(f.probe(gguf, "x.gguf"));
  const auto formats = eredu::io::checkpoint_formats();
  REQUIRE_FALSE(formats.empty());
  CHECK(formats.back()->name() == "safetensors");
}
