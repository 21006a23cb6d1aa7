#pragma once
/// \file
/// Progress: the one-line progress display of the eredu command, on stderr.
///
/// It is drawn only when stderr is a terminal and the command is not --quiet, so a
/// redirected or piped run, and anything that parses stdout, never sees it. Every draw
/// rewrites the whole line ("\r", the text, then "clear to end of line"), and the text is
/// cut to the terminal's width, so a narrow terminal never wraps it into a scroll of lines.
/// The line names its phase (open, read, convert, verify, canary, publish, write, hash):
/// a step without a byte counter (a checksum pass the engine runs as one step) shows its
/// elapsed time instead of sitting at 100% with a falling rate. A phase with a byte total
/// shows the time left at the phase's rate so far (eta_text), once it is worth estimating.
///
/// Bytes are counted in one unit per command, the unit its summary uses (a load counts the
/// checkpoint's bytes as stored, whatever dtype it converts to).

#include <cstdint>
#include <string>
#include <string_view>

#include "eredu/app/checksum_sidecar.hpp"

namespace eredu::cli {

/// A one-line progress display (see file comment). Not thread-safe: update it from one
/// thread (the event loop).
class Progress {
 public:
  /// `enabled`: draw at all (the caller passes !quiet); stderr must also be a terminal.
  explicit Progress(bool enabled);
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;
  /// Clears the line if anything is drawn.
  ~Progress();

  /// Starts a phase named `name` ("read"), shown after `context` ("swap 1/2") if any.
  /// With `total_bytes` > 0 the line shows a bar, bytes and rate; with 0, the elapsed time.
  void phase(std::string_view name, std::uint64_t total_bytes = 0, std::string_view context = {});
  /// Records `done` bytes of the phase and redraws, at most ten times a second.
  void update(std::uint64_t done);
  /// Redraws now if due (an elapsed-time phase has no updates to trigger it).
  void tick() { update(done_); }
  /// Clears the line; the next phase() draws again.
  void finish();

  /// True when this display draws (enabled and stderr is a terminal).
  bool drawing() const noexcept { return enabled_; }
  /// The columns of stderr's terminal ($COLUMNS, else 80, when it cannot be asked).
  static int terminal_width();

 private:
  void draw(double now);

  bool enabled_;
  bool shown_ = false;
  std::string label_;
  std::uint64_t total_ = 0;
  std::uint64_t done_ = 0;
  double start_ = 0;
  double last_ = 0;
};

/// "ETA 12 s": the time left for `total` bytes at the rate `done` bytes took `elapsed` seconds;
/// empty while the estimate means nothing (under half a second in, nothing done yet, or done).
std::string eta_text(std::uint64_t done, std::uint64_t total, double elapsed);

/// app::hash_checkpoint's reports shown as `display`'s phase "hash", and a signal stopping the
/// hashing one buffer after it arrived ("hashing FILE; no sidecar was written").
app::HashProgress hash_progress(Progress& display);

}  // namespace eredu::cli
