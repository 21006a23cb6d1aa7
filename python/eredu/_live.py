"""Live weight updates: a trainer publishes versions of its weights from its own memory, and
servers' ModelSlots swap to them, all or nothing (docs/live_updates.md). Every process of one
MPI job takes part (`mpirun -np N python3 ...`):

    group = eredu.LiveGroup()
    if group.rank == 0:                                    # the trainer
        with eredu.Publisher(group) as publisher:
            v = publisher.publish("step-1", model.state_dict())   # no copy: the memory is offered
            v.wait_served(group.size - 1)
            v.withdraw()                                   # the memory is the trainer's again
    else:                                                  # a server
        with eredu.Subscriber(group, publisher=0) as subscriber:
            slot = eredu.ModelSlot(framework="pt")
            slot.swap_sync(subscriber.open("step-1", wait=60))  # verified against the publisher's digests

Tensors are numpy arrays or torch tensors. Host memory is offered as it is; a CUDA tensor is
staged: each subscriber's read copies exactly the bytes it asks for out of the device, one reply
at a time, so the host never holds a copy of the model (`staged=True` stages host tensors too). MPI
is initialized by the first LiveGroup and finalized at exit, after every publisher and
subscriber still open is closed (their windows are freed with the other ranks'): close them in
the same order on every rank, or let exit do it.
"""

import atexit
import sys
import time
import weakref

from . import _native
from ._errors import Error, InvalidArgumentError, StoreError

_endpoints = []  # weak references to open publishers and subscribers, in opening order


def available():
    """True when this build has live updates (it found MPI)."""
    return bool(getattr(_native, "live_updates", False))


def _require():
    if not available():
        raise InvalidArgumentError("this eredu build has no live updates: it was built without MPI",
                                   kind="invalid_argument")


class LiveGroup:
    """Every process of this MPI job. `timeout` (seconds) bounds every wait on another rank.

    `accept="NAME"` (the trainer's job) or `connect="NAME"` (the servers' job) joins it with
    another job started separately, through MPI's name server (both launched with
    `mpirun --ompi-server file:FILE` of one `ompi-server`): the group is then both jobs, the
    accepting job's ranks first, and joining gives up after `timeout`. It must be the
    process's first LiveGroup. `transport`: how subscribers read, "two_sided" (requests
    answered with the bytes, each within `timeout` even if the trainer dies mid-read; also what
    reaches another job over TCP) or "one_sided" (MPI_Rget from the publisher's memory: faster
    in one job, but a trainer that dies during a read can hang the servers' MPI)."""

    def __init__(self, timeout=60.0, *, transport="two_sided", accept=None, connect=None):
        _require()
        self._native = _native.LiveGroup(float(timeout), str(transport), accept, connect)

    rank = property(lambda self: self._native.rank, doc="This process's rank.")
    size = property(lambda self: self._native.size, doc="Processes in the group.")
    transport = property(lambda self: self._native.transport,
                         doc='How its subscribers read: "one_sided" or "two_sided".')


def _host_copier(raw):
    """copy(runs, out) of host bytes `raw` (a uint8 view): what a staged host tensor offers."""
    import numpy as np
    flat = np.frombuffer(raw, dtype=np.uint8)

    def copy(runs, out):
        into = np.frombuffer(out, dtype=np.uint8)
        for source, dest, length in runs:
            into[dest:dest + length] = flat[source:source + length]
    return copy


def _tensor_copier(tensor):
    """copy(runs, out) of a contiguous torch tensor, on a device or not: each run copied
    straight into the reply (from a device, torch's blocking copy on the calling thread's
    current stream: the device's default one)."""
    import torch
    flat = tensor.reshape(-1).view(torch.uint8)

    def copy(runs, out):
        into = torch.frombuffer(out, dtype=torch.uint8)
        for source, dest, length in runs:
            into[dest:dest + length].copy_(flat[source:source + length])
        del into  # `out` is the reply's memory, released when this returns
    return copy


