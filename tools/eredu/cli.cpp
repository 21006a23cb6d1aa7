#include "cli.hpp"

#include <sys/resource.h>

#include <chrono>
#include <cstdio>

#include <fmt/format.h>

#include "eredu/core/error.hpp"
#include "output_streams.hpp"

namespace eredu::cli {
namespace {

void error_object(JsonWriter& json, std::string_view kind, std::string_view message, const ErrorContext* context) {
  json.key("error").begin_object();
  json.field("kind", kind).field("message", message);
  auto text = [&](std::string_view name, const std::string* s) {
    if (s && !s->empty())
      json.field(name, *s);
    else
      json.null_field(name);
  };
  text("file", context ? &context->file : nullptr);
  text("parameter", context ? &context->parameter : nullptr);
  text("tensor", context ? &context->tensor : nullptr);
  if (context && context->offset)
    json.field("offset", *context->offset);
  else
    json.null_field("offset");
  if (context && context->os_error)
    json.field("os_error", context->os_error.message());
  else
    json.null_field("os_error");
  json.end_object();
}

}  // namespace

std::string format_bytes(std::uint64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  return u == 0 ? fmt::format("{} B", bytes) : fmt::format("{:.2f} {}", v, units[u]);
}

std::uint64_t peak_rss_bytes() {
  rusage ru{};
  ::getrusage(RUSAGE_SELF, &ru);
  return static_cast<std::uint64_t>(ru.ru_maxrss) * 1024;
}

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double gb_per_s(std::uint64_t bytes, double seconds) {
  return seconds > 0 ? static_cast<double>(bytes) / seconds / 1e9 : 0.0;
}

void begin_document(JsonWriter& json, std::string_view command) {
  json.begin_object().field("schema", json_schema_version).field("command", command);
}

namespace {
bool printed = false;
}  // namespace

bool document_printed() noexcept { return printed; }

void print_document(JsonWriter& json) {
  json.end_object();
  printed = true;
  // Unchecked here: finish_output() reports a document that could not be written.
  write_unchecked(stdout, json.take() + "\n");
}

std::string error_document(std::string_view command, std::exception_ptr error) {
  JsonWriter json;
  begin_document(json, command);
  try {
    std::rethrow_exception(error);
  } catch (const Error& e) {
    error_object(json, errc_name(e.kind()), e.what(), &e.context());
  } catch (const std::exception& e) {
    error_object(json, "failure", e.what(), nullptr);
  } catch (...) {
    error_object(json, "failure", "an unknown exception", nullptr);
  }
  json.end_object();
  return json.take();
}

std::string interrupted_document(std::string_view command, std::string_view message) {
  JsonWriter json;
  begin_document(json, command);
  error_object(json, "interrupted", message, nullptr);
  json.end_object();
  return json.take();
}

std::string usage_error_document(std::string_view command, std::string_view message) {
  JsonWriter json;
  begin_document(json, command);
  error_object(json, "usage", message, nullptr);
  json.end_object();
  return json.take();
}

}  // namespace eredu::cli
