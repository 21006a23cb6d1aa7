#include "json.hpp"

#include <fmt/format.h>

#include <array>
#include <charconv>
#include <cmath>
#include <limits>

#include "utf8.hpp"

namespace eredu::io::json {

namespace {

// Length of the well-formed UTF-8 sequence at s[i] (s[i] >= 0x80): 2..4, or 0 when none starts
// there. The ranges of the second byte follow the Unicode table of well-formed sequences
// (Table 3-7), which excludes overlong forms, surrogates and values above U+10FFFF.
std::size_t utf8_sequence_length(const unsigned char* s, std::size_t n, std::size_t i) noexcept {
  const unsigned c = s[i];
  std::size_t len;
  unsigned lo = 0x80, hi = 0xBF;
  if (c >= 0xC2 && c <= 0xDF) {
    len = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    len = 3;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    len = 4;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  if (i + 1 >= n || s[i + 1] < lo || s[i + 1] > hi) return 0;
  for (std::size_t k = 2; k < len; ++k) {
    if (i + k >= n || (s[i + k] & 0xC0) != 0x80) return 0;
  }
  return len;
}

}  // namespace

std::optional<std::size_t> find_invalid_utf8(std::string_view bytes) noexcept {
  const auto* s = reinterpret_cast<const unsigned char*>(bytes.data());
  const std::size_t n = bytes.size();
  std::size_t i = 0;
  while (i < n) {
    // Headers are almost all ASCII: skip 8 bytes at a time while no high bit is set.
    while (i + 8 <= n) {
      std::uint64_t w;
      __builtin_memcpy(&w, s + i, 8);
      if (w & 0x8080808080808080ULL) break;
      i += 8;
    }
    if (i >= n) break;
    if (s[i] < 0x80) {
      ++i;
      continue;
    }
    const std::size_t len = utf8_sequence_length(s, n, i);
    if (len == 0) return i;
    i += len;
  }
  return std::nullopt;
}

std::string_view kind_name(Kind k) noexcept {
  switch (k) {
    case Kind::null:
      return "null";
    case Kind::boolean:
      return "boolean";
    case Kind::number:
      return "number";
    case Kind::string:
      return "string";
    case Kind::array:
      return "array";
    case Kind::object:
      return "object";
  }
  return "?";
}

namespace {

// serde_json refuses the 128th nested container.
constexpr int max_depth = 127;

// Bytes that end the fast scan of a string: the quote, the backslash, control characters.
constexpr std::array<bool, 256> string_stop = [] {
  std::array<bool, 256> t{};
  for (int c = 0; c < 0x20; ++c) t[c] = true;
  t['"'] = true;
  t['\\'] = true;
  return t;
}();

int hex_value(char c) noexcept {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

class Parser {
 public:
  Parser(std::string_view text, Document& doc) : text_(text), doc_(doc) {}

  void run() {
    if (text_.size() >= std::numeric_limits<std::uint32_t>::max()) {
      throw SyntaxError(0, "text larger than 4 GiB");
    }
    skip_ws();
    parse_value(0);
    skip_ws();
    if (pos_ != text_.size()) fail(pos_, "trailing characters");
  }

 private:
  [[noreturn]] void fail(std::size_t at, const std::string& why) const { throw SyntaxError(at, why); }

  [[noreturn]] void fail_eof(const char* parsing) const { fail(pos_, fmt::format("EOF while parsing {}", parsing)); }

  void skip_ws() noexcept {
    while (pos_ < text_.size()) {
      char c = text_[pos_];
      if (c != ' ' && c != '\n' && c != '\t' && c != '\r') break;
      ++pos_;
    }
  }

  std::uint32_t push(Kind kind, std::size_t offset) {
    doc_.nodes_.push_back(Document::Node{kind, 0, static_cast<std::uint32_t>(offset), 0, 0});
    return static_cast<std::uint32_t>(doc_.nodes_.size() - 1);
  }

  bool literal(std::string_view word) {
    if (text_.substr(pos_, word.size()) != word) return false;
    pos_ += word.size();
    return true;
  }

  void parse_value(int depth) {
    if (pos_ >= text_.size()) fail_eof("a value");
    const std::size_t start = pos_;
    switch (text_[pos_]) {
      case '{':
        return parse_object(depth + 1);
      case '[':
        return parse_array(depth + 1);
      case '"':
        return parse_string();
      case 'n':
        if (!literal("null")) fail(start, "expected ident (null)");
        push(Kind::null, start);
        return;
      case 't':
        if (!literal("true")) fail(start, "expected ident (true)");
        doc_.nodes_[push(Kind::boolean, start)].flags = Document::flag_true;
        return;
      case 'f':
        if (!literal("false")) fail(start, "expected ident (false)");
        push(Kind::boolean, start);
        return;
      case '-':
      case '0':
      case '1':
      case '2':
      case '3':
      case '4':
      case '5':
      case '6':
      case '7':
      case '8':
      case '9':
        return parse_number();
      default:
        fail(start, "expected value");
    }
  }

  void enter(int depth) const {
    if (depth > max_depth)
      fail(pos_, fmt::format("recursion limit exceeded (more than {} nested arrays/objects)", max_depth));
  }

  void parse_array(int depth) {
    enter(depth);
    const std::uint32_t self = push(Kind::array, pos_);
    ++pos_;  // '['
    skip_ws();
    std::uint32_t count = 0;
    if (pos_ < text_.size() && text_[pos_] == ']') {
      ++pos_;
    } else {
      for (;;) {
        parse_value(depth);
        ++count;
        skip_ws();
        if (pos_ >= text_.size()) fail_eof("a list");
        const char c = text_[pos_];
        if (c == ']') {
          ++pos_;
          break;
        }
        if (c != ',') fail(pos_, "expected `,` or `]`");
        ++pos_;
        skip_ws();
        if (pos_ < text_.size() && text_[pos_] == ']') fail(pos_, "trailing comma");
      }
    }
    auto& node = doc_.nodes_[self];
    node.length = count;
    node.aux = static_cast<std::uint32_t>(doc_.nodes_.size());
  }

  void parse_object(int depth) {
    enter(depth);
    const std::uint32_t self = push(Kind::object, pos_);
    ++pos_;  // '{'
    skip_ws();
    std::uint32_t count = 0;
    if (pos_ < text_.size() && text_[pos_] == '}') {
      ++pos_;
    } else {
      for (;;) {
        if (pos_ >= text_.size()) fail_eof("an object");
        if (text_[pos_] != '"') fail(pos_, "key must be a string");
        parse_string();
        skip_ws();
        if (pos_ >= text_.size()) fail_eof("an object");
        if (text_[pos_] != ':') fail(pos_, "expected `:`");
        ++pos_;
        skip_ws();
        parse_value(depth);
        ++count;
        skip_ws();
        if (pos_ >= text_.size()) fail_eof("an object");
        const char c = text_[pos_];
        if (c == '}') {
          ++pos_;
          break;
        }
        if (c != ',') fail(pos_, "expected `,` or `}`");
        ++pos_;
        skip_ws();
        if (pos_ < text_.size() && text_[pos_] == '}') fail(pos_, "trailing comma");
      }
    }
    auto& node = doc_.nodes_[self];
    node.length = count;
    node.aux = static_cast<std::uint32_t>(doc_.nodes_.size());
  }

  std::uint32_t read_hex4() {
    if (pos_ + 4 > text_.size()) fail_eof("a string");
    std::uint32_t v = 0;
    for (int k = 0; k < 4; ++k) {
      const int h = hex_value(text_[pos_ + k]);
      if (h < 0) fail(pos_ + k, "invalid escape");
      v = v * 16 + static_cast<std::uint32_t>(h);
    }
    pos_ += 4;
    return v;
  }

  void parse_string() {
    const std::size_t start = pos_;
    const std::uint32_t self = push(Kind::string, start);
    ++pos_;  // opening quote
    const auto* s = reinterpret_cast<const unsigned char*>(text_.data());
    std::size_t run = pos_;
    while (pos_ < text_.size() && !string_stop[s[pos_]]) ++pos_;
    if (pos_ >= text_.size()) fail_eof("a string");
    if (text_[pos_] == '"') {
      // No escapes: the value is a view into the text.
      auto& node = doc_.nodes_[self];
      node.length = static_cast<std::uint32_t>(pos_ - run);
      ++pos_;
      return;
    }
    // Escapes: decode into the pool.
    std::string& pool = doc_.pool_;
    const std::size_t pool_start = pool.size();
    if (pool_start + (text_.size() - start) >= std::numeric_limits<std::uint32_t>::max()) {
      fail(start, "decoded strings larger than 4 GiB");
    }
    for (;;) {
      pool.append(text_.substr(run, pos_ - run));
      if (pos_ >= text_.size()) fail_eof("a string");
      const char c = text_[pos_];
      if (c == '"') {
        ++pos_;
        break;
      }
      if (c != '\\') fail(pos_, "control character (\\u0000-\\u001F) found while parsing a string");
      const std::size_t esc = pos_;
      ++pos_;
      if (pos_ >= text_.size()) fail_eof("a string");
      switch (text_[pos_++]) {
        case '"':
          pool.push_back('"');
          break;
        case '\\':
          pool.push_back('\\');
          break;
        case '/':
          pool.push_back('/');
          break;
        case 'b':
          pool.push_back('\b');
          break;
        case 'f':
          pool.push_back('\f');
          break;
        case 'n':
          pool.push_back('\n');
          break;
        case 'r':
          pool.push_back('\r');
          break;
        case 't':
          pool.push_back('\t');
          break;
        case 'u': {
          std::uint32_t cp = read_hex4();
          if (cp >= 0xDC00 && cp <= 0xDFFF) fail(esc, "lone trailing surrogate in hex escape");
          if (cp >= 0xD800 && cp <= 0xDBFF) {
            if (pos_ + 2 > text_.size() || text_[pos_] != '\\' || text_[pos_ + 1] != 'u') {
              fail(esc, "lone leading surrogate in hex escape");
            }
            pos_ += 2;
            const std::uint32_t low = read_hex4();
            if (low < 0xDC00 || low > 0xDFFF) fail(esc, "lone leading surrogate in hex escape");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
          }
          detail::append_utf8(pool, cp);
          break;
        }
        default:
          fail(esc, "invalid escape");
      }
      run = pos_;
      while (pos_ < text_.size() && !string_stop[s[pos_]]) ++pos_;
    }
    auto& node = doc_.nodes_[self];
    node.flags = Document::flag_escaped;
    node.aux = static_cast<std::uint32_t>(pool_start);
    node.length = static_cast<std::uint32_t>(pool.size() - pool_start);
  }

  bool digit_at(std::size_t i) const noexcept { return i < text_.size() && text_[i] >= '0' && text_[i] <= '9'; }

  void parse_number() {
    const std::size_t start = pos_;
    const bool negative = text_[pos_] == '-';
    if (negative) ++pos_;
    if (!digit_at(pos_)) {
      if (pos_ >= text_.size()) fail_eof("a number");
      fail(pos_, "invalid number");
    }
    // Decimal exponent of the leading significant digit, to detect values a double
    // cannot hold (serde_json's "number out of range").
    bool all_zero = true;
    std::int64_t lead_exp = 0;
    bool lead_found = false;
    const std::size_t int_start = pos_;
    if (text_[pos_] == '0') {
      ++pos_;
      if (digit_at(pos_)) fail(pos_, "invalid number (leading zero)");
    } else {
      while (digit_at(pos_)) ++pos_;
    }
    const std::size_t int_end = pos_;
    for (std::size_t i = int_start; i < int_end; ++i) {
      if (text_[i] != '0') {
        all_zero = false;
        lead_exp = static_cast<std::int64_t>(int_end - i) - 1;
        lead_found = true;
        break;
      }
    }
    bool is_integer = true;
    if (pos_ < text_.size() && text_[pos_] == '.') {
      is_integer = false;
      ++pos_;
      if (!digit_at(pos_)) {
        if (pos_ >= text_.size()) fail_eof("a number");
        fail(pos_, "invalid number (no digit after `.`)");
      }
      const std::size_t frac_start = pos_;
      while (digit_at(pos_)) {
        if (!lead_found && text_[pos_] != '0') {
          all_zero = false;
          lead_found = true;
          lead_exp = -static_cast<std::int64_t>(pos_ - frac_start) - 1;
        }
        ++pos_;
      }
    }
    std::int64_t exp = 0;
    if (pos_ < text_.size() && (text_[pos_] == 'e' || text_[pos_] == 'E')) {
      is_integer = false;
      ++pos_;
      bool exp_negative = false;
      if (pos_ < text_.size() && (text_[pos_] == '+' || text_[pos_] == '-')) {
        exp_negative = text_[pos_] == '-';
        ++pos_;
      }
      if (!digit_at(pos_)) {
        if (pos_ >= text_.size()) fail_eof("a number");
        fail(pos_, "invalid number (no digit in exponent)");
      }
      while (digit_at(pos_)) {
        // Saturate: anything beyond a billion is out of range (or zero) either way.
        if (exp < 1'000'000'000) exp = exp * 10 + (text_[pos_] - '0');
        ++pos_;
      }
      if (exp_negative) exp = -exp;
    }
    const std::uint32_t self = push(Kind::number, start);
    auto& node = doc_.nodes_[self];
    node.length = static_cast<std::uint32_t>(pos_ - start);
    if (!all_zero) {
      const std::int64_t magnitude = lead_exp + exp;
      bool overflow = magnitude > 308;
      if (magnitude == 308) {
        double d = 0;
        auto text = text_.substr(start, pos_ - start);
        auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), d);
        overflow = ec == std::errc::result_out_of_range || std::isinf(d);
      }
      if (overflow) fail(start, "number out of range");
    }
    if (is_integer && !negative) {
      std::uint64_t v = 0;
      auto [ptr, ec] = std::from_chars(text_.data() + int_start, text_.data() + int_end, v);
      if (ec == std::errc{}) doc_.nodes_[self].flags = Document::flag_u64;
    }
  }

  std::string_view text_;
  Document& doc_;
  std::size_t pos_ = 0;
};

Document Document::parse(std::string_view text) {
  Document doc;
  doc.text_ = text;
  // A rough guess that avoids most regrowth for typical headers (a node per ~6 bytes).
  doc.nodes_.reserve(text.size() / 8 + 4);
  Parser(text, doc).run();
  return doc;
}

Kind Value::kind() const noexcept { return doc_->nodes_[index_].kind; }

std::size_t Value::offset() const noexcept { return doc_->nodes_[index_].offset; }

bool Value::as_bool() const noexcept {
  const auto& n = doc_->nodes_[index_];
  return n.kind == Kind::boolean && (n.flags & Document::flag_true) != 0;
}

std::optional<std::uint64_t> Value::as_u64() const noexcept {
  const auto& n = doc_->nodes_[index_];
  if (n.kind != Kind::number || (n.flags & Document::flag_u64) == 0) return std::nullopt;
  std::uint64_t v = 0;
  const char* first = doc_->text_.data() + n.offset;
  std::from_chars(first, first + n.length, v);
  return v;
}

std::string_view Value::number_text() const noexcept {
  const auto& n = doc_->nodes_[index_];
  if (n.kind != Kind::number) return {};
  return doc_->text_.substr(n.offset, n.length);
}

std::string_view Value::as_string() const noexcept {
  const auto& n = doc_->nodes_[index_];
  if (n.kind != Kind::string) return {};
  if (n.flags & Document::flag_escaped) return std::string_view(doc_->pool_).substr(n.aux, n.length);
  return doc_->text_.substr(n.offset + 1, n.length);
}

std::size_t Value::size() const noexcept {
  const auto& n = doc_->nodes_[index_];
  return n.kind == Kind::array || n.kind == Kind::object ? n.length : 0;
}

std::uint32_t Value::next_index() const noexcept {
  const auto& n = doc_->nodes_[index_];
  return n.kind == Kind::array || n.kind == Kind::object ? n.aux : index_ + 1;
}

Range<Value> Value::items() const noexcept {
  if (kind() != Kind::array) return Range<Value>(doc_, 0, 0);
  return Range<Value>(doc_, index_ + 1, size());
}

Range<Member> Value::members() const noexcept {
  if (kind() != Kind::object) return Range<Member>(doc_, 0, 0);
  return Range<Member>(doc_, index_ + 1, size());
}

namespace {

constexpr char hex_digits[] = "0123456789abcdef";

// Appends ASCII byte `c` as serde_json writes it inside a string: quote, backslash,
// \b \f \n \r \t, \u00xx (lowercase) for other control bytes, anything else verbatim.
void append_escaped_ascii(std::string& out, unsigned char c) {
  switch (c) {
    case '"':
      out += "\\\"";
      break;
    case '\\':
      out += "\\\\";
      break;
    case '\b':
      out += "\\b";
      break;
    case '\f':
      out += "\\f";
      break;
    case '\n':
      out += "\\n";
      break;
    case '\r':
      out += "\\r";
      break;
    case '\t':
      out += "\\t";
      break;
    default:
      if (c < 0x20) {
        out += "\\u00";
        out.push_back(hex_digits[c >> 4]);
        out.push_back(hex_digits[c & 0xF]);
      } else {
        out.push_back(static_cast<char>(c));
      }
  }
}

// Appends \uXXXX for a code point of the Basic Multilingual Plane.
void append_u_escape(std::string& out, unsigned code) {
  out += "\\u";
  for (int shift = 12; shift >= 0; shift -= 4) out.push_back(hex_digits[(code >> shift) & 0xF]);
}

}  // namespace

void append_quoted(std::string& out, std::string_view s) {
  out.push_back('"');
  for (unsigned char c : s) append_escaped_ascii(out, c);
  out.push_back('"');
}

void append_quoted_bytes(std::string& out, std::string_view bytes) {
  const auto* s = reinterpret_cast<const unsigned char*>(bytes.data());
  const std::size_t n = bytes.size();
  out.push_back('"');
  for (std::size_t i = 0; i < n;) {
    const unsigned char c = s[i];
    if (c < 0x80) {
      // DEL is valid JSON as it is, but would reach a terminal that prints the document.
      if (c == 0x7F)
        append_u_escape(out, c);
      else
        append_escaped_ascii(out, c);
      ++i;
      continue;
    }
    const std::size_t len = utf8_sequence_length(s, n, i);
    if (len == 0) {
      // Not UTF-8, which JSON text cannot hold: written as eredu::printable writes it in
      // messages (\xNN), so a name reads the same in a document and on stderr.
      out += "\\\\x";
      out.push_back(hex_digits[c >> 4]);
      out.push_back(hex_digits[c & 0xF]);
      ++i;
      continue;
    }
    if (len == 2 && c == 0xC2 && s[i + 1] < 0xA0) {
      append_u_escape(out, s[i + 1]);  // a C1 control: 0x9B is CSI on some terminals
    } else if (len == 3 && c == 0xE2 && s[i + 1] == 0x80 && (s[i + 2] == 0xA8 || s[i + 2] == 0xA9)) {
      // U+2028, U+2029: line ends to JavaScript before ES2019 and to some line readers.
      append_u_escape(out, 0x2028u + (s[i + 2] - 0xA8u));
    } else {
      out.append(bytes.substr(i, len));
    }
    i += len;
  }
  out.push_back('"');
}

namespace {
void append_json(std::string& out, const Value& v) {
  switch (v.kind()) {
    case Kind::null:
      out += "null";
      break;
    case Kind::boolean:
      out += v.as_bool() ? "true" : "false";
      break;
    case Kind::number:
      out += v.number_text();
      break;
    case Kind::string:
      append_quoted(out, v.as_string());
      break;
    case Kind::array: {
      out.push_back('[');
      bool first = true;
      for (const auto& item : v.items()) {
        if (!first) out.push_back(',');
        first = false;
        append_json(out, item);
      }
      out.push_back(']');
      break;
    }
    case Kind::object: {
      out.push_back('{');
      bool first = true;
      for (const auto& m : v.members()) {
        if (!first) out.push_back(',');
        first = false;
        append_quoted(out, m.key.as_string());
        out.push_back(':');
        append_json(out, m.value);
      }
      out.push_back('}');
      break;
    }
  }
}
}  // namespace

std::string Value::to_json() const {
  std::string out;
  append_json(out, *this);
  return out;
}

}  // namespace eredu::io::json
