#include "log_forwarding.hpp"

#include <cstddef>
#include <deque>
#include <mutex>
#include <string>
#include <utility>

#include "eredu/core/log.hpp"

namespace eredu::python {

namespace py = pybind11;

namespace {

// Lines kept for Python at most: a stalled main thread (a long C call elsewhere) must not let
// the queue grow without bound.
constexpr std::size_t max_queued = 10000;

struct Record {
  log::Level level;
  std::string line;
};

struct Forwarding {
  std::mutex mutex;
  std::deque<Record> queue;
  std::size_t dropped = 0;
  bool installed = false;
  bool drain_scheduled = false;  // a pending call is queued and has not started
  log::Sink previous;
};

Forwarding& forwarding() {
  // Destroyed at exit, after the atexit hook (uninstall_log_forwarding) has put the previous
  // sink back: no line reaches queue_line by then.
  static Forwarding f;
  return f;
}

int python_level(log::Level level) {
  switch (level) {
    case log::Level::debug:
      return 10;
    case log::Level::info:
      return 20;
    case log::Level::warn:
      return 30;
    case log::Level::error:
      return 40;
  }
  return 40;
}

int pending_drain(void*) {
  drain_log_records();
  return 0;
}

void queue_line(log::Level level, std::string_view line) {
  Forwarding& f = forwarding();
  bool schedule = false;
  {
    std::lock_guard lock(f.mutex);
    if (!f.installed) return;
    if (f.queue.size() >= max_queued) {
      f.queue.pop_front();
      ++f.dropped;
    }
    f.queue.push_back({level, std::string(line)});
    schedule = !f.drain_scheduled;
    f.drain_scheduled = true;
  }
  // No GIL needed (CPython documents it for any thread). A full pending-call queue refuses it:
  // the lines then wait for the next drain (the next wait, or the next line that schedules).
  if (schedule && Py_AddPendingCall(&pending_drain, nullptr) != 0) {
    std::lock_guard lock(f.mutex);
    f.drain_scheduled = false;
  }
}

}  // namespace

void install_log_forwarding() {
  Forwarding& f = forwarding();
  {
    std::lock_guard lock(f.mutex);
    if (f.installed) return;
    f.installed = true;
  }
  f.previous = log::set_sink(&queue_line);
  log::set_level(log::Level::debug);
}

void uninstall_log_forwarding() noexcept {
  Forwarding& f = forwarding();
  {
    std::lock_guard lock(f.mutex);
    if (!f.installed) return;
    f.installed = false;
    f.queue.clear();
  }
  log::set_level(log::Level::info);
  try {
    log::set_sink(std::move(f.previous));
  } catch (...) {
    // Swapping std::functions does not allocate; nothing to do if it ever did.
  }
}

void drain_log_records() noexcept {
  Forwarding& f = forwarding();
  std::deque<Record> lines;
  std::size_t dropped = 0;
  {
    std::lock_guard lock(f.mutex);
    f.drain_scheduled = false;
    if (f.queue.empty() && f.dropped == 0) return;
    lines.swap(f.queue);
    std::swap(dropped, f.dropped);
  }
  try {
    py::object logger = py::module_::import("logging").attr("getLogger")("eredu");
    if (dropped != 0)
      logger.attr("warning")("%d eredu log lines were dropped (the queue for Python was full)", dropped);
    for (const Record& r : lines) logger.attr("log")(python_level(r.level), "%s", r.line);
  } catch (py::error_already_set& e) {
    e.discard_as_unraisable("eredu's log forwarding");
  } catch (...) {
    // Out of memory building a record: the lines are lost, the caller is not disturbed.
  }
}

void bind_log_forwarding(py::module_& m) {
  m.def("_install_logging", &install_log_forwarding,
        "Routes eredu's log lines to logging.getLogger('eredu') (queued, emitted from Python threads).");
  m.def("_uninstall_logging", &uninstall_log_forwarding, "Puts the previous log sink back (atexit).");
  m.def("_drain_log", &drain_log_records, "Emits the queued eredu log lines now.");
}

}  // namespace eredu::python
