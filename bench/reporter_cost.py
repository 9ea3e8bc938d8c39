"""What the progress reporter costs a training step (issue 38), with four Pushgateways:

- healthy: the real Pushgateway (`prometheus-pushgateway` on PATH, the binary the lab runs), or
  without it a loopback http.server that answers 200 at once (the output says which);
- slow: a loopback server that answers every push after 2 s;
- hung: one that accepts the connection and never answers (until the run ends);
- dead: a closed port (the connection is refused).

For each, `step()` is called `--steps` times, `--gap` ms apart: the sleep stands in for the
step's GPU work, during which a real training loop releases the GIL too (CUDA calls do), so
the pusher runs when it would. Prints p50/p99/max of one `step()` call in microseconds, the
pushes sent, failed and dropped, and how long `close()` took (it waits at most 2 s for the last
push, then cuts it off). `off` is a reporter without a gateway: the bare cost of the call.

The `sync` rows are the reporter before issue 38, copied here: a PUT in the caller's thread on
every step with a 1 s timeout. They run for at most `--sync-seconds` per gateway (a hung
gateway makes every step 1 s).

    .venv/bin/python -m bench.reporter_cost [--steps 20000] [--gap 0.2] [--interval 0.5]
"""

from __future__ import annotations

import argparse
import http.client
import os
import shutil
import socket
import statistics
import subprocess
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from slurmedic_progress import CONTENT_TYPE, DEFAULT_TIMEOUT, ProgressReporter

from tests.local_server import put_server

SLOW_SECONDS = 2.0
OLD_TIMEOUT = 1.0  # the synchronous reporter's


@dataclass
class Row:
    gateway: str
    mode: str
    steps: int
    micros: list[float]
    sent: int | None = None
    failed: int | None = None
    dropped: int | None = None
    close_ms: float | None = None


@contextmanager
def stand_in(delay: float | None) -> Iterator[str]:
    """A loopback gateway answering 200 after `delay` seconds (None: never, until it stops)."""
    stop = threading.Event()

    def answer(_path: str, _type: str, _body: str) -> int | None:
        return None if stop.wait(delay) else 200  # stopping: dropped unanswered

    with put_server(answer, on_stop=stop.set) as url:
        yield url


