"""Read-ahead for safe_open.get_tensor: the Hugging Face idiom

    for name in f.keys():
        w = f.get_tensor(name)

reads one tensor at a time: each read starts only once the caller has the previous tensor, and
each is a unit of its own, read and copied by one worker while the others idle. When the
accesses follow an order — sorted names (keys()) or file order (offset_keys()) — ReadAhead reads
the next tensors in that order as batches, each one unit through the engine (what load() does
with a whole checkpoint: concurrent reads and copies), while the caller works on the tensors
already there. One load per tensor read ahead was tried first and was slower than no read-ahead
(docs/performance.md, 2026-12-04): eight single-tensor loads competed for the staging pool and
the workers, and each finished late.

It is on by default (DEFAULT_LIMIT); safe_open's `readahead=` (bytes; 0: off) sets the bound.

Rules:
  * it starts after two accesses in a row follow one of the two orders (a single get_tensor
    reads nothing more);
  * at most `limit` bytes of tensors (stored bytes) are read ahead and not yet asked for: a new
    batch of about limit / 2 bytes (at least one tensor) starts whenever less than limit / 2 is
    outstanding. The staging memory the reads go through is the checkpoint's pool, within its
    budget as every read is;
  * an access out of the order discards what was read ahead (those loads are cancelled and
    awaited, so their memory and leases are back before get_tensor goes on), and so does close();
  * a tensor read ahead is what get_tensor would have read: same dtype rules, same verification.
    A batch that fails (one tensor's checksum, say) is dropped and the tensor asked for is read
    alone, so a failure is raised by the get_tensor of the tensor that has it, as without
    read-ahead.

Thread-safe: the state is guarded by a lock that is never held while waiting for a load; a batch
has its own lock, held by the one thread that waits for it.
"""

import threading

from . import _bridge
from ._errors import Error

# Bytes read ahead by default (safe_open's readahead=). On the 16-core H200 machine the plain loop
# took 5.98x f.load()'s time over a 1 GiB file and read-ahead brought it to 1.02x; on the 2-core
# VM, where the loop already ran at f.load()'s speed, it neither gained nor lost beyond the noise
# (docs/performance.md, 2026-12-04).
DEFAULT_LIMIT = 256 << 20


class _Batch:
    """Tensors read ahead as one unit: their load, and their tensors once it has ended."""

    __slots__ = ("names", "op", "plans", "tensors", "lock")

    def __init__(self, names, op, plans):
        self.names = names
        self.op = op
        self.plans = plans
        self.tensors = None  # {name: tensor} once waited for
        self.lock = threading.Lock()


