"""`serve` keeps its loop running, and /readyz says when none runs: after a `kill -9` of the
loop the webhook still stores what arrives, /readyz answers 503 until the loop `serve` starts
again is back. A second serve on the same SQLite ledger is refused, by name."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import requests

from lab.processes import is_alive as alive
from tests.lab.conftest import eventually
from tests.local_server import loop_runs, serve_children, start_server, stop_server
from webhook.cli.serve import REFUSED, REFUSED_WORD, WORD_FD_ENV


def test_a_killed_loop_is_started_again_and_readyz_says_so_meanwhile(tmp_path: Path) -> None:
    # A short lease: a loop silent for 3 s (its beat) counts as not running.
    server = start_server(tmp_path, replicas={"name": "replica-a", "lease_seconds": 3})
    try:
        ready = requests.get(f"{server.url}/readyz", timeout=5).json()
        # It leads, its loop runs, and it has no Slurm to read (webhook_http tests that).
        assert ready["leader"] == "replica-a" and ready["leading"] is True, ready
        assert loop_runs(server.url)
        (loop,) = serve_children(server.proc.pid, loop=True)
        os.kill(loop, signal.SIGKILL)
        eventually(lambda: not alive(loop), timeout=60, what="the loop to die")
        # The supervisor waits 1 s before it starts the loop again, and the new loop's first
        # beat comes after its imports: /readyz goes 503 unless the restart is quick enough,
        # so what is asserted is the restart, and that /readyz is 200 again after it.
        again = eventually(
            lambda: [p for p in serve_children(server.proc.pid, loop=True) if p != loop],
            timeout=60,
            what="a new loop",
        )
        assert again
        eventually(
            lambda: loop_runs(server.url),
            timeout=60,
            what="/readyz: the loop runs again",
        )
        log = (tmp_path / "serve.out").read_text()
        assert "the loop ended (exit -9): starting it again in 1 s" in log, log
    finally:
        stop_server(server.proc)


def test_readyz_is_503_while_no_loop_runs(tmp_path: Path) -> None:
    server = start_server(tmp_path, replicas={"name": "replica-a", "lease_seconds": 2})
    try:
        (loop,) = serve_children(server.proc.pid, loop=True)
        # Stopped, not killed: the supervisor sees no exit, and nothing beats.
        os.kill(loop, signal.SIGSTOP)
        try:

            def not_ready() -> dict[str, object] | None:
                r = requests.get(f"{server.url}/readyz", timeout=5)
                body: dict[str, object] = r.json()
                return body if str(body.get("reason")).startswith("no loop runs") else None

            body = eventually(not_ready, timeout=60, what="/readyz 503")
            assert isinstance(body, dict)
            assert body["status"] == "not ready"
            assert body["reason"].startswith("no loop runs for this replica (last beat: ")
            # The webhook itself still stores what arrives.
            assert requests.get(f"{server.url}/healthz", timeout=5).status_code == 200
        finally:
            os.kill(loop, signal.SIGCONT)
        eventually(
            lambda: loop_runs(server.url),
            timeout=60,
            what="/readyz: the loop runs once it beats again",
        )
    finally:
        stop_server(server.proc)


def test_a_second_serve_on_one_sqlite_ledger_is_refused(tmp_path: Path) -> None:
    server = start_server(tmp_path)
    try:
        out = subprocess.run(
            [sys.executable, "-m", "webhook.cli", "serve", f"--config={tmp_path / 'config.yml'}"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 1
        assert "another slurmedic loop runs on" in out.stderr
        assert "PostgreSQL" in out.stderr
        assert len(out.stderr.strip().splitlines()) == 1, out.stderr
    finally:
        stop_server(server.proc)


def test_a_loop_told_to_stop_by_itself_is_not_started_again(tmp_path: Path) -> None:
    # The loop's SIGTERM handler stops it cleanly (exit 0), and it says so to serve first: an
    # exit 0 alone could be gunicorn's master reaping the loop's status before serve's wait.
    server = start_server(tmp_path)
    try:
        (loop,) = serve_children(server.proc.pid, loop=True)
        os.kill(loop, signal.SIGTERM)
        out = tmp_path / "serve.out"
        eventually(
            lambda: "the loop stopped as it was told: not started again" in out.read_text(),
            timeout=60,
            what="serve to see the loop's stop",
        )
        # The supervisor has returned: nothing starts another loop after this.
        assert serve_children(server.proc.pid, loop=True) == []
        assert "starting it again" not in out.read_text()
    finally:
        stop_server(server.proc)


def test_a_loop_refused_its_ledger_says_so_to_its_serve(tmp_path: Path) -> None:
    # serve reads the word before the exit code, which gunicorn's master may have taken.
    server = start_server(tmp_path)  # its loop holds the SQLite ledger
    said, write = os.pipe()
    try:
        out = subprocess.run(
            [sys.executable, "-m", "webhook.cli", "loop", f"--config={tmp_path / 'config.yml'}"],
            env={**os.environ, WORD_FD_ENV: str(write)},
            pass_fds=(write,),
            capture_output=True,
            text=True,
            timeout=60,
        )
        os.close(write)
        assert out.returncode == REFUSED, out.stderr
        assert os.read(said, 64) == REFUSED_WORD
    finally:
        os.close(said)
        stop_server(server.proc)
