#include "eredu/core/log.hpp"

#include <atomic>
#include <cstdio>
#include <mutex>
#include <string>

#include "eredu/core/printable.hpp"

namespace eredu::log {
namespace {
std::mutex sink_mutex;
std::atomic<Level> min_level{Level::info};

Sink& current() {
  static Sink sink = [](Level, std::string_view line) {
    std::fprintf(stderr, "eredu: %.*s\n", static_cast<int>(line.size()), line.data());
  };
  return sink;
}
}  // namespace

Sink set_sink(Sink sink) {
  std::lock_guard lock(sink_mutex);
  std::swap(current(), sink);
  return sink;
}

void set_level(Level level) noexcept { min_level.store(level, std::memory_order_relaxed); }

void write(Level level, std::string_view line) {
  if (level < min_level.load(std::memory_order_relaxed)) return;
  // File and tensor names in a line must not act on the terminal (see printable.hpp).
  const std::string safe = printable(line);
  std::lock_guard lock(sink_mutex);
  if (current()) current()(level, safe);
}

}  // namespace eredu::log
