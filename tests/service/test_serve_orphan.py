"""A loop never outlives the `slurmedic serve` that started it: after a `kill -9` of serve,
nothing goes on deciding beside the serve started next."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from lab.processes import is_alive as alive
from tests.local_server import serve_children, start_server, stop_server


def test_the_loop_stops_when_its_serve_is_killed(tmp_path: Path) -> None:
    server = start_server(tmp_path)
    try:
        loops = serve_children(server.proc.pid, loop=True)
        assert len(loops) == 1, loops
        os.kill(server.proc.pid, signal.SIGKILL)
        server.proc.wait(10)
        deadline = time.monotonic() + 30
        while alive(loops[0]) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not alive(loops[0]), "the loop outlived its serve"
        assert "is gone: the loop stops" in (tmp_path / "serve.out").read_text()
    finally:
        stop_server(server.proc, signal.SIGKILL)