class ReadAhead:
    """The read-ahead state of one safe_open (see the module comment)."""

    def __init__(self, reader, limit):
        self._reader = reader
        self._limit = limit
        self._lock = threading.Lock()
        self._orders = None  # [(names, {name: position})] for sorted and file order, when first needed
        self._last = None  # the name asked for last
        self._following = None  # the order the accesses follow, once two in a row did
        self._next = 0  # position in the followed order of the first tensor not read ahead
        self._where = {}  # name -> its _Batch, for tensors read ahead and not yet asked for
        self._batches = []  # the batches started, oldest first
        self._pending_bytes = 0  # stored bytes of the names in _where

    def _positions(self):
        if self._orders is None:
            by_name, by_offset = sorted(self._reader.order), list(self._reader.order)
            # A file written in name order has one order, not two that always agree.
            self._orders = [(names, {n: i for i, n in enumerate(names)})
                            for names in ([by_name] if by_name == by_offset else [by_name, by_offset])]
        return self._orders

    def _follows(self, name):
        """The order in which `name` comes right after the last name asked for: the one followed
        so far if it does; else the only one it does (None when none does, or when both do and
        none is followed yet: two names are often neighbours in both orders, and choosing one
        there would have its read-ahead dropped at the next access if it was the wrong one)."""
        if self._last is None:
            return None
        matches = []
        for order in self._positions():
            names, position = order
            i = position.get(self._last)
            if i is not None and i + 1 < len(names) and names[i + 1] == name:
                matches.append(order)
        if self._following is not None and any(o[0] is self._following[0] for o in matches):
            return self._following
        return matches[0] if len(matches) == 1 else None

    def get(self, name, progress=None):
        """Tensor `name`, from what was read ahead or read now; reads ahead of it when the
        accesses follow an order."""
        info = self._reader.info(name)  # TensorNotFoundError before anything else changes
        with self._lock:
            batch = self._where.pop(name, None)
            if batch is not None:
                self._pending_bytes -= info.nbytes
            follows = self._follows(name)
            discarded = []
            if follows is None or (self._following is not None and follows[0] is not self._following[0]):
                discarded = self._drop_locked(keep=batch)
                if follows is not None:
                    self._next = follows[1][name] + 1
            self._following = follows
            self._last = name
            alone = None
            if batch is None:
                alone = self._reader.start_read([name])
                if follows is not None:
                    self._next = max(self._next, follows[1][name] + 1)
            if follows is not None:
                self._fill_locked()
        _cancel_and_wait(discarded)
        if batch is not None:
            tensor = self._from_batch(batch, name)
            if tensor is not None:
                if progress is not None:
                    progress(info.nbytes, info.nbytes, "read")
                    progress(info.nbytes, info.nbytes, "done")
                return tensor
            alone = self._reader.start_read([name])  # the batch failed: this tensor alone
        op, plans = alone
        tensor = self._reader.convert(_bridge.wait(op, progress), plans)[0]
        _bridge.done(op, progress)
        return tensor

    def _from_batch(self, batch, name):
        """`name`'s tensor from `batch`, waiting for the batch's load; None when it failed."""
        with batch.lock:
            if batch.tensors is None:
                try:
                    tensors = self._reader.convert(_bridge.wait(batch.op), batch.plans)
                except Exception:  # noqa: BLE001 - its tensors are read alone instead, failing there
                    batch.tensors = {}
                    with self._lock:
                        self._forget_locked(batch)
                else:
                    batch.tensors = dict(zip(batch.names, tensors))
            tensor = batch.tensors.pop(name, None)
            with self._lock:
                if not any(self._where.get(n) is batch for n in batch.names):
                    # Nothing of it is expected any more (all asked for, or dropped by a jump
                    # out of the order): what it still holds goes now.
                    batch.tensors.clear()
                    if batch in self._batches:
                        self._batches.remove(batch)
        return tensor

    def _forget_locked(self, batch):
        for n in batch.names:
            if self._where.get(n) is batch:
                del self._where[n]
                self._pending_bytes -= self._reader.infos[n].nbytes
        if batch in self._batches:
            self._batches.remove(batch)

    def _fill_locked(self):
        names, _ = self._following
        half = max(1, self._limit // 2)
        while self._limit and self._pending_bytes < half and self._next < len(names):
            batch_names, nbytes = [], 0
            while self._next < len(names):
                n = names[self._next]
                size = self._reader.infos[n].nbytes
                if batch_names and nbytes + size > half:
                    break
                if not batch_names and self._pending_bytes + size > self._limit:
                    return  # a tensor larger than what is left of the limit is not read ahead
                self._next += 1
                if n in self._where or not self._readable(n):
                    continue
                batch_names.append(n)
                nbytes += size
            if not batch_names:
                return
            op, plans = self._reader.start_read(batch_names)
            batch = _Batch(batch_names, op, plans)
            self._batches.append(batch)
            for n in batch_names:
                self._where[n] = batch
            self._pending_bytes += nbytes

    def _readable(self, name):
        """Whether `name` can be read as get_tensor would read it: a tensor the framework cannot
        hold (an F8 tensor for numpy, say) is left out of read-ahead, so that its own
        get_tensor raises its error and no other tensor's does."""
        try:
            self._reader.spec(name)
        except Error:
            return False
        return True

    def _drop_locked(self, keep=None):
        """Forgets every batch but `keep`; returns their loads, cancelled."""
        dropped = [b for b in self._batches if b is not keep]
        for b in dropped:
            self._forget_locked(b)
        if keep is not None:
            self._forget_locked(keep)  # its other tensors are no longer ahead of anything
            self._batches.append(keep)
        ops = [b.op for b in dropped if b.tensors is None]
        for op in ops:
            op.cancel()
        return ops

    def discard(self, wait=True):
        """Cancels what was read ahead; with `wait`, returns once those loads have ended (every
        lease back, their memory freed)."""
        with self._lock:
            dropped = self._drop_locked()
            self._batches.clear()
            self._following = None
            self._last = None
        if wait:
            _cancel_and_wait(dropped)

    def pending(self):
        """(tensors, stored bytes) read ahead and not yet asked for."""
        with self._lock:
            return len(self._where), self._pending_bytes


def _cancel_and_wait(ops):
    for op in ops:
        op.cancel()
    for op in ops:
        try:
            op.wait()
        except Exception:  # noqa: BLE001 - cancelled (or failed) read-ahead: nobody asked for it
            pass
