#pragma once
// Helpers every eredu subcommand shares: byte counts for people, process statistics, a
// monotonic clock, and the frame of a --json document (docs/cli.md).

#include <cstdint>
#include <exception>
#include <string>
#include <string_view>

#include "json_writer.hpp"

namespace eredu::cli {

/// "1.50 GiB" style (powers of 1024), "512 B" below a KiB.
std::string format_bytes(std::uint64_t bytes);

/// Peak resident set size of this process in bytes.
std::uint64_t peak_rss_bytes();

/// Seconds on a monotonic clock.
double now_seconds();

/// `bytes` over `seconds` in 10^9 bytes per second (0 when no time passed).
double gb_per_s(std::uint64_t bytes, double seconds);

/// Opens a --json document: `{"schema":<json_schema_version>,"command":"<command>"`; the
/// command writes its fields, then print_document() closes and prints it.
void begin_document(JsonWriter& json, std::string_view command);

/// Closes the document begun with begin_document and prints it, one line, on stdout.
void print_document(JsonWriter& json);

/// True once print_document has printed the command's document (main() then prints no
/// error document after it: one document per run).
bool document_printed() noexcept;

/// The --json document of a failure (docs/cli.md, "Errors"): `{"schema", "command",
/// "error": {"kind", "message", "file", "parameter", "tensor", "offset", "os_error"}}`, with
/// the parts an eredu::Error knows and null for the rest. `kind` is the errc name for an
/// eredu::Error, "usage" for a command-line error, "failure" for anything else.
std::string error_document(std::string_view command, std::exception_ptr error);

/// `error`, or for what the system refused, an eredu::Error of its kind: out_of_memory for
/// std::bad_alloc, resource_exhausted for a std::system_error of EAGAIN, EMFILE, ENFILE or
/// ENOMEM (a thread or a descriptor refused: std::thread, Asio's io_context, TBB's workers).
std::exception_ptr typed_failure(std::exception_ptr error);

/// The same for a command ended by SIGINT or SIGTERM: kind "interrupted".
std::string interrupted_document(std::string_view command, std::string_view message);

/// The same for a usage error, whose message CLI11 composed.
std::string usage_error_document(std::string_view command, std::string_view message);

}  // namespace eredu::cli
