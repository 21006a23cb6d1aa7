# Ctrl-C during a blocking load: KeyboardInterrupt is raised once the load has stopped, with
# every lease returned and nothing left writing; the checkpoint keeps serving. In-process
# (_thread.interrupt_main, the same path as SIGINT) and with a real SIGINT to a child process.
import _thread
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

import eredu
from eredu import _native
from conftest import bf16_bits, settled_live_bytes


@pytest.fixture
def model(tmp_path, writer):
    rng = np.random.default_rng(9)
    bits = {f"w{i}": bf16_bits(rng.standard_normal((128, 1024))) for i in range(4)}
    return writer(tmp_path / "m.safetensors", {k: ("BF16", list(v.shape), v.tobytes()) for k, v in bits.items()}), bits


def blocked_in_a_wait(thread_id):
    """Whether the thread's innermost Python frame is eredu's native wait (_bridge.wait)."""
    frame = sys._current_frames().get(thread_id)
    return frame is not None and frame.f_code.co_name == "wait" and frame.f_code.co_filename.endswith("_bridge.py")


def interrupt_when_held(gate, delay=0.3):
    # Interrupts only once a read is held at the gate and the main thread is blocked in the
    # wait: an interrupt that lands earlier (a prefetch starts reading when it is built) is
    # raised before the wait, cancels nothing, and the test would race with the scheduler.
    main = threading.main_thread().ident

    def run():
        assert gate.wait_arrivals(1, 20.0)
        deadline = time.monotonic() + 20.0
        while not blocked_in_a_wait(main) and time.monotonic() < deadline:
            time.sleep(0.005)
        _thread.interrupt_main()
        time.sleep(delay)  # the main thread sees the interrupt while reads are still held
        gate.open()
    t = threading.Thread(target=run)
    t.start()
    return t


def test_keyboard_interrupt_cancels_a_blocking_load(model):
    path, bits = model
    gate = _native._ReadGate()
    baseline = eredu.storage_stats()["live_bytes"]
    with eredu.safe_open(path, "np", bf16="float32", _faults=gate, budget="512K", chunk="128K") as f:
        helper = interrupt_when_held(gate)
        started = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            f.load()
        helper.join()
        assert time.monotonic() - started >= 0.25  # raised only after the load stopped (gate opened)
        assert f.staging()["in_use"] == 0  # every lease back before the exception
        assert settled_live_bytes(baseline) == baseline  # the partial load's storage freed just after
        assert f.get_tensor("w0").dtype == np.float32  # still serving


def test_keyboard_interrupt_in_load_file_and_prefetch(model):
    path, _ = model
    gate = _native._ReadGate()
    helper = interrupt_when_held(gate)
    with pytest.raises(KeyboardInterrupt):
        eredu.load_file(path, _faults=gate)
    helper.join()
    gate = _native._ReadGate()
    p = eredu.prefetch(path, units=lambda name: name, lookahead=1, _faults=gate)
    helper = interrupt_when_held(gate)
    with pytest.raises(KeyboardInterrupt):
        next(p)
    helper.join()
    with pytest.raises(eredu.CancelledError):
        next(p)  # an interrupted pipeline stays stopped
    p.close()


def test_sigint_to_a_process_blocked_in_a_load(model, tmp_path):
    path, _ = model
    script = textwrap.dedent(f"""
        import sys, threading, time
        import eredu
        from eredu import _native
        gate = _native._ReadGate()
        f = eredu.safe_open({str(path)!r}, "np", bf16="float32", _faults=gate, budget="512K", chunk="128K")
        def opener():
            gate.wait_arrivals(1, 20.0)
            print("held", flush=True)
            time.sleep(1.0)
            gate.open()
        threading.Thread(target=opener, daemon=True).start()
        try:
            f.load()
            print("not interrupted", flush=True)
        except KeyboardInterrupt:
            print("interrupted in_use=%d" % f.staging()["in_use"], flush=True)
        f.close()
    """)
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, env=os.environ)
    assert child.stdout.readline().strip() == "held"
    child.send_signal(signal.SIGINT)
    out, _ = child.communicate(timeout=60)
    assert child.returncode == 0 and out.strip() == "interrupted in_use=0"
