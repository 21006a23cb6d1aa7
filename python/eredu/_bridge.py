"""How Python waits for eredu's operations.

Blocking: `wait(op)` blocks the calling thread with the GIL released; Ctrl-C (or any exception
a signal handler raises) cancels the operation, waits until it has stopped — every lease back,
no read or conversion still writing — and is then raised.

asyncio: `await wait_async(op)`. eredu's event loop runs on its own thread; when the operation
finishes, eredu's delivery thread calls `loop.call_soon_threadsafe` and the result settles an
asyncio future, so the asyncio loop never blocks. Cancelling the awaiting task cancels the
operation through its Asio cancellation slot, keeps awaiting it until it has stopped (so leases
are back and no memory is still being written when the task ends), and raises
asyncio.CancelledError — unless the operation had succeeded before the cancellation reached
it (a swap already published), when the task returns its result instead.

Progress: `wait(op, progress)` and `wait_async(op, progress)` call `progress(done, total, phase)`
from the waiting thread (the blocked caller's, or the asyncio loop's: never one of eredu's), so a
callback may touch Python state without locks. Phases, in order: "read" — bytes of tensors that
have landed (read, converted to the asked dtype and, with verify=, checked), called at most every
PROGRESS_INTERVAL seconds while they move and once more with done == total when they are all in;
then "done" — (total, total) once, after the tensors are handed to numpy or torch, just before
the load returns (`done(op, progress)`). `done` never decreases; a failed or cancelled load makes
no "done" call. An exception the callback raises cancels the load (every lease back, nothing still
writing) and is raised from it.
"""

import asyncio
import inspect
import time

from . import _native

# Seconds between two "read" calls at most (the blocking wait's is operation.cpp's 50 ms).
PROGRESS_INTERVAL = 0.05


def check_progress(progress):
    """`progress`, checked: None or a callable."""
    if progress is not None and not callable(progress):
        raise TypeError(f"progress must be a callable (done, total, phase) or None, not {progress!r}")
    return progress


def wait(op, progress=None):
    return op.wait(progress) if progress is not None else op.wait()


def done(op, progress):
    """The "done" call: (total, total, "done"), when `progress` is set."""
    if progress is not None:
        total = op.bytes()[1]
        progress(total, total, "done")


class Reporter:
    """Progress of work Python counts itself (prefetch's units): "read" calls at most every
    PROGRESS_INTERVAL seconds, and the last one whatever the time."""

    def __init__(self, progress):
        self.progress = progress
        self.last = None

    def read(self, done_bytes, total, last=False):
        if self.progress is None:
            return
        now = time.monotonic()
        if last or self.last is None or now - self.last >= PROGRESS_INTERVAL:
            self.last = now
            self.progress(done_bytes, total, "read")

    def done(self, total):
        if self.progress is not None:
            self.progress(total, total, "done")


async def _report_until_done(op, future, progress):
    # Polls the operation's byte counters on the asyncio loop's own thread. A CancelledError
    # from asyncio.wait (the task cancelled) reaches wait_async's handler, which cancels op.
    reported = None
    while not future.done():
        await asyncio.wait({future}, timeout=PROGRESS_INTERVAL)
        if future.done():
            break
        done_bytes, total = op.bytes()
        if total and done_bytes != reported:
            reported = done_bytes
            try:
                progress(done_bytes, total, "read")
            except BaseException:  # noqa: B036 - the callback's exception cancels the load
                op.cancel()
                while not future.done():
                    try:
                        await asyncio.wait({future})
                    except asyncio.CancelledError:
                        continue
                if not future.cancelled():
                    future.exception()  # the cancelled load's own outcome is dropped
                raise
    if not future.cancelled() and future.exception() is None:
        total = op.bytes()[1]
        progress(total, total, "read")


async def wait_async(op, progress=None):
    loop = asyncio.get_running_loop()
    future = loop.create_future()

    def settle():
        if future.done():
            return
        try:
            future.set_result(op.result())
        except BaseException as e:  # noqa: B036 - every outcome goes to the awaiting task
            future.set_exception(e)

    op.bind(loop, settle, op.run_jobs)
    try:
        if progress is not None:
            await _report_until_done(op, future, progress)
        try:
            return await asyncio.shield(future)
        finally:
            _native._drain_log()  # what the operation logged, before its caller goes on
    except asyncio.CancelledError:
        if future.done():
            if not future.cancelled():
                future.exception()  # retrieved, whichever way it ended
            raise  # the operation itself ended cancelled, or had ended as the task was cancelled
        op.cancel()
        while not future.done():
            try:
                await asyncio.shield(future)
            except asyncio.CancelledError:
                if future.done():
                    break
            except BaseException:  # noqa: B036 - the cancelled operation's own outcome is dropped
                break
        if not future.cancelled() and future.exception() is None:
            # The operation had done its work before the cancellation reached it (a swap that
            # published, a load that completed): raising CancelledError would report undone
            # what was done, so the task ends with the result and is no longer cancelling.
            task = asyncio.current_task()
            if task is not None and hasattr(task, "uncancel"):
                task.uncancel()
            return future.result()
        raise


def run_canary(canary, candidate, finish, blocking, record):
    """Runs a hot-swap canary on `candidate` and reports the verdict through `finish(None)` (accept)
    or `finish(message)` (reject). `record(exc)` keeps the exception that rejected it, so the swap's
    CanaryError can chain it. A canary may return a falsy value other than None to reject, and may
    be a coroutine function."""

    def verdict(result):
        if result is None or result is True or (result is not False and bool(result)):
            finish(None)
        else:
            finish(f"the canary returned {result!r}")

    def failed(e):
        record(e)
        finish(f"{type(e).__name__}: {e}")

    try:
        result = canary(candidate)
        if inspect.isawaitable(result):
            if blocking:
                try:
                    asyncio.get_running_loop()
                except RuntimeError:
                    result = asyncio.run(_awaited(result))
                else:
                    raise RuntimeError("an async canary needs `await slot.swap(...)`, not swap_sync() "
                                       "called from inside a running event loop")
            else:
                task = asyncio.ensure_future(result)

                def done(t):
                    if t.cancelled():
                        failed(asyncio.CancelledError("the canary task was cancelled"))
                    elif t.exception() is not None:
                        failed(t.exception())
                    else:
                        verdict(t.result())

                task.add_done_callback(done)
                return
        verdict(result)
    except BaseException as e:  # noqa: B036 - whatever the canary raises rejects the version
        failed(e)


async def _awaited(awaitable):
    return await awaitable
