# Live updates from Python under mpirun -np 3: rank 0 publishes versions of a small model from
# numpy arrays and torch tensors; ranks 1 and 2 each swap a ModelSlot to them. A bit flipped in
# flight on rank 1 is a ChecksumError there and leaves it serving the version before; a delta
# against the version rank 2 serves reads only the changed tensor's delta there, and whole on
# rank 1; a version withdrawn before it is opened, and one never published, are typed StoreErrors. The
# same again with the trainer and the servers started as two jobs that join through
# ompi-server, over the two-sided transport. Then an InPlaceModelSlot on each server patches its
# one copy to a delta, or refuses it whole when a bit flips in flight.
import os
import shutil
import subprocess
import sys
import textwrap
import time

import pytest

import eredu

MPIRUN = shutil.which("mpirun")
OMPI_SERVER = shutil.which("ompi-server")
MPIRUN_FLAGS = ["--allow-run-as-root", "--oversubscribe", "--mca", "mpi_yield_when_idle", "1"]


def run_np3(tmp_path, name, text, env=None):
    """Runs the script `text` under `mpirun -np 3` and checks that every rank said it was done."""
    script = tmp_path / name
    script.write_text(text)
    result = subprocess.run([MPIRUN, *MPIRUN_FLAGS, "-np", "3", sys.executable, str(script)],
                            capture_output=True, text=True, timeout=110, env=env)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    for line in ("rank 0: published", "rank 1: ok", "rank 2: ok"):
        assert line in out, out

# A small model of numpy arrays and a torch tensor per step, and the bytes of either kind: the
# start of the scripts that publish it.
MODEL = textwrap.dedent(r'''
    import os
    import sys
    import numpy as np
    import torch
    import eredu

    def weights(step):
        rng = np.random.default_rng(step)
        return {
            "embed.weight": rng.standard_normal((64, 32)).astype(np.float32),
            "mlp.up.weight": torch.from_numpy(rng.standard_normal((48, 32)).astype(np.float32)).to(torch.bfloat16),
            "mlp.down.weight": rng.integers(-100, 100, (32, 48)).astype(np.int32),
        }

    def as_bytes(t):
        if isinstance(t, torch.Tensor):
            return t.contiguous().view(torch.uint8).numpy().tobytes()
        return np.ascontiguousarray(t).tobytes()
''')

