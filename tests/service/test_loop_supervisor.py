"""serve's LoopSupervisor with real child processes: a loop that crashes is started again; one
ended by the stop signal itself (it came before the loop's handler, or during its exit) is a
stop, not a crash, and is not started again beside the next serve. How a loop ended is its word
on a pipe first, its exit code second (gunicorn's master may have read that)."""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from pathlib import Path

import pytest

from tests.lab.conftest import eventually
from webhook.cli.serve import REFUSED, REFUSED_WORD, STOPPED, WORD_FD_ENV, LoopSupervisor


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


@pytest.mark.parametrize(
    ("code", "said"),
    [
        (1, "the loop ended (exit 1): starting it again"),
        # gunicorn's master reaps every child that ends; when it takes the loop's status
        # first, Popen reads 0, as here: a 0 without the loop's word that it was told to stop.
        (0, "the loop ended (its exit status reaped by another): starting it again"),
    ],
)
def test_a_loop_that_ended_by_itself_is_started_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, code: int, said: str
) -> None:
    sup, starts = supervised(tmp_path, f"import sys\nsys.exit({code})")
    with caplog.at_level(logging.ERROR, logger="slurmedic.serve"):
        sup.start()
        try:
            eventually(lambda: count(starts) >= 2, timeout=30, what="the loop started again")
        finally:
            sup.stop()
            sup.thread.join(timeout=30)
    assert not sup.thread.is_alive()
    assert said in caplog.text


def test_a_loop_that_says_it_was_told_to_stop_is_not_started_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    body = f"import os\nos.write(int(os.environ[{WORD_FD_ENV!r}]), {STOPPED!r})"
    sup, starts = supervised(tmp_path, body)
    with caplog.at_level(logging.WARNING, logger="slurmedic.serve"):
        sup.start()
        sup.thread.join(timeout=30)
    assert not sup.thread.is_alive(), "the supervisor still waits to start the loop again"
    assert sup.proc is not None and sup.proc.returncode == 0
    assert count(starts) == 1
    assert "the loop stopped as it was told: not started again" in caplog.text


@pytest.mark.parametrize(
    "body",
    [
        # The word and an exit 0: gunicorn's master took the REFUSED exit status.
        f"import os\nos.write(int(os.environ[{WORD_FD_ENV!r}]), {REFUSED_WORD!r})",
        # No word, the exit code (a loop of a release before the word).
        f"import sys\nsys.exit({REFUSED})",
    ],
)
def test_a_loop_refused_its_ledger_stops_serve(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, body: str
) -> None:
    sup, starts = supervised(tmp_path, body)
    stopped = threading.Event()
    before = signal.signal(signal.SIGTERM, lambda *_: stopped.set())  # serve's own stop
    try:
        with caplog.at_level(logging.ERROR, logger="slurmedic.serve"):
            sup.start()
            sup.thread.join(timeout=30)
        eventually(stopped.is_set, timeout=30, what="serve told to stop")
    finally:
        signal.signal(signal.SIGTERM, before)
    assert not sup.thread.is_alive()
    assert count(starts) == 1
    assert "the loop was refused its ledger: serve stops" in caplog.text


def test_a_process_still_holding_the_pipe_does_not_hold_the_supervisor(tmp_path: Path) -> None:
    # A child of the loop (or a gunicorn worker forked meanwhile) keeps the pipe's write end:
    # the supervisor reads what is there, and does not wait for that process to end.
    pids = tmp_path / "holders"
    body = (
        "import os, subprocess, sys\n"
        f"fd = int(os.environ[{WORD_FD_ENV!r}])\n"
        "p = subprocess.Popen(['sleep', '300'], pass_fds=(fd,))\n"
        f"open({str(pids)!r}, 'a').write(f'{{p.pid}}\\n')\n"
        "sys.exit(1)"
    )
    sup, starts = supervised(tmp_path, body)
    sup.start()
    try:
        eventually(lambda: count(starts) >= 2, timeout=30, what="the loop started again")
    finally:
        sup.stop()
        sup.thread.join(timeout=30)
        for pid in pids.read_text().split():
            os.kill(int(pid), signal.SIGKILL)
    assert not sup.thread.is_alive()
