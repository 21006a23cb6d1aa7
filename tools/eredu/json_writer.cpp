#include "json_writer.hpp"

#include <cassert>
#include <cmath>
#include <utility>

#include <fmt/format.h>

#include "eredu/io/formats/json_text.hpp"

namespace eredu::cli {

void JsonWriter::before_value() {
  assert(!done_ && "JsonWriter: a second top-level value");
  if (scopes_.empty()) return;
  if (scopes_.back() == Scope::object) {
    assert(key_pending_ && "JsonWriter: a value inside an object needs a key first");
    key_pending_ = false;
    return;
  }
  if (!first_.back()) out_ += ',';
  first_.back() = false;
}

JsonWriter& JsonWriter::raw_value(std::string_view text) {
  before_value();
  out_ += text;
  if (scopes_.empty()) done_ = true;
  return *this;
}

JsonWriter& JsonWriter::begin_object() {
  before_value();
  out_ += '{';
  scopes_.push_back(Scope::object);
  first_.push_back(true);
  return *this;
}

JsonWriter& JsonWriter::end_object() {
  assert(!scopes_.empty() && scopes_.back() == Scope::object && !key_pending_);
  out_ += '}';
  scopes_.pop_back();
  first_.pop_back();
  if (scopes_.empty()) done_ = true;
  return *this;
}

JsonWriter& JsonWriter::begin_array() {
  before_value();
  out_ += '[';
  scopes_.push_back(Scope::array);
  first_.push_back(true);
  return *this;
}

JsonWriter& JsonWriter::end_array() {
  assert(!scopes_.empty() && scopes_.back() == Scope::array);
  out_ += ']';
  scopes_.pop_back();
  first_.pop_back();
  if (scopes_.empty()) done_ = true;
  return *this;
}

JsonWriter& JsonWriter::key(std::string_view name) {
  assert(!scopes_.empty() && scopes_.back() == Scope::object && !key_pending_);
  if (!first_.back()) out_ += ',';
  first_.back() = false;
  io::json::append_quoted_bytes(out_, name);
  out_ += ':';
  key_pending_ = true;
  return *this;
}

JsonWriter& JsonWriter::value(std::string_view s) {
  before_value();
  io::json::append_quoted_bytes(out_, s);
  if (scopes_.empty()) done_ = true;
  return *this;
}

JsonWriter& JsonWriter::value(bool b) { return raw_value(b ? "true" : "false"); }

JsonWriter& JsonWriter::value(double d) {
  if (!std::isfinite(d)) return null();
  // fmt's "{}" is the shortest text that reads back to the same double; it is valid JSON
  // for every finite value ("1e-07", "2", "0.125").
  return raw_value(fmt::format("{}", d));
}

JsonWriter& JsonWriter::null() { return raw_value("null"); }

JsonWriter& JsonWriter::unit_key(std::string_view name, std::string_view unit) {
  if (name.empty()) return key(unit);
  return key(fmt::format("{}_{}", name, unit));
}

JsonWriter& JsonWriter::bytes(std::string_view name, std::uint64_t n) { return unit_key(name, "bytes").value(n); }

JsonWriter& JsonWriter::seconds(std::string_view name, double s) { return unit_key(name, "seconds").value(s); }

JsonWriter& JsonWriter::rate(std::string_view name, double gb_per_s) {
  return unit_key(name, "gb_per_s").value(gb_per_s);
}

JsonWriter& JsonWriter::count(std::string_view name, std::uint64_t n) { return unit_key(name, "count").value(n); }

std::string JsonWriter::take() { return std::exchange(out_, std::string()); }

}  // namespace eredu::cli
