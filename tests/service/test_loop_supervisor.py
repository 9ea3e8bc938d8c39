"""serve's LoopSupervisor with real child processes: a loop that crashes is started again; one
ended by the stop signal itself (it came before the loop's handler, or during its exit) is a
stop, not a crash, and is not started again beside the next serve."""

from __future__ import annotations

import logging
import signal
import sys
from pathlib import Path

import pytest

from tests.lab.conftest import eventually
from webhook.cli.serve import STOPPED, STOPPED_FD_ENV, LoopSupervisor


def supervised(tmp_path: Path, body: str) -> tuple[LoopSupervisor, Path]:
    """A supervisor whose 'loop' appends a line to a file each start, then runs `body`."""
    starts = tmp_path / "starts"
    code = f"open({str(starts)!r}, 'a').write('x\\n')\n{body}"
    return LoopSupervisor([sys.executable, "-c", code], {}, grace=5), starts


def count(starts: Path) -> int:
    return len(starts.read_text().splitlines()) if starts.exists() else 0


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_loop_ended_by_a_stop_signal_is_not_started_again(
    tmp_path: Path, sig: signal.Signals, caplog: pytest.LogCaptureFixture
) -> None:
    n = int(sig)
    body = f"import os, signal\nsignal.signal({n}, signal.SIG_DFL)\nos.kill(os.getpid(), {n})"
    sup, starts = supervised(tmp_path, body)
    with caplog.at_level(logging.WARNING, logger="slurmedic.serve"):
        sup.start()
        sup.thread.join(timeout=30)
    assert not sup.thread.is_alive(), "the supervisor still waits to start the loop again"
    assert sup.proc is not None and sup.proc.returncode == -sig
    assert count(starts) == 1
    assert "the loop stopped as it was told: not started again" in caplog.text


def test_a_crashed_loop_is_started_again(tmp_path: Path) -> None:
    sup, starts = supervised(tmp_path, "import sys\nsys.exit(1)")
    sup.start()
    try:
        eventually(lambda: count(starts) >= 2, timeout=30, what="the loop started again")
    finally:
        sup.stop()
        sup.thread.join(timeout=30)
    assert not sup.thread.is_alive()


def test_a_loop_whose_exit_status_another_reaped_is_started_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # gunicorn's master reaps every child that ends; when it takes the loop's status first,
    # Popen reads 0, as here: a 0 without the loop's word that it was told to stop.
    sup, starts = supervised(tmp_path, "import sys\nsys.exit(0)")
    with caplog.at_level(logging.ERROR, logger="slurmedic.serve"):
        sup.start()
        try:
            eventually(lambda: count(starts) >= 2, timeout=30, what="the loop started again")
        finally:
            sup.stop()
            sup.thread.join(timeout=30)
    assert "the loop ended (its exit status reaped by another): starting it again" in caplog.text


def test_a_loop_that_says_it_was_told_to_stop_is_not_started_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    body = f"import os\nos.write(int(os.environ[{STOPPED_FD_ENV!r}]), {STOPPED!r})"
    sup, starts = supervised(tmp_path, body)
    with caplog.at_level(logging.WARNING, logger="slurmedic.serve"):
        sup.start()
        sup.thread.join(timeout=30)
    assert not sup.thread.is_alive(), "the supervisor still waits to start the loop again"
    assert sup.proc is not None and sup.proc.returncode == 0
    assert count(starts) == 1
    assert "the loop stopped as it was told: not started again" in caplog.text