def _entries(tensors, staged):
    """(name, dtype, shape, bytes view or copier) of each tensor: no copy where the memory is
    contiguous little-endian host memory; a copier for a device tensor, or for every tensor
    when `staged`."""
    if not isinstance(tensors, dict):
        raise InvalidArgumentError("tensors must be a dict of name to numpy array or torch tensor",
                                   kind="invalid_argument")
    import numpy as np
    from ._writing import numpy_entries, torch_entries
    arrays = {k: v for k, v in tensors.items() if isinstance(v, np.ndarray)}
    others = {k: v for k, v in tensors.items() if not isinstance(v, np.ndarray)}
    entries = dict((e[0], e) for e in numpy_entries(arrays)) if arrays else {}
    if others:
        entries.update((e[0], e) for e in torch_entries(others, keep="all" if staged else "device"))
    out = []
    for name, dtype, shape, raw in (entries[k] for k in tensors):
        if isinstance(raw, bytes):  # no elements: nothing to stage
            raw = memoryview(raw)
        elif not isinstance(raw, np.ndarray):  # a torch tensor: on a device, or staged
            raw = _tensor_copier(raw)
        elif staged:
            raw = _host_copier(raw)
        out.append((name, dtype, list(shape), raw))
    return out


class Publication:
    """One version a Publisher offers, until withdraw() (or the Publication is collected)."""

    def __init__(self, native):
        self._native = native

    version = property(lambda self: self._native.version, doc="Its version tag.")
    served = property(lambda self: self._native.served, doc="Subscribers that have their bytes.")
    failed = property(lambda self: self._native.failed, doc="Subscribers that gave up on it.")

    def wait_served(self, subscribers, timeout=60.0):
        """Waits until `subscribers` subscribers are done with it (or gave up); True if they were."""
        return self._native.wait_served(int(subscribers), float(timeout))

    def withdraw(self):
        """Stops offering it; returns once no subscriber reads its memory any more."""
        self._native.withdraw()


class _Endpoint:
    """A publisher or subscriber: closed by close(), a with block, or the exit hook."""

    def close(self):
        """Frees the window, collectively with the other ranks of the group."""
        self._native.close()

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc is None:
            self.close()
            return
        try:
            self.close()
        except Error as e:
            # The error in flight is the caller's, and its own frames may hold the versions that
            # keep this open: raise it, not this, and leave the closing to close() or exit.
            exc.add_note(f"eredu: the {type(self).__name__} was left open: {e}")


class Publisher(_Endpoint):
    """The trainer's side: offers versions of its weights to the group's subscribers.
    Collective: every other rank of the group makes a Subscriber at the same time.
    close() also withdraws every publication. `xor_deltas`: a tensor most of whose values
    changed may go as its XOR with the base, compressed (worth it on links slower than about
    0.3 GB/s per rank; docs/live_updates.md)."""

    def __init__(self, group, *, linger=60.0, xor_deltas=False):
        _require()
        self._native = _native.Publisher(group._native, float(linger), bool(xor_deltas))
        _endpoints.append(weakref.ref(self))

    def publish(self, version, tensors, *, base=None, staged=False):
        """Offers `tensors` ({name: numpy array or torch tensor}) as `version`; returns its
        Publication. The memory must not be written until the Publication is withdrawn.

        A tensor on a device (CUDA) is staged: never copied whole to the host, each read copies
        the bytes it asks for out of the device into its reply. Finish the step's writes first
        (`torch.cuda.synchronize()`). `staged=True` stages host tensors the same way, instead of
        offering their memory to MPI. Staged tensors always go whole, never as a delta."""
        return Publication(self._native.publish(version, base, _entries(tensors, bool(staged))))

    def offered(self, version):
        """True while `version` is offered."""
        return self._native.offered(version)


class Subscriber(_Endpoint):
    """A server's side: opens versions the publisher at rank `publisher` offers, for
    ModelSlot.swap / swap_sync. Collective with the Publisher (see Publisher)."""

    def __init__(self, group, publisher=0, *, timeout=60.0):
        _require()
        self._native = _native.Subscriber(group._native, int(publisher), float(timeout))
        _endpoints.append(weakref.ref(self))

    def open(self, version=None, *, wait=0.0):
        """The published `version` (None: the newest), to pass to ModelSlot.swap. `wait`: how
        many seconds to keep asking while the publisher offers no such version yet."""
        deadline = time.monotonic() + float(wait)
        delay = 0.001
        while True:
            try:
                return self._native.open(version)
            except StoreError as e:
                if e.kind != "version_not_published" or time.monotonic() + delay > deadline:
                    raise
            time.sleep(delay)
            delay = min(delay * 2, 0.05)


@atexit.register
def _finalize():
    if not available():
        return
    closed = True
    for ref in reversed(_endpoints):
        endpoint = ref()
        if endpoint is None:
            continue
        try:
            endpoint.close()
        except Error as e:  # a version still referenced: its window is freed when it goes
            print(f"eredu: at exit: {e}", file=sys.stderr)
            closed = False
    if closed:
        _native.live_finalize()  # else MPI ends after the interpreter, once those windows are freed