SCRIPT = MODEL + textwrap.dedent(r'''
    def step_4():
        w = weights(2)  # step-2 with one tensor changed
        w["mlp.down.weight"] = w["mlp.down.weight"] + 1
        return w

    # EREDU_TEST_JOIN="accept:NAME" (the trainer's job) or "connect:NAME" (the servers' job):
    # two jobs started separately (test_publish_and_swap_across_two_jobs).
    join = os.environ.get("EREDU_TEST_JOIN")
    # EREDU_TEST_LIVE_TRANSPORT: the transport asked for (the default, two_sided, when unset).
    chosen = os.environ.get("EREDU_TEST_LIVE_TRANSPORT")
    group = eredu.LiveGroup(timeout=30, **({join.split(":", 1)[0]: join.split(":", 1)[1]} if join else {}),
                            **({"transport": chosen} if chosen else {}))
    assert group.transport == (chosen or "two_sided"), group.transport
    assert group.size == 3, group.size
    rank = group.rank
    if rank == 0:
        with eredu.Publisher(group, linger=30, xor_deltas=True) as publisher:
            w1, w2, w3 = weights(1), weights(2), weights(3)
            v1 = publisher.publish("step-1", w1)
            assert publisher.offered("step-1")
            assert v1.wait_served(2, 60), "v1 not served"
            assert v1.served == 2, v1.served
            v2 = publisher.publish("step-2", w2, base="step-1")
            assert v2.wait_served(2, 60)
            assert v2.served == 1 and v2.failed == 1, (v2.served, v2.failed)
            w4 = step_4()
            v4 = publisher.publish("step-4", w4, base="step-2")  # a delta: step-2 is still offered
            assert v4.wait_served(2, 60) and v4.served == 2, (v4.served, v4.failed)
            v3 = publisher.publish("step-3", w3)
            v3.withdraw()
            assert not publisher.offered("step-3")
            # the subscribers now try step-3 (withdrawn) and step-99 (never published)
            group_done = publisher.publish("done", {"x": np.zeros(1, np.float32)})
            assert group_done.wait_served(2, 60)
        print("rank 0: published")
        sys.exit(0)

    with eredu.Subscriber(group, publisher=0, timeout=30) as subscriber:
        slot = eredu.ModelSlot(framework="np")
        report = slot.swap_sync(subscriber.open("step-1", wait=60))
        assert report["generation"] == 1
        assert report["verified_bytes"] == report["bytes"], report
        expected = weights(1)
        for name, t in expected.items():
            assert slot.current()[name].tobytes() == as_bytes(t), name
        assert slot.current().origin == "mpi://live/rank0/step-1"

        v2 = subscriber.open("step-2", wait=60)
        assert v2.version == "step-2" and v2.base == "step-1"
        if rank == 1:
            v2.corrupt_next_read(3)
            try:
                slot.swap_sync(v2)
                raise AssertionError("a corrupted version was published")
            except eredu.ChecksumError as e:
                assert "mpi://live/rank0/step-2" in str(e), e
            assert slot.generation == 1
            for name, t in expected.items():
                assert slot.current()[name].tobytes() == as_bytes(t), name
        else:
            assert slot.swap_sync(v2)["generation"] == 2
            for name, t in weights(2).items():
                assert slot.current()[name].tobytes() == as_bytes(t), name
        del v2

        # A delta against step-2: rank 2 serves it and reads only the changed tensor's delta
        # (every value + 1: its XOR with the base, compressed, at most half its bytes); rank 1
        # serves step-1, so it reads every byte. Both end up with step-4's bytes.
        v4 = subscriber.open("step-4", wait=60)
        assert v4.base == "step-2"
        assert slot.swap_sync(v4)["generation"] == (2 if rank == 1 else 3)
        w4 = step_4()
        for name, t in w4.items():
            assert slot.current()[name].tobytes() == as_bytes(t), name
        changed = len(as_bytes(w4["mlp.down.weight"]))
        total = sum(len(as_bytes(t)) for t in w4.values())
        if rank == 2:
            assert 0 < v4.transferred_bytes <= changed // 2, (rank, v4.transferred_bytes)
        else:
            assert v4.transferred_bytes == total, (rank, v4.transferred_bytes)
        del v4

        # The publisher offers "done" after withdrawing step-3: once "done" opens, step-3 is withdrawn.
        done = subscriber.open("done", wait=60)
        for tag, kind in (("step-3", "version_withdrawn"), ("step-99", "version_not_published")):
            try:
                subscriber.open(tag)
                raise AssertionError(f"{tag} opened")
            except eredu.StoreError as e:
                assert e.kind == kind, (tag, e.kind, str(e))
                assert tag in str(e), str(e)
        other = eredu.ModelSlot(framework="np")
        other.swap_sync(done)
        del done
    print(f"rank {rank}: ok")
''')


# Rank 0 publishes step-1, then step-2: step-1 with one row of one tensor changed, as a delta.
# Ranks 1 and 2 serve from an InPlaceModelSlot: swap to step-1, then patch to step-2. Rank 2
# writes only the changed blocks, into the same storage; on rank 1 a bit flips in flight, and
# every serving byte stays step-1's.
IN_PLACE_SCRIPT = textwrap.dedent(r'''
    import numpy as np
    import eredu

    def weights(step):
        rng = np.random.default_rng(step)
        return {"embed.weight": rng.standard_normal((64, 32)).astype(np.float32),
                "mlp.down.weight": rng.integers(-100, 100, (32, 48)).astype(np.int32)}

    w1 = weights(1)
    w2 = {k: v.copy() for k, v in w1.items()}
    w2["mlp.down.weight"][5] += 1  # one row: 192 bytes, in at most 4 of the 64-byte blocks

    group = eredu.LiveGroup(timeout=30)
    rank = group.rank
    if rank == 0:
        with eredu.Publisher(group, linger=30) as publisher:
            v1 = publisher.publish("step-1", w1)
            assert v1.wait_served(2, 60) and v1.served == 2, v1.served
            v2 = publisher.publish("step-2", w2, base="step-1")
            assert v2.wait_served(2, 60)
            assert v2.served == 1 and v2.failed == 1, (v2.served, v2.failed)
        print("rank 0: published")
        raise SystemExit(0)

    with eredu.Subscriber(group, publisher=0, timeout=30) as subscriber:
        slot = eredu.InPlaceModelSlot(framework="np")
        assert slot.swap_sync(subscriber.open("step-1", wait=60))["generation"] == 1
        with slot.read() as w:
            where = {k: w[k].__array_interface__["data"][0] for k in w}
            assert all(w[k].tobytes() == w1[k].tobytes() for k in w1)
        v2 = subscriber.open("step-2", wait=60)
        if rank == 1:
            v2.corrupt_next_read(3)
            try:
                slot.patch_sync(v2)
                raise AssertionError("a corrupted version was written")
            except eredu.ChecksumError as e:
                assert "step-2" in str(e), e
            expected, generation = w1, 1
        else:
            report = slot.patch_sync(v2)
            assert 0 < report["written_bytes"] <= 4 * 64, report
            # The first patch after a swap has no block digests kept: it hashes every byte.
            assert report["hashed_bytes"] == sum(v.nbytes for v in w1.values()), report
            assert v2.transferred_bytes < w1["mlp.down.weight"].nbytes, v2.transferred_bytes
            expected, generation = w2, 2
        with slot.read() as w:
            assert w.generation == generation and slot.generation == generation
            assert {k: w[k].__array_interface__["data"][0] for k in w} == where
            for k, v in expected.items():
                assert w[k].tobytes() == v.tobytes(), (rank, k)
        del v2  # a subscriber closes once no version it opened is referenced
    print(f"rank {rank}: ok")
''')


