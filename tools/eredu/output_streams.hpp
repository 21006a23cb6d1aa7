#pragma once
// The command's standard streams, checked. A report or JSON document that cannot be written
// (stdout closed, a full disk, a reader that went away) is a failure the command states, not
// an exit 0 with the result lost; a broken stderr never aborts it (fmt::print throws there,
// and a throw from an error report would end in std::terminate).

#include <cstdio>
#include <string_view>

namespace eredu::cli {

/// Reopens any of descriptors 0, 1 and 2 that is closed on /dev/null, read-only, so that a
/// file the command opens cannot take the number of a standard stream (its messages would go
/// into the checkpoint) and a write to a closed stdout or stderr still fails (EBADF). Call
/// first in main().
void guard_standard_descriptors() noexcept;

/// Writes `text` to `stream` as it is, ignoring failure (the stream's error flag keeps it for
/// finish_output). For reports whose own failure has nowhere else to go.
void write_unchecked(std::FILE* stream, std::string_view text) noexcept;

/// Flushes and closes stdout and checks both standard streams. When a write to either
/// failed, a command that would have exited 0 exits 1 instead, and the failure is stated on
/// the stream that still works (stderr for a lost stdout): "`who`: cannot write to standard
/// output: No space left on device; the result was lost". Returns the exit status.
int finish_output(int status, std::string_view who) noexcept;

/// True when a write to stdout failed so far (its error flag).
bool stdout_failed() noexcept;

/// Records why a write to stdout failed (the errno of a std::system_error fmt::print threw),
/// for finish_output's statement.
void remember_stdout_error(int error_number) noexcept;

}  // namespace eredu::cli
