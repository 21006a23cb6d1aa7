"""prefetch: stream a checkpoint unit by unit (layers, experts) while the next units load.

    for unit in eredu.prefetch("model/", lookahead=2, budget="2G", framework="pt"):
        x = run_layer(unit, x)     # units i+1, i+2 load meanwhile
    async for unit in eredu.prefetch(...):   # the same, awaited

Each unit is a read-only mapping of checkpoint tensor names to tensors. It holds its bytes
against the budget until it is released: when the unit object is dropped (the loop moves on),
when `unit.release()` is called, or at the end of a `with unit:` block. Its tensors stay valid
after release — they own their storage — but storage kept alive that way is outside the budget.
At most lookahead + 1 units are held or loading at once, and their bytes stay within `budget`
(default: (lookahead + 1) × the largest unit); staging is bounded separately (`staging=`).

`units` says what a unit is:
  * "layers" (default): one unit per `<prefix>layers.<N>` (model.layers.0, model.layers.1, ...) or
    GGUF `blk.<N>` (blk.0, blk.1, ...), in layer order, as `eredu pipeline` streams; other tensors (embeddings, final norm, head) are not streamed and are listed
    in `.skipped`;
  * "experts": the same, with each expert of a mixture-of-experts layer a unit of its own after its
    layer's dense tensors (attention, norms, router): `model.layers.3.mlp.experts.7` holds what
    follows `experts.7.`; a GGUF layer's stacked `*_exps` tensors are one unit `blk.3.experts`.
    As `eredu pipeline --units experts` streams;
  * a callable name -> unit name (or None to skip), units in order of first appearance;
  * a dict {unit name: [tensor names]} or a list of lists (units "0", "1", ...), in that order.
"""

from . import _bridge, _native
from ._errors import python_error
from ._options import parse_count, parse_size
from ._safe_open import _Reader


def _group(reader, units):
    """[(unit name, [(tensor name, slot name)])] and the skipped tensor names."""
    order = reader.order
    skipped = []
    if units is None or isinstance(units, str):
        # A preset by name, parsed and grouped by eredu::app as `eredu pipeline --units` groups.
        grouped, skipped = reader.native.units("layers" if units is None else units)
    elif callable(units):
        groups = {}
        for name in order:
            key = units(name)
            if key is None:
                skipped.append(name)
            else:
                groups.setdefault(str(key), []).append((name, None))
        grouped = list(groups.items())
    elif isinstance(units, dict):
        grouped = [(str(k), [(n, None) for n in v]) for k, v in units.items()]
    elif isinstance(units, (list, tuple)):
        grouped = [(str(i), [(n, None) for n in v]) for i, v in enumerate(units)]
    else:
        raise python_error("invalid_argument",
                           f"units must be 'layers', 'experts', a callable, a dict or a list, not {units!r}")
    if not grouped:
        raise python_error("invalid_argument",
                           f"none of the checkpoint's {len(order)} tensors belongs to a unit: nothing to stream",
                           file=reader.native.path)
    for name, members in grouped:
        if not members:
            raise python_error("invalid_argument", f"unit '{name}' has no tensors", file=reader.native.path)
        for tensor, _ in members:
            reader.info(tensor)  # TensorNotFoundError for a name the checkpoint lacks
    return grouped, skipped


class Unit:
    """A delivered unit: a read-only mapping of tensor name -> tensor (see the module comment)."""

    def __init__(self, native, tensors):
        self._native = native
        self._tensors = tensors
        self.name = native.name
        self.index = native.index
        self.pass_ = native.pass_
        self.stall_s = native.stall_s

    def release(self):
        """Gives the unit's bytes back to the budget now (idempotent); its tensors stay valid."""
        self._native.release()

    @property
    def released(self):
        return not self._native.held

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()
        return False

    def __getitem__(self, name):
        return self._tensors[name]

    def __iter__(self):
        return iter(self._tensors)

    def __len__(self):
        return len(self._tensors)

    def __contains__(self, name):
        return name in self._tensors

    def keys(self):
        return self._tensors.keys()

    def items(self):
        return self._tensors.items()

    def values(self):
        return self._tensors.values()

    def __repr__(self):
        return f"<eredu.Unit {self.name!r} #{self.index} pass {self.pass_}: {len(self)} tensors>"


