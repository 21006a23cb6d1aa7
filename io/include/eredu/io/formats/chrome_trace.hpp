#pragma once
/// \file
/// A trace::Recorder's timeline as Chrome trace-event JSON, the format Perfetto
/// (ui.perfetto.dev) and chrome://tracing open: one complete event ("ph":"X") per
/// interval, one named track per thread, times in microseconds from the recorder's start.

#include <filesystem>
#include <string>

#include "eredu/core/trace.hpp"

namespace eredu::io {

/// The trace-event JSON document of everything `recorder` holds now.
std::string chrome_trace_json(const trace::Recorder& recorder);

/// Writes chrome_trace_json(recorder) to `path`, replacing it; eredu::Error(io_error)
/// naming the path when it cannot be written.
void write_chrome_trace(const trace::Recorder& recorder, const std::filesystem::path& path);

}  // namespace eredu::io
