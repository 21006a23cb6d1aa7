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
"""

import asyncio
import inspect


def wait(op):
    return op.wait()


async def wait_async(op):
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
        return await asyncio.shield(future)
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