# Rank 0 publishes staged tensors (`staged=True`: the path a CUDA tensor always takes, here with
# host numpy arrays and torch tensors): every read copies its bytes out through the package's
# copier. Ranks 1 and 2 swap a ModelSlot to step-1 and to step-2 (a delta, which staged tensors
# go as whole tensors). Then the torch tensor's storage goes away after step-3 is published, as a
# lost device's memory would: both ranks' swaps fail with a BackendError naming it, and both
# keep serving step-2. A version whose tensor is gone before publish() is refused there.
STAGED_SCRIPT = MODEL + textwrap.dedent(r'''
    group = eredu.LiveGroup(timeout=30)
    rank = group.rank
    if rank == 0:
        with eredu.Publisher(group, linger=30) as publisher:
            v1 = publisher.publish("step-1", weights(1), staged=True)
            assert v1.wait_served(2, 60) and v1.served == 2, (v1.served, v1.failed)
            v2 = publisher.publish("step-2", weights(2), base="step-1", staged=True)
            assert v2.wait_served(2, 60) and v2.served == 2, (v2.served, v2.failed)
            w3 = weights(3)
            v3 = publisher.publish("step-3", w3, staged=True)
            w3["mlp.up.weight"].storage().resize_(0)  # its memory is gone
            assert v3.wait_served(2, 60) and v3.failed == 2, (v3.served, v3.failed)
            w4 = weights(4)
            w4["mlp.up.weight"].storage().resize_(0)
            try:
                publisher.publish("step-4", w4, staged=True)
                raise AssertionError("a tensor whose memory is gone was published")
            except eredu.BackendError as e:
                assert "mlp.up.weight" in str(e), e
            assert not publisher.offered("step-4")
            done = publisher.publish("done", {"x": np.zeros(1, np.float32)})
            assert done.wait_served(2, 60)
        print("rank 0: published")
        sys.exit(0)

    with eredu.Subscriber(group, publisher=0, timeout=30) as subscriber:
        slot = eredu.ModelSlot(framework="np")
        for generation, tag in ((1, "step-1"), (2, "step-2")):
            version = subscriber.open(tag, wait=60)
            assert slot.swap_sync(version)["generation"] == generation
            expected = weights(generation)
            for name, t in expected.items():
                assert slot.current()[name].tobytes() == as_bytes(t), (tag, name)
            # Staged tensors go whole, never as a delta against step-1.
            assert version.transferred_bytes == sum(len(as_bytes(t)) for t in expected.values()), tag
            del version
        v3 = subscriber.open("step-3", wait=60)
        try:
            slot.swap_sync(v3)
            raise AssertionError("a version whose memory is gone was published")
        except eredu.BackendError as e:
            assert e.kind == "backend_failure", e.kind
            assert "mlp.up.weight" in str(e) and "mpi://live/rank0/step-3" in str(e), e
        del v3
        assert slot.generation == 2
        for name, t in weights(2).items():
            assert slot.current()[name].tobytes() == as_bytes(t), name
        done = subscriber.open("done", wait=60)
        eredu.ModelSlot(framework="np").swap_sync(done)
        del done
    print(f"rank {rank}: ok")
''')


# An error raised inside `with eredu.Subscriber(...)` while a version it opened is still
# referenced (by the raising frame) is the error the caller gets, with a note that the subscriber
# was left open; it closes once the version is released.
WITH_SCRIPT = textwrap.dedent(r'''
    import sys
    import numpy as np
    import eredu

    group = eredu.LiveGroup(timeout=30)
    if group.rank == 0:
        with eredu.Publisher(group) as publisher:
            v = publisher.publish("x", {"w": np.arange(4096, dtype=np.float32)})
            assert v.wait_served(2, 60), (v.served, v.failed)
        print("rank 0: published")
        sys.exit(0)
    try:
        with eredu.Subscriber(group, publisher=0) as subscriber:
            held = subscriber.open("x", wait=60)
            raise KeyError("the caller's own error")
    except KeyError as e:
        assert "the caller's own error" in str(e), e
        notes = "".join(getattr(e, "__notes__", []))
        assert "Subscriber was left open" in notes and "referenced" in notes, notes
    slot = eredu.ModelSlot(framework="np")
    slot.swap_sync(held)
    del held
    subscriber.close()
    print(f"rank {group.rank}: ok")
''')


