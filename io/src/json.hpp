#pragma once
/// \file
/// A strict RFC 8259 JSON parser for checkpoint headers and sharded indexes (private to io).
///
/// It accepts and rejects what serde_json (the safetensors reference's parser) does: no BOM,
/// no NaN/Infinity, no leading `+` or zeros, no trailing commas, no comments, no raw control
/// characters or lone surrogate escapes in strings, JSON whitespace only around the value,
/// at most 127 nested containers (serde_json's recursion limit of 128), and no number whose
/// magnitude overflows a double ("number out of range").
///
/// The parse produces a flat tape of 16-byte nodes, so that a 100 MB header with a million
/// tensors costs a few allocations rather than millions. Objects keep every member in order,
/// duplicates included: rejecting or merging duplicate keys is the schema's decision.
/// String and number values are views into the parsed text (unless a string contained
/// escapes, which are decoded into the document), so the text must outlive the Document.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>
#include "eredu/io/formats/json_text.hpp"

namespace eredu::io::json {

/// A syntax error: what was wrong and at which byte of the text.
class SyntaxError : public std::runtime_error {
 public:
  /// `offset` is the byte of the text at which the parser gave up.
  SyntaxError(std::size_t offset, const std::string& reason) : std::runtime_error(reason), offset_(offset) {}
  /// Byte offset within the parsed text.
  std::size_t offset() const noexcept { return offset_; }

 private:
  std::size_t offset_;
};

/// Kind of a JSON value.
enum class Kind : std::uint8_t { null, boolean, number, string, array, object };

/// Name of a kind for messages ("object", "array", ...).
std::string_view kind_name(Kind k) noexcept;

class Document;
class Value;
struct Member;
template <class T>
class Range;

/// A read-only handle to one value of a Document (cheap to copy; valid while the
/// Document lives).
class Value {
 public:
  /// The value's kind.
  Kind kind() const noexcept;
  /// Byte offset of the value's first character in the parsed text.
  std::size_t offset() const noexcept;
  /// The literal true or false (only for booleans).
  bool as_bool() const noexcept;
  /// The number when it is a non-negative integer literal <= 2^64-1 (as serde_json
  /// deserializes a usize); nullopt for every other value, -0, 2.0, 2e0 included.
  std::optional<std::uint64_t> as_u64() const noexcept;
  /// The number's literal text, as written (only for numbers).
  std::string_view number_text() const noexcept;
  /// The decoded string (only for strings).
  std::string_view as_string() const noexcept;
  /// Number of elements of an array or members of an object; 0 otherwise.
  std::size_t size() const noexcept;
  /// The elements of an array, in order (empty for other kinds).
  Range<Value> items() const noexcept;
  /// The members of an object, in order, duplicates kept (empty for other kinds).
  Range<Member> members() const noexcept;
  /// Compact JSON text of the value (for stringifying index metadata).
  std::string to_json() const;

  /// Index of the first node after this value's subtree (used for iteration).
  std::uint32_t next_index() const noexcept;
  /// The node at `index` of `doc` (for Document and Range; not for callers).
  Value(const Document* doc, std::uint32_t index) noexcept : doc_(doc), index_(index) {}

 private:
  const Document* doc_;
  std::uint32_t index_;
};

/// One member of an object: its key (a string Value) and its value.
struct Member {
  Value key;    ///< a string value
  Value value;  ///< the member's value
};

/// The elements (T = Value) or members (T = Member) of a container, walked in place
/// without allocating.
template <class T>
class Range {
 public:
  /// Forward iterator over the container's children.
  class iterator {
   public:
    using value_type = T;
    using difference_type = std::ptrdiff_t;
    iterator() = default;
    T operator*() const noexcept;
    iterator& operator++() noexcept;
    iterator operator++(int) noexcept {
      auto old = *this;
      ++*this;
      return old;
    }
    friend bool operator==(const iterator& a, const iterator& b) noexcept { return a.left_ == b.left_; }

   private:
    friend class Range;
    iterator(const Document* doc, std::uint32_t index, std::size_t left) noexcept
        : doc_(doc), index_(index), left_(left) {}
    const Document* doc_ = nullptr;
    std::uint32_t index_ = 0;
    std::size_t left_ = 0;  // children not yet visited; 0 is the end
  };

  /// First child.
  iterator begin() const noexcept { return iterator(doc_, first_, count_); }
  /// Past the last child.
  iterator end() const noexcept { return iterator(doc_, 0, 0); }
  /// Number of children.
  std::size_t size() const noexcept { return count_; }
  /// True when there are no children.
  bool empty() const noexcept { return count_ == 0; }

 private:
  friend class Value;
  Range(const Document* doc, std::uint32_t first, std::size_t count) noexcept
      : doc_(doc), first_(first), count_(count) {}
  const Document* doc_;
  std::uint32_t first_;
  std::size_t count_;
};

/// A parsed JSON text. Views into the text, which must outlive the Document.
class Document {
 public:
  /// Parses `text` (already known to be valid UTF-8); throws SyntaxError.
  static Document parse(std::string_view text);

  /// The top-level value.
  Value root() const noexcept { return Value(this, 0); }
  /// Number of nodes on the tape (a measure of the parse's memory).
  std::size_t node_count() const noexcept { return nodes_.size(); }

 private:
  friend class Value;
  friend class Parser;

  struct Node {
    Kind kind;
    std::uint8_t flags;    // boolean value, u64-literal number, escaped string
    std::uint32_t offset;  // first byte of the value in the text
    std::uint32_t length;  // string bytes, number text bytes, or container member count
    std::uint32_t aux;     // container: index past the subtree; escaped string: pool offset
  };
  static constexpr std::uint8_t flag_true = 1;
  static constexpr std::uint8_t flag_u64 = 2;
  static constexpr std::uint8_t flag_escaped = 4;

  std::string_view text_;
  std::vector<Node> nodes_;
  std::string pool_;  // decoded bytes of strings that contained escapes
};

template <>
inline Value Range<Value>::iterator::operator*() const noexcept {
  return Value(doc_, index_);
}
template <>
inline Range<Value>::iterator& Range<Value>::iterator::operator++() noexcept {
  index_ = Value(doc_, index_).next_index();
  --left_;
  return *this;
}
template <>
inline Member Range<Member>::iterator::operator*() const noexcept {
  return Member{Value(doc_, index_), Value(doc_, index_ + 1)};
}
template <>
inline Range<Member>::iterator& Range<Member>::iterator::operator++() noexcept {
  index_ = Value(doc_, index_ + 1).next_index();
  --left_;
  return *this;
}

}  // namespace eredu::io::json
