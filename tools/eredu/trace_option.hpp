#pragma once
// --trace FILE, shared by load, read, pipeline and swap: the run's timeline (reads,
// conversions, binds, stalls, verification, publication; one track per thread) as a
// Chrome/Perfetto trace-event file.

#include <CLI/CLI.hpp>
#include <functional>
#include <string>

namespace eredu::cli {

/// Adds --trace FILE to `command`, storing the path in `path`.
void add_trace_option(CLI::App& command, std::string& path);

/// Runs `run` with a trace::Recorder installed when `path` is set, and writes the timeline
/// to `path` afterwards, whether `run` returned or threw (a failed run's trace shows where
/// it failed). The file is created before `run` starts, so a path that cannot be written
/// fails at once (eredu::Error(io_error) naming it) rather than after a long load.
int run_traced(const std::string& path, const std::function<int()>& run);

}  // namespace eredu::cli