@pytest.mark.skipif(not eredu._live.available(), reason="this build has no live updates (no MPI)")
@pytest.mark.skipif(MPIRUN is None, reason="mpirun is not installed")
def test_an_error_inside_a_with_block_is_the_one_raised(tmp_path):
    run_np3(tmp_path, "with.py", WITH_SCRIPT)


@pytest.mark.skipif(not eredu._live.available(), reason="this build has no live updates (no MPI)")
@pytest.mark.skipif(MPIRUN is None, reason="mpirun is not installed")
@pytest.mark.parametrize("transport", [None, "one_sided"])
def test_publish_and_swap_under_mpirun(tmp_path, transport):
    env = dict(os.environ, **({"EREDU_TEST_LIVE_TRANSPORT": transport} if transport else {}))
    run_np3(tmp_path, "live.py", SCRIPT, env=env)


@pytest.mark.skipif(not eredu._live.available(), reason="this build has no live updates (no MPI)")
@pytest.mark.skipif(MPIRUN is None or OMPI_SERVER is None, reason="mpirun or ompi-server is not installed")
def test_publish_and_swap_across_two_jobs(tmp_path):
    script = tmp_path / "live.py"
    script.write_text(SCRIPT)
    uri = tmp_path / "uri"
    server = subprocess.Popen([OMPI_SERVER, "--no-daemonize", "-r", str(uri)])
    trainer = None
    try:
        deadline = time.monotonic() + 10
        while not (uri.exists() and uri.stat().st_size > 0):
            assert time.monotonic() < deadline, "ompi-server wrote no address within 10 s"
            time.sleep(0.05)
        command = [MPIRUN, *MPIRUN_FLAGS, "--ompi-server", f"file:{uri}", "-np"]
        service = f"eredu-python-{os.getpid()}"
        trainer = subprocess.Popen(command + ["1", sys.executable, str(script)],
                                   env=dict(os.environ, EREDU_TEST_JOIN=f"accept:{service}"),
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        servers = subprocess.run(command + ["2", sys.executable, str(script)],
                                 env=dict(os.environ, EREDU_TEST_JOIN=f"connect:{service}"),
                                 capture_output=True, text=True, timeout=110)
        trainer_out, _ = trainer.communicate(timeout=60)
    finally:
        if trainer is not None and trainer.poll() is None:
            trainer.kill()
        server.kill()
        server.wait()
    out = trainer_out + servers.stdout + servers.stderr
    assert trainer.returncode == 0 and servers.returncode == 0, out
    for line in ("rank 0: published", "rank 1: ok", "rank 2: ok"):
        assert line in out, out


@pytest.mark.skipif(not eredu._live.available(), reason="this build has no live updates (no MPI)")
@pytest.mark.skipif(MPIRUN is None, reason="mpirun is not installed")
def test_an_in_place_slot_patches_to_a_published_delta(tmp_path):
    run_np3(tmp_path, "in_place.py", IN_PLACE_SCRIPT)


@pytest.mark.skipif(not eredu._live.available(), reason="this build has no live updates (no MPI)")
@pytest.mark.skipif(MPIRUN is None, reason="mpirun is not installed")
def test_staged_tensors_are_copied_out_per_read(tmp_path):
    run_np3(tmp_path, "staged.py", STAGED_SCRIPT)


def test_a_staged_copier_packs_each_run_where_it_is_asked():
    # What the publisher asks of a staged tensor's copier: runs (source offset, destination
    # offset, length) of one reply, in any order, into one buffer.
    import numpy as np
    from eredu._live import _host_copier, _tensor_copier
    torch = pytest.importorskip("torch")
    data = np.arange(64, dtype=np.uint8)
    runs = [(40, 0, 8), (0, 8, 3), (63, 11, 1), (10, 12, 0)]
    expected = bytes(data[40:48]) + bytes(data[0:3]) + bytes(data[63:64])
    for copier in (_host_copier(data), _tensor_copier(torch.from_numpy(data.copy()).view(torch.int32))):
        out = bytearray(b"\xff" * 13)
        view = memoryview(out)
        copier(runs, view)
        view.release()  # nothing of the copier holds the reply's memory
        assert bytes(out[:12]) == expected and out[12] == 0xff
