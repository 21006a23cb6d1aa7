#pragma once
/// \file
/// One-line diagnostics ("eredu: falling back to buffered reads: ...") to a replaceable sink.

#include <fmt/format.h>

#include <functional>
#include <string_view>

namespace eredu::log {

/// Severity of a log line.
enum class Level { debug, info, warn, error };

/// Receives every emitted line; the default writes "eredu: <line>" to stderr.
using Sink = std::function<void(Level, std::string_view)>;

/// Replaces the sink (tests capture lines with it); returns the previous one. Thread-safe.
Sink set_sink(Sink sink);
/// Lines below `level` are dropped (default: info).
void set_level(Level level) noexcept;
/// Emits one line to the sink.
void write(Level level, std::string_view line);

/// Formats and emits an informational line.
template <class... Args>
void info(fmt::format_string<Args...> f, Args&&... args) {
  write(Level::info, fmt::format(f, std::forward<Args>(args)...));
}
/// Formats and emits a warning line.
template <class... Args>
void warn(fmt::format_string<Args...> f, Args&&... args) {
  write(Level::warn, fmt::format(f, std::forward<Args>(args)...));
}
/// Formats and emits a debug line.
template <class... Args>
void debug(fmt::format_string<Args...> f, Args&&... args) {
  write(Level::debug, fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace eredu::log
