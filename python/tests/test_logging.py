# eredu's log lines reach Python's logging as records of the "eredu" logger, at their level,
# whichever eredu thread wrote them (the event loop here), before the call that caused them
# returns; blocking and asyncio alike.
import asyncio
import logging
import sys
import threading

import numpy as np
import pytest

import eredu
from conftest import sha256


@pytest.fixture
def half_verifiable(tmp_path, writer):
    # One tensor has a recorded digest, the other none: verify=None logs at INFO that only one
    # of the two is verified (engine/detail/load_verification.hpp), from the loop thread.
    a = np.arange(64, dtype=np.float32)
    b = np.ones(32, dtype=np.float32)
    return writer(tmp_path / "m.safetensors", {"a": a, "b": b}, metadata={"sha256:a": sha256(a.tobytes())})


def eredu_records(caplog):
    return [r for r in caplog.records if r.name == "eredu"]


def test_a_line_from_the_loop_thread_is_an_info_record_of_the_eredu_logger(half_verifiable, caplog):
    caplog.set_level(logging.DEBUG, logger="eredu")
    out = eredu.load_file(half_verifiable, verify=None)
    assert set(out) == {"a", "b"}
    records = [r for r in eredu_records(caplog) if "verifying 1 of the 2 tensors" in r.getMessage()]
    assert len(records) == 1, [r.getMessage() for r in eredu_records(caplog)]
    assert records[0].levelno == logging.INFO
    assert records[0].thread == threading.get_ident()  # emitted from Python, not eredu's thread


def test_a_warning_keeps_its_level(half_verifiable, caplog):
    # A slice of the tensor with a digest cannot be verified (a partial selection): verification
    # is on and verifies nothing, a WARNING line.
    caplog.set_level(logging.DEBUG, logger="eredu")
    with eredu.safe_open(half_verifiable, "np", verify=None) as f:
        assert f.get_slice("a")[0:4].tolist() == [0, 1, 2, 3]
    msgs = [(r.levelno, r.getMessage()) for r in eredu_records(caplog)]
    assert any(level == logging.WARNING and "none of the 1 tensors" in m for level, m in msgs), msgs


def test_debug_lines_follow_the_logger_level(half_verifiable, caplog):
    caplog.set_level(logging.DEBUG, logger="eredu")
    eredu.load_file(half_verifiable, reader="pread")
    assert any(r.levelno == logging.DEBUG and "pread reader, as asked" in r.getMessage()
               for r in eredu_records(caplog)), [r.getMessage() for r in eredu_records(caplog)]
    caplog.clear()
    caplog.set_level(logging.INFO, logger="eredu")
    eredu.load_file(half_verifiable, reader="pread")
    assert not [r for r in eredu_records(caplog) if r.levelno < logging.INFO]


def test_asyncio_loads_log_too(half_verifiable, caplog):
    caplog.set_level(logging.INFO, logger="eredu")

    async def main():
        return await eredu.aload(half_verifiable, verify=None)

    assert set(asyncio.run(main())) == {"a", "b"}
    assert any("verifying 1 of the 2 tensors" in r.getMessage() for r in eredu_records(caplog))


def test_a_failing_handler_does_not_break_the_load(half_verifiable, caplog, monkeypatch):
    class Broken(logging.Handler):
        def emit(self, record):
            raise RuntimeError("handler broke")

    unraisable = []
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)
    logger = logging.getLogger("eredu")
    handler = Broken()
    logger.addHandler(handler)
    try:
        caplog.set_level(logging.INFO, logger="eredu")
        assert set(eredu.load_file(half_verifiable, verify=None)) == {"a", "b"}
    finally:
        logger.removeHandler(handler)
    # Reported as unraisable, never raised into the load.
    assert any(isinstance(u.exc_value, RuntimeError) for u in unraisable), unraisable


def test_a_process_that_logs_exits_cleanly(half_verifiable):
    # The atexit hook puts eredu's own sink back before the interpreter goes: lines logged up to
    # the end reach logging, and the exit neither hangs nor crashes.
    import subprocess
    import textwrap
    script = textwrap.dedent(f"""
        import logging, eredu
        logging.basicConfig(level=logging.DEBUG, format="%(levelname)s %(name)s %(message)s")
        f = eredu.safe_open({str(half_verifiable)!r}, "np", verify=None, reader="pread")
        f.load()
        # f stays open: its close at exit logs nothing, and nothing must break.
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "INFO eredu verifying 1 of the 2 tensors" in out.stderr
    assert "DEBUG eredu" in out.stderr
