#include "progress.hpp"

#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include <fmt/format.h>

#include "cli.hpp"
#include "eredu/core/printable.hpp"
#include "interrupt.hpp"

namespace eredu::cli {
namespace {

// Columns a UTF-8 string takes (one per code point: the labels use no wide characters).
std::size_t columns(std::string_view s) {
  return static_cast<std::size_t>(std::count_if(s.begin(), s.end(), [](char c) { return (c & 0xC0) != 0x80; }));
}

// The longest prefix of `s` that takes at most `width` columns, cut at a code point.
std::string_view fit(std::string_view s, std::size_t width) {
  std::size_t cols = 0;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if ((s[i] & 0xC0) == 0x80) continue;
    if (cols++ == width) return s.substr(0, i);
  }
  return s;
}

}  // namespace

Progress::Progress(bool enabled) : enabled_(enabled && ::isatty(STDERR_FILENO) == 1) {}

Progress::~Progress() { finish(); }

int Progress::terminal_width() {
  winsize ws{};
  if (::ioctl(STDERR_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0) return ws.ws_col;
  if (const char* c = std::getenv("COLUMNS")) {
    const int n = std::atoi(c);
    if (n > 0) return n;
  }
  return 80;
}

void Progress::phase(std::string_view name, std::uint64_t total_bytes, std::string_view context) {
  // A context may name a file: escaped, so it cannot act on the terminal or break the line.
  label_ = context.empty() ? std::string(name) : fmt::format("{} · {}", printable(context), name);
  total_ = total_bytes;
  done_ = 0;
  start_ = now_seconds();
  last_ = 0;
  if (enabled_) draw(start_);
}

void Progress::update(std::uint64_t done) {
  done_ = done;
  if (!enabled_) return;
  const double t = now_seconds();
  if (t - last_ < 0.1) return;
  draw(t);
}

std::string eta_text(std::uint64_t done, std::uint64_t total, double elapsed) {
  // The first half second is mostly opening and the first reads' latency: a rate from it
  // promises minutes for what takes seconds.
  if (done == 0 || done >= total || !(elapsed >= 0.5)) return {};
  const double left = elapsed * static_cast<double>(total - done) / static_cast<double>(done);
  if (left < 10) return fmt::format("ETA {:.1f} s", left);
  if (left < 60) return fmt::format("ETA {:.0f} s", left);
  const auto whole = static_cast<std::uint64_t>(std::min(left, 359999.0) + 0.5);  // under 100 h
  if (whole < 3600) return fmt::format("ETA {}m{:02}s", whole / 60, whole % 60);
  return fmt::format("ETA {}h{:02}m", whole / 3600, whole / 60 % 60);
}

void Progress::draw(double now) {
  last_ = now;
  const double elapsed = now - start_;
  const std::size_t width = static_cast<std::size_t>(std::max(1, terminal_width() - 1));  // never the last column
  // The label and the percentage (or the elapsed time) always; then, while they fit, the
  // bytes, the rate, the time left and the bar, each whole or not at all.
  std::string line = label_;
  if (total_ > 0) {
    const double frac = std::min(1.0, static_cast<double>(done_) / static_cast<double>(total_));
    const int percent = static_cast<int>(frac * 100);
    std::string tail = fmt::format(" {:3d}%", percent);
    const std::string bytes = fmt::format(" {} / {}", format_bytes(done_), format_bytes(total_));
    const std::string rate =
        elapsed > 0.05 ? fmt::format("  {:.2f} GB/s", static_cast<double>(done_) / elapsed / 1e9) : std::string();
    if (columns(line) + columns(tail) + columns(bytes) <= width) tail += bytes;
    if (!rate.empty() && columns(line) + columns(tail) + columns(rate) <= width) tail += rate;
    const std::string eta = eta_text(done_, total_, elapsed);
    if (!eta.empty() && columns(line) + columns(tail) + 2 + columns(eta) <= width) tail += "  " + eta;
    const std::size_t used = columns(line) + columns(tail);
    if (used + 13 <= width) {  // a bar of at least 10 columns
      const std::size_t bar = std::min<std::size_t>(30, width - used - 3);
      const std::size_t filled = bar * static_cast<std::size_t>(percent) / 100;
      line += fmt::format(" [{}{}]", std::string(filled, '#'), std::string(bar - filled, ' '));
    }
    line += tail;
  } else {
    line += fmt::format(" {:.1f} s", elapsed);
  }
  const std::string_view shown = fit(line, width);
  std::fprintf(stderr, "\r%.*s\033[K", static_cast<int>(shown.size()), shown.data());
  std::fflush(stderr);
  shown_ = true;
}

void Progress::finish() {
  if (!shown_) return;
  std::fputs("\r\033[K", stderr);
  std::fflush(stderr);
  shown_ = false;
}

app::HashProgress hash_progress(Progress& display) {
  return {.start = [&display](std::uint64_t total) { display.phase("hash", total); },
          .update = [&display](std::uint64_t done) { display.update(done); },
          .check =
              [](const std::string& what) {
                if (pending_signal()) throw_if_interrupted(fmt::format("hashing {}; no sidecar was written", what));
              }};
}

}  // namespace eredu::cli
