#include "json.hpp"

#include <catch2/catch.hpp>

#include <string>

#include "eredu/core/printable.hpp"
#include "eredu/io/formats/json_text.hpp"

namespace json = eredu::io::json;

namespace {

// Offset of the syntax error in `text`, or -1 when it parses.
long long error_at(std::string_view text) {
  try {
    json::Document::parse(text);
    return -1;
  } catch (const json::SyntaxError& e) {
    return static_cast<long long>(e.offset());
  }
}

}  // namespace

TEST_CASE("json – u64 literals are told apart from other numbers", "[io][json]") {
  const std::string text = R"([0, 7, 18446744073709551615, 18446744073709551616, -0, -2, 2.0, 2e0, 1E2, 0.5, -1.5e-3])";
  const auto doc = json::Document::parse(text);
  std::vector<std::optional<std::uint64_t>> got;
  for (const auto& v : doc.root().items()) got.push_back(v.as_u64());
  const std::vector<std::optional<std::uint64_t>> expected = {0,
                                                              7,
                                                              18446744073709551615ULL,
                                                              std::nullopt,
                                                              std::nullopt,
                                                              std::nullopt,
                                                              std::nullopt,
                                                              std::nullopt,
                                                              std::nullopt,
                                                              std::nullopt,
                                                              std::nullopt};
  CHECK(got == expected);
  CHECK(doc.root().items().size() == 11);
  CHECK((*++doc.root().items().begin()).number_text() == "7");
}

TEST_CASE("json – strings decode escapes and surrogate pairs", "[io][json]") {
  const std::string text =
      R"(["plain", "a\"b\\c\/d\b\f\n\r\t", "\u00e9\u20AC", "\ud83d\ude00", "\u0000", "caf\u00e9 ok"])";
  const auto doc = json::Document::parse(text);
  std::vector<std::string> got;
  for (const auto& v : doc.root().items()) got.emplace_back(v.as_string());
  CHECK(got == std::vector<std::string>{"plain", "a\"b\\c/d\b\f\n\r\t", "\xC3\xA9\xE2\x82\xAC", "\xF0\x9F\x98\x80",
                                        std::string(1, '\0'), "caf\xC3\xA9 ok"});
}

TEST_CASE("json – objects keep duplicate keys in order", "[io][json]") {
  const std::string text = R"({"a": 1, "b": {"x": [true, false, null]}, "a": "two"})";
  const auto doc = json::Document::parse(text);
  std::vector<std::string> keys;
  for (const auto& m : doc.root().members()) keys.emplace_back(m.key.as_string());
  CHECK(keys == std::vector<std::string>{"a", "b", "a"});
  CHECK(doc.root().to_json() == R"({"a":1,"b":{"x":[true,false,null]},"a":"two"})");
  CHECK(doc.root().offset() == 0);
}

TEST_CASE("json – strict syntax errors and their offsets", "[io][json]") {
  CHECK(error_at("") == 0);
  CHECK(error_at("  ") == 2);
  CHECK(error_at("{} x") == 3);
  CHECK(error_at("[1,]") == 3);
  CHECK(error_at("{\"a\":1,}") == 7);
  CHECK(error_at("[01]") == 2);
  CHECK(error_at("[+1]") == 1);
  CHECK(error_at("[.5]") == 1);
  CHECK(error_at("[1.]") == 3);
  CHECK(error_at("[1e]") == 3);
  CHECK(error_at("[NaN]") == 1);
  CHECK(error_at("[-Infinity]") == 2);
  CHECK(error_at("['a']") == 1);
  CHECK(error_at("[\"\\ud800\"]") == 2);
  CHECK(error_at("[\"\\ud800\\u0041\"]") == 2);
  CHECK(error_at("[\"\\udc00\"]") == 2);
  CHECK(error_at("[\"a\tb\"]") == 3);
  CHECK(error_at("[\"\\q\"]") == 2);
  CHECK(error_at("[1e400]") == 1);
  CHECK(error_at("[-1e309]") == 1);
  CHECK(error_at("[tru]") == 1);
  CHECK(error_at("{1:2}") == 1);
  CHECK(error_at("[1 2]") == 3);
  CHECK(error_at("/* c */ 1") == 0);
  CHECK(error_at("\xEF\xBB\xBF{}") == 0);
  // Accepted edge cases.
  CHECK(error_at(" \t\r\n{} \n") == -1);
  CHECK(error_at("[1e308, 1.7976931348623157e308, 1e-400, 0e99999999999, -0.0]") == -1);
  CHECK(error_at("\"\\ud83d\\ude00\"") == -1);
  CHECK(error_at("123") == -1);
}

