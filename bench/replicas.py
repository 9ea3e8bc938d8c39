"""Two `slurmedic serve` replicas on one PostgreSQL: ingest, and takeover after a `kill -9`.

Ingest: `--clients` clients send 10-alert payloads (bench.webhook_ingest's) for `--seconds`,
each payload to the next replica in turn, as an HA pair of Alertmanagers spreads them; prints
payloads/s, p50/p99 time to the 2xx, and alerts acknowledged against alert events in the
ledger (nothing acknowledged lost). Takeover: `--takeovers` times, the leader's whole process
group is killed and the time until the other replica's /readyz says it leads is measured; the
killed one is started again and follows. No Slurm: the loops' cluster view fails, which the
lease does not depend on.

    .venv/bin/python -m bench.replicas [--seconds 20] [--clients 4] [--takeovers 5] [--lease 5]
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import tempfile
import threading
import time
from pathlib import Path

import requests
from sqlalchemy import func, select

from bench.webhook_ingest import payload
from lab import postgres, processes
from lab.config import LabConfig
from tests.local_server import TOKEN, Server, start_server, stop_server
from webhook.ledger.schema import AlertRow
from webhook.ledger.store import Ledger


def readyz(server: Server) -> dict[str, object]:
    try:
        body: dict[str, object] = requests.get(f"{server.url}/readyz", timeout=2).json()
        return body
    except requests.RequestException:
        return {}


def ingest(servers: list[Server], seconds: float, clients: int) -> tuple[float, list[float], int]:
    latencies: list[float] = []
    acked = 0
    lock = threading.Lock()
    deadline = time.monotonic() + seconds
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}

    def client(n: int) -> None:
        nonlocal acked
        sessions = [requests.Session() for _ in servers]
        seq = 0
        while time.monotonic() < deadline:
            k = seq % len(servers)
            t0 = time.perf_counter()
            r = sessions[k].post(
                f"{servers[k].url}/api/v1/alerts", data=payload(n, seq), headers=headers, timeout=30
            )
            took = time.perf_counter() - t0
            with lock:
                latencies.append(took)
                if r.status_code == 200:
                    acked += 10
            seq += 1

    threads = [threading.Thread(target=client, args=(n,)) for n in range(clients)]
    started = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.monotonic() - started, latencies, acked


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--seconds", type=float, default=20)
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--takeovers", type=int, default=5)
    p.add_argument("--lease", type=float, default=5.0)
    p.add_argument("--port-base", type=int, default=24000)
    args = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="slurmedic-replicas-"))
    cfg = LabConfig(run_dir=tmp / "lab", port_base=args.port_base)
    url = postgres.start(cfg)
    db = postgres.new_database(cfg, "bench_replicas")
    servers: dict[str, Server] = {}

    def start(name: str) -> Server:
        d = tmp / f"{name}-{time.monotonic_ns()}"
        d.mkdir()
        servers[name] = start_server(
            d, database_url=db, replicas={"name": name, "lease_seconds": args.lease}
        )
        return servers[name]

    try:
        for name in ("a", "b"):
            start(name)
        took, latencies, acked = ingest(list(servers.values()), args.seconds, args.clients)
        ledger = Ledger(db)
        with ledger.session() as s:
            stored = int(s.scalar(select(func.count(AlertRow.id))) or 0)
        latencies.sort()
        print(
            f"ingest, 2 replicas on PostgreSQL ({url.rsplit('@', 1)[1]}), {args.clients} clients: "
            f"{len(latencies) / took:.0f} payloads/s, p50 {statistics.median(latencies) * 1000:.1f}"
            f" ms, p99 {latencies[int(len(latencies) * 0.99)] * 1000:.1f} ms; alerts acknowledged "
            f"{acked}, in the ledger {stored}, lost {max(acked - stored, 0)}"
        )
        times = []
        for _ in range(args.takeovers):
            leader = ""
            deadline = time.monotonic() + 60
            while not leader and time.monotonic() < deadline:
                seen = {str(readyz(s).get("leader")) for s in servers.values()}
                leader = seen.pop() if len(seen) == 1 and "None" not in seen else ""
                time.sleep(0.1)
            assert leader in servers, f"no leader both agree on: {seen}"
            other = next(n for n in servers if n != leader)
            os.killpg(servers[leader].proc.pid, signal.SIGKILL)
            killed = time.monotonic()
            servers[leader].proc.wait(10)
            while readyz(servers[other]).get("leading") is not True:
                assert time.monotonic() - killed < 10 * args.lease + 30, "no takeover"
                time.sleep(0.05)
            times.append(time.monotonic() - killed)
            start(leader)
        print(
            f"takeover after kill -9 of the leader ({args.takeovers} times, lease {args.lease} s):"
            f" median {statistics.median(times):.2f} s, max {max(times):.2f} s"
        )
    finally:
        for server in servers.values():
            stop_server(server.proc)
        processes.stop(cfg, "postgres")
        shutil.rmtree(postgres.data_dir(cfg), ignore_errors=True)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