@contextmanager
def pushgateway() -> Iterator[tuple[str, str]]:
    """The real Pushgateway on a free loopback port, or a stand-in; and what it is."""
    binary = shutil.which("prometheus-pushgateway")
    if binary is None:
        with stand_in(0.0) as url:
            yield url, "stand-in (no prometheus-pushgateway on PATH): http.server, 200 at once"
        return
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="slurmedic-pgw-") as tmp:
        proc = subprocess.Popen(
            [
                binary,
                f"--web.listen-address=127.0.0.1:{port}",
                f"--persistence.file={tmp}/metrics.data",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        url = f"http://127.0.0.1:{port}"
        try:
            wait_ready(url, proc)
            version = subprocess.run(
                [binary, "--version"], capture_output=True, text=True, check=False
            )
            first = (version.stdout or version.stderr).splitlines()[:1]
            yield url, f"{binary} ({first[0] if first else 'version unknown'})"
        finally:
            proc.terminate()
            proc.wait(10)


def wait_ready(url: str, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"prometheus-pushgateway exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(f"{url}/-/ready", timeout=1):
                return
        except OSError:
            time.sleep(0.05)
    raise SystemExit("prometheus-pushgateway did not get ready in 20 s")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


def timed_steps(
    step: Callable[[int], None], steps: int, gap: float, budget: float | None = None
) -> list[float]:
    """Microseconds of each call, `gap` seconds apart; at most `budget` seconds in all."""
    out = []
    end = None if budget is None else time.monotonic() + budget
    for i in range(1, steps + 1):
        t0 = time.perf_counter_ns()
        step(i)
        out.append((time.perf_counter_ns() - t0) / 1000)
        if end is not None and time.monotonic() > end:
            break
        time.sleep(gap)
    return out


def background(name: str, url: str | None, args: argparse.Namespace) -> Row:
    r = ProgressReporter(gateway=url, job_id="1", rank=0, node="gpu01", interval=args.interval)
    r.start()
    micros = timed_steps(lambda i: r.step(i, 0.1), args.steps, args.gap / 1000)
    t0 = time.perf_counter()
    r.close()
    close_ms = (time.perf_counter() - t0) * 1000
    return Row(
        name,
        "thread",
        len(micros),
        micros,
        r.pushes,
        r.failed_pushes,
        r.dropped_snapshots,
        close_ms,
    )


def synchronous(name: str, url: str, args: argparse.Namespace) -> Row:
    """The reporter before issue 38: every step PUTs in the caller's thread."""
    target = ProgressReporter(gateway=url, job_id="1", rank=0, node="gpu01").url()
    # Without a gateway, step() only updates the gauges: the PUT below is the old _push().
    r = ProgressReporter(gateway=None, job_id="1", rank=0, node="gpu01")
    sent = failed = 0

    def step(i: int) -> None:
        nonlocal sent, failed
        r.step(i, 0.1)
        body = r.exposition().encode()
        request = urllib.request.Request(
            target, data=body, method="PUT", headers={"Content-Type": CONTENT_TYPE}
        )
        try:
            with urllib.request.urlopen(request, timeout=OLD_TIMEOUT):
                sent += 1
        except (OSError, http.client.HTTPException):
            failed += 1

    micros = timed_steps(step, args.steps, args.gap / 1000, budget=args.sync_seconds)
    return Row(name, "sync", len(micros), micros, sent, failed, 0)


def quantile(sorted_values: list[float], q: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, int(len(sorted_values) * q))]


def print_table(rows: list[Row]) -> None:
    head = (
        f"{'gateway':<8} {'mode':<6} {'steps':>6} {'p50 µs':>9} {'p99 µs':>10} {'max µs':>11} "
        f"{'sent':>5} {'failed':>6} {'dropped':>7} {'close ms':>8}"
    )
    print(head)
    print("-" * len(head))
    for row in rows:
        v = sorted(row.micros)

        def opt(x: float | None, fmt: str) -> str:
            return "" if x is None else format(x, fmt)

        print(
            f"{row.gateway:<8} {row.mode:<6} {row.steps:>6} {statistics.median(v):>9.1f} "
            f"{quantile(v, 0.99):>10.1f} {v[-1]:>11.1f} {opt(row.sent, 'd'):>5} "
            f"{opt(row.failed, 'd'):>6} {opt(row.dropped, 'd'):>7} {opt(row.close_ms, '.0f'):>8}"
        )


def main() -> None:
    p = argparse.ArgumentParser(prog="bench.reporter_cost")
    p.add_argument("--steps", type=int, default=20_000)
    p.add_argument("--gap", type=float, default=0.2, help="ms between steps")
    p.add_argument("--interval", type=float, default=0.5, help="the reporter's push interval, s")
    p.add_argument("--sync-seconds", type=float, default=3.0)
    args = p.parse_args()
    rows = [background("off", None, args)]
    with pushgateway() as (url, what):
        print(f"healthy: {what}")
        rows += [background("healthy", url, args), synchronous("healthy", url, args)]
    with stand_in(SLOW_SECONDS) as url:
        rows += [background("slow", url, args), synchronous("slow", url, args)]
    with stand_in(None) as url:
        rows += [background("hung", url, args), synchronous("hung", url, args)]
    url = f"http://127.0.0.1:{free_port()}"
    rows += [background("dead", url, args), synchronous("dead", url, args)]
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(
        f"{args.steps:,} steps {args.gap:g} ms apart, push interval {args.interval:g} s, "
        f"push timeout {DEFAULT_TIMEOUT:g} s (sync: {OLD_TIMEOUT:g} s, at most "
        f"{args.sync_seconds:g} s a gateway); slow answers after {SLOW_SECONDS:g} s; "
        f"{os.cpu_count()} CPUs, load {load}"
    )
    print_table(rows)


if __name__ == "__main__":
    main()