TEST_CASE("json – nesting stops at serde_json's recursion limit", "[io][json]") {
  CHECK(error_at(std::string(127, '[') + std::string(127, ']')) == -1);
  CHECK(error_at(std::string(128, '[') + std::string(128, ']')) == 127);
  CHECK(error_at(std::string(100000, '[')) == 127);
}

TEST_CASE("json – UTF-8 validation refuses overlong forms and surrogates", "[io][json]") {
  using json::find_invalid_utf8;
  CHECK_FALSE(find_invalid_utf8("plain ascii text that is long enough for the fast path"));
  CHECK_FALSE(find_invalid_utf8("\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80\xF4\x8F\xBF\xBF"));
  CHECK(find_invalid_utf8("abcdefghij\xFF") == 10u);
  CHECK(find_invalid_utf8("\xC0\xAF") == 0u);
  CHECK(find_invalid_utf8("\xC1\xBF") == 0u);
  CHECK(find_invalid_utf8("a\xE0\x80\xAF") == 1u);
  CHECK(find_invalid_utf8("\xED\xA0\x80") == 0u);
  CHECK(find_invalid_utf8("\xF0\x80\x80\x80") == 0u);
  CHECK(find_invalid_utf8("\xF4\x90\x80\x80") == 0u);
  CHECK(find_invalid_utf8("\xF5\x80\x80\x80") == 0u);
  CHECK(find_invalid_utf8("ab\xE2\x82") == 2u);
  CHECK(find_invalid_utf8("\x80") == 0u);
}

TEST_CASE("json – any bytes quote to valid UTF-8 JSON: controls escaped, invalid bytes as printable writes them",
          "[io][json]") {
  using json::quoted_bytes;
  // Valid text reads back unchanged; controls, DEL, C1 and the line separators are \u escapes.
  const std::string valid = std::string("a\"b\\c\x1b[2J\0z\n\t\x7f", 14) + "\xC2\x9B\xE2\x80\xA8\xE2\x80\xA9 é€😀";
  const std::string text = quoted_bytes(valid);
  CHECK(text ==
        "\"a\\\"b\\\\c\\u001b[2J\\u0000z\\n\\t\\u007f\\u009b\\u2028\\u2029 \xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80\"");
  CHECK(json::Document::parse(text).root().as_string() == valid);
  // ASCII only but for the valid multi-byte characters: no raw control byte reaches a terminal.
  for (char c : text) CHECK((static_cast<unsigned char>(c) >= 0x20 && c != 0x7f));

  // Not UTF-8 (a lone byte, a truncated sequence, an overlong form, a surrogate): each byte
  // as \xNN, the text eredu::printable writes in messages, so the two read the same.
  const std::string invalid = "p\xFF/q\xE2\x82.r\xC0\xAFs\xED\xA0\x80t";
  const std::string quoted = quoted_bytes(invalid);
  CHECK_FALSE(json::find_invalid_utf8(quoted));
  const std::string decoded(json::Document::parse(quoted).root().as_string());
  CHECK(decoded == "p\\xff/q\\xe2\\x82.r\\xc0\\xafs\\xed\\xa0\\x80t");
  CHECK(decoded == eredu::printable(invalid));
}
