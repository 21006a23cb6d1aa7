#pragma once
/// \file
/// eredu's log lines (eredu/core/log.hpp) as records of Python's `logging.getLogger("eredu")`,
/// at the matching level (debug, info, warning, error).
///
/// Most lines come from eredu's own threads (the event loop, the readers, the TBB workers),
/// which must never take the GIL: a Python thread may hold it while it waits for the loop
/// (a close, a run_on_loop), and a sink that waited for the GIL there would deadlock the two.
/// So the sink only queues the line (a mutex held for a push, bounded: past max_queued the
/// oldest lines are dropped and counted) and asks CPython to run the drain on the main thread
/// with Py_AddPendingCall, which needs no GIL. The queue is also drained by every blocking
/// wait (Operation::wait) as it wakes, so lines logged during a long load reach `logging`
/// while it runs, and before the call returns. A record's thread is therefore the Python
/// thread that drained it, not eredu's thread that wrote the line.

#include <pybind11/pybind11.h>

namespace eredu::python {

/// Routes eredu's log lines to logging.getLogger("eredu"); lets every level through to it
/// (the logger's own level filters). Idempotent. GIL held.
void install_log_forwarding();
/// Puts the previous sink back and drops what is queued (atexit: after it no eredu thread
/// touches the interpreter). GIL held.
void uninstall_log_forwarding() noexcept;
/// Emits the queued lines as log records now. GIL held, any Python thread; what a handler
/// raises is reported as unraisable, never propagated into the caller.
void drain_log_records() noexcept;

/// Registers eredu._native._install_logging, _uninstall_logging and _drain_log.
void bind_log_forwarding(pybind11::module_& m);

}  // namespace eredu::python