class prefetch:
    """A prefetch pipeline over a checkpoint (see the module comment); iterate it, or `async for`.

    prefetch(path, units="layers", *, lookahead=2, budget=None, passes=1, framework="np", dtype=None,
             bf16=None, unsupported="error", threads=None, concurrent_loads=1, staging=None, verify=False, ...)

    `path` is a str, bytes or os.PathLike. `verify` checks each unit against the checkpoint's recorded digests before it is delivered
    (False: never; None: what is recorded; True: every tensor must have a digest). `progress(done,
    total, phase)` is called as units are delivered: "read" with the stored bytes of the units
    delivered so far (at most every 50 ms, and at the last unit), total None when passes=0; then
    ("done", done, done) when the iteration ends. What it raises closes the pipeline and propagates.
    """

    def __init__(self, path, units="layers", *, lookahead=2, budget=None, passes=1, framework="np", dtype=None,
                 bf16=None, unsupported="error", threads=None, concurrent_loads=1, staging=None, progress=None,
                 **options):
        lookahead = parse_count("lookahead", lookahead)
        passes = 0 if passes is None else parse_count("passes", passes)
        concurrent_loads = parse_count("concurrent_loads", concurrent_loads)
        budget = parse_size("budget", budget) or 0
        staging = parse_size("staging", staging)
        threads = parse_count("threads", threads)
        self._reader = _Reader.open(path, framework, dtype, bf16, unsupported, copy_resident=False, copier="prefetch",
                                    budget=staging, threads=threads, **options)
        try:
            grouped, self.skipped = _group(self._reader, units)
            native_units, self._plans = [], []
            for name, members in grouped:
                specs, plans = [], []
                for tensor, slot in members:
                    spec, plan = self._reader.spec(tensor, slot=slot)
                    specs.append(spec)
                    plans.append((tensor, plan))
                native_units.append((name, specs))
                self._plans.append(plans)
            self.units = [name for name, _ in grouped]
            # Progress counts the stored bytes of the units delivered, over every pass (total None
            # when the passes are endless).
            self._unit_bytes = [sum(self._reader.info(t).nbytes for t, _ in members) for _, members in grouped]
            self._progress = _bridge.Reporter(_bridge.check_progress(progress))
            self._delivered = 0
            self._total = sum(self._unit_bytes) * passes if passes else None
            self._native = _native.Prefetch(self._reader.native, native_units, lookahead, budget, passes,
                                            concurrent_loads, threads or 0,
                                            self._reader.verify)
        finally:
            self._reader.native.close()  # the pipeline keeps the source open while it runs
        self._finished = False

    def _unit(self, native):
        if native is None:
            self._finished = True
            return None
        plans = self._plans[native.index]
        tensors = self._reader.convert(native.tensors(), [p for _, p in plans])
        unit = Unit(native, dict(zip((name for name, _ in plans), tensors)))
        self._delivered += self._unit_bytes[native.index]
        self._report(lambda: self._progress.read(self._delivered, self._total, last=self._delivered == self._total))
        return unit

    def _report(self, call):
        # The callback's exception stops the pipeline (every lease back) and propagates.
        try:
            call()
        except BaseException:
            self._finished = True
            _bridge.wait(self._native.close())
            raise

    # --- iteration ---
    def __iter__(self):
        return self

    def __next__(self):
        if self._finished:
            raise StopIteration
        unit = self._unit(_bridge.wait(self._native.next()))
        if unit is None:
            self.close()
            self._progress.done(self._delivered)
            raise StopIteration
        return unit

    def __aiter__(self):
        return self

    async def __anext__(self):
        if self._finished:
            raise StopAsyncIteration
        unit = self._unit(await _bridge.wait_async(self._native.next()))
        if unit is None:
            await self.aclose()
            self._progress.done(self._delivered)
            raise StopAsyncIteration
        return unit

    # --- closing ---
    def close(self):
        """Stops every load and waits until every lease is back; units held stay valid."""
        self._finished = True
        _bridge.wait(self._native.close())

    async def aclose(self):
        self._finished = True
        await _bridge.wait_async(self._native.close())

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.aclose()
        return False

    def stats(self):
        """The pipeline's counters: budget, resident_bytes, resident_high_water, delivered, stall_s,
        load_s, and its storage pool's live, retained, fresh and recycled counts."""
        return self._native.stats()

    def __len__(self):
        return len(self.units)

    def __repr__(self):
        return f"<eredu.prefetch {self._reader.native.path!r}: {len(self.units)} units>"
