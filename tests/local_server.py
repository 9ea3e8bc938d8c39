"""Run `slurmedic serve` as operators do (gunicorn and the loop), on a free loopback port:
for the HTTP tests and the ingest benchmark."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import requests
import yaml

from lab.processes import parent_of
from webhook.app.health import NO_VIEW
from webhook.cli.keeper import KEEPER_NAME, LOOP_NAME

TOKEN = "s3cret-token-for-tests"  # a local test server's token, not a secret


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Server:
    url: str
    db: str
    proc: subprocess.Popen[bytes]

    def post(
        self,
        body: Any,
        *,
        token: str | None = TOKEN,
        raw: bytes | None = None,
        headers: dict[str, str] | None = None,
    ) -> requests.Response:
        h = {"Content-Type": "application/json", **(headers or {})}
        if token is not None:
            h["Authorization"] = f"Bearer {token}"
        data = raw if raw is not None else json.dumps(body).encode()
        return requests.post(f"{self.url}/api/v1/alerts", data=data, headers=h, timeout=10)


def start_server(tmp: Path, **extra: Any) -> Server:
    """`extra`: config keys added to (or replacing) the test server's."""
    port = free_port()
    for name, secret in (("token", TOKEN), ("password", "hunter2")):
        (tmp / name).write_text(secret + "\n")
        (tmp / name).chmod(0o600)  # as a site keeps it (serve warns otherwise)
    db = f"sqlite:///{tmp / 'ledger.db'}"
    config = {
        "listen": f"127.0.0.1:{port}",
        "database_url": db,
        "max_body_bytes": 65536,
        "auth": {
            "bearer_token_file": str(tmp / "token"),
            "basic_user": "alertmanager",
            "basic_password_file": str(tmp / "password"),
        },
        "cluster": {"slurm_conf": str(tmp / "no-slurm.conf")},
        "metrics_cache_seconds": 0,
    } | extra
    (tmp / "config.yml").write_text(yaml.safe_dump(config))
    proc = subprocess.Popen(
        [sys.executable, "-m", "webhook.cli", "serve", f"--config={tmp / 'config.yml'}"],
        stdout=(tmp / "serve.out").open("wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if loop_runs(url):
                return Server(url, db, proc)
        except requests.RequestException:
            time.sleep(0.1)
    stop_server(proc)
    raise AssertionError((tmp / "serve.out").read_text())


def loop_runs(url: str) -> bool:
    """/readyz as far as a server without a Slurm gets: its loop runs, and says that it has no
    view of the cluster (these servers have no Slurm; the lab's do, and are ready)."""
    r = requests.get(f"{url}/readyz", timeout=1)
    return r.status_code == 200 or str(r.json().get("reason", "")).startswith(NO_VIEW)


def stop_server(proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM) -> None:
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        return
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(5)


def serve_children(pid: int, *, loop: bool) -> list[int]:
    """The processes `slurmedic serve` (`pid`) started: its loop (`loop`: forked by its keeper,
    or started as a process of its own once the keeper has gone), or its web workers."""
    keepers = [p for p in _children(pid) if comm(p) == KEEPER_NAME]
    if loop:
        return [p for p in _children(pid, *keepers) if _is_loop(p)]
    return [p for p in _children(pid) if p not in keepers and not _is_loop(p)]


def _children(*parents: int) -> list[int]:
    return [
        int(e.name)
        for e in Path("/proc").iterdir()
        if e.name.isdigit() and parent_of(int(e.name)) in parents
    ]


def comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _is_loop(pid: int) -> bool:
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return comm(pid) == LOOP_NAME or b"loop" in cmdline


@contextmanager
def put_server(
    answer: Callable[[str, str, str], int | None], on_stop: Callable[[], None] = lambda: None
) -> Iterator[str]:
    """An HTTP server on a free loopback port (its URL yielded) that answers each PUT with the
    status `answer(path, content type, body)` gives, or drops it unanswered for None: a
    stand-in Pushgateway. `on_stop` runs first when it stops (to release a held request)."""

    class Handler(BaseHTTPRequestHandler):
        def do_PUT(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0"))).decode()
            status = answer(self.path, self.headers.get("Content-Type", ""), body)
            if status is None:
                return
            self.send_response(status)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        on_stop()
        server.shutdown()
        server.server_close()
        thread.join()
