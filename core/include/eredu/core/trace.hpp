#pragma once
/// \file
/// A timeline of a run: intervals (a read, a conversion, a bind, a wait) recorded by the
/// library while a trace::Recorder is installed, one track per thread, for a user to see
/// where a load's time goes (io::write_chrome_trace turns them into a Perfetto/Chrome file).
///
/// Off by default and nearly free when off: every recording site first reads one relaxed
/// atomic flag. Events are taken under a mutex, which is cheap at the granularity traced
/// (a read request, a tensor's conversion), never per byte.

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace eredu::trace {

/// One recorded interval, in nanoseconds of a monotonic clock.
struct Event {
  const char* name = "";      ///< what happened ("read", "convert", ...): a string literal
  const char* category = "";  ///< the layer that recorded it ("io", "cpu", "engine", ...): a literal
  std::string detail{};       ///< the tensor, file or figures concerned, if any
  std::uint64_t begin_ns = 0;
  std::uint64_t end_ns = 0;
  std::uint32_t thread = 0;  ///< the recording thread's track (thread_index())
};

/// A thread's track: its index and name ("thread 3" unless named).
struct Track {
  std::uint32_t thread = 0;  ///< as in Event::thread
  std::string name{};        ///< as given to name_this_thread, or "thread N"
};

/// Records every event of the library while it lives. At most one is installed at a
/// time (a second one throws eredu::Error(invalid_argument)); destroying it stops
/// recording. Thread-safe.
class Recorder {
 public:
  /// Installs this recorder as the process's.
  Recorder();
  ~Recorder();
  Recorder(const Recorder&) = delete;
  Recorder& operator=(const Recorder&) = delete;

  /// The events recorded so far, in the order they ended.
  std::vector<Event> events() const;
  /// The tracks of every thread that recorded an event or was named.
  std::vector<Track> tracks() const;
  /// The clock reading when the recorder was installed (the timeline's zero).
  std::uint64_t start_ns() const noexcept;

  /// Internal state, shared with the recording functions.
  struct State;

 private:
  std::shared_ptr<State> state_;
};

/// True while a Recorder is installed (one relaxed atomic load).
bool enabled() noexcept;
/// A monotonic clock reading, in nanoseconds.
std::uint64_t now_ns() noexcept;
/// This thread's track index: small, stable for the thread's life, distinct per thread.
std::uint32_t thread_index() noexcept;
/// Names this thread's track ("event loop", "pread worker 2"); kept across recorders.
void name_this_thread(std::string name);
/// Records [begin_ns, end_ns) on this thread's track, if a recorder is installed.
void record(const char* name, const char* category, std::uint64_t begin_ns, std::uint64_t end_ns,
            std::string detail = {});

/// As record(), for time points of std::chrono::steady_clock (the clock now_ns reads).
inline void record(const char* name, const char* category, std::chrono::steady_clock::time_point begin,
                   std::chrono::steady_clock::time_point end, std::string detail = {}) {
  if (!enabled()) return;
  auto ns = [](std::chrono::steady_clock::time_point t) {
    return static_cast<std::uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count());
  };
  record(name, category, ns(begin), ns(end), std::move(detail));
}

/// Records the interval of its own lifetime on the thread that destroys it (where it was
/// created, for a scope). Costs one flag read when tracing is off.
class Span {
 public:
  /// Starts timing if tracing is on; `name` and `category` must be string literals.
  Span(const char* name, const char* category, std::string detail = {})
      : name_(name), category_(category), begin_(enabled() ? now_ns() : 0) {
    if (begin_) detail_ = std::move(detail);
  }
  ~Span() {
    if (begin_) record(name_, category_, begin_, now_ns(), std::move(detail_));
  }
  Span(const Span&) = delete;
  Span& operator=(const Span&) = delete;

 private:
  const char* name_;
  const char* category_;
  std::uint64_t begin_;
  std::string detail_;
};

}  // namespace eredu::trace
