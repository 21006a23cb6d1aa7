#include "cli.hpp"

#include <sys/resource.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <new>
#include <string_view>
#include <system_error>

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

std::exception_ptr typed_failure(std::exception_ptr error) {
  try {
    std::rethrow_exception(error);
  } catch (const Error&) {
    return error;
  } catch (const std::bad_alloc&) {
    return std::make_exception_ptr(Error(errc::out_of_memory, {}, "memory was refused"));
  } catch (const std::system_error& e) {
    // Asio reports errno values in its own category, which is the system's on POSIX.
    const int n = e.code().value();
    const std::string_view category = e.code().category().name();
    const bool posix = category == "generic" || category == "system" || category == "asio.system";
    if (posix && (n == EAGAIN || n == EMFILE || n == ENFILE || n == ENOMEM))
      return std::make_exception_ptr(Error(errc::resource_exhausted,
                                           {.os_error = std::error_code(n, std::generic_category())},
                                           fmt::format("the system refused what the command needed: {}", e.what())));
    return error;
  } catch (...) {
    return error;
  }
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
