"""Sustained webhook ingest: `slurmedic serve` (gunicorn, SQLite) under a stream of payloads.

Each payload holds 10 distinct firing alerts (real label sets), sent by `--clients` concurrent
clients over keep-alive connections for `--seconds`. Prints payloads/s, p50/p99 time to the
2xx, and checks that every alert acknowledged is in the ledger (zero lost).

    .venv/bin/python -m bench.webhook_ingest [--seconds 20] [--clients 4]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import threading
import time
from pathlib import Path

import requests

from tests.local_server import TOKEN, start_server, stop_server
from webhook.ledger.store import Ledger


def payload(client: int, seq: int) -> bytes:
    alerts = []
    for k in range(10):
        node = f"gpu{(seq * 10 + k) % 2048:04d}"
        alerts.append(
            {
                "status": "firing",
                "labels": {
                    "alertname": "GpuXidNodeFault",
                    "signal": "gpu_hw",
                    "severity": "critical",
                    "node": node,
                    "gpu": str(k % 8),
                    "xid": "79",
                    "client": str(client),
                    "seq": str(seq),
                },
                "annotations": {"summary": f"XID 79 on {node}"},
                "startsAt": "2026-11-29T22:07:04.696Z",
                "endsAt": "0001-01-01T00:00:00Z",
                "generatorURL": "http://prometheus:9090/graph",
                "fingerprint": "",
            }
        )
    return json.dumps(
        {
            "version": "4",
            "status": "firing",
            "receiver": "slurmedic",
            "groupKey": f"client={client}",
            "alerts": alerts,
        }
    ).encode()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--seconds", type=float, default=20)
    p.add_argument("--clients", type=int, default=4)
    args = p.parse_args()
    server = start_server(Path(tempfile.mkdtemp(prefix="slurmedic-ingest-")))
    latencies: list[float] = []
    acked = errors = 0
    lock = threading.Lock()
    deadline = time.monotonic() + args.seconds

    def client(n: int) -> None:
        nonlocal acked, errors
        s = requests.Session()
        headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
        seq = 0
        while time.monotonic() < deadline:
            body = payload(n, seq)
            t0 = time.perf_counter()
            r = s.post(f"{server.url}/api/v1/alerts", data=body, headers=headers, timeout=30)
            dt = time.perf_counter() - t0
            with lock:
                if r.status_code == 200:
                    latencies.append(dt)
                    acked += r.json()["new"]
                else:
                    errors += 1
            seq += 1

    t0 = time.monotonic()
    threads = [threading.Thread(target=client, args=(i,)) for i in range(args.clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - t0
    try:
        stored = len(Ledger(server.db).alerts_after(0, limit=10_000_000))
    finally:
        stop_server(server.proc)
    lat = sorted(latencies)
    p99 = lat[int(len(lat) * 0.99) - 1] if lat else float("nan")
    print(
        f"{len(lat):,} payloads of 10 alerts in {elapsed:.1f}s with {args.clients} clients: "
        f"{len(lat) / elapsed:,.0f} payloads/s ({len(lat) * 10 / elapsed:,.0f} alerts/s)"
    )
    print(
        f"time to 2xx: p50 {statistics.median(lat) * 1000:.1f} ms, p99 {p99 * 1000:.1f} ms; "
        f"errors {errors}"
    )
    print(
        f"alerts acknowledged {acked:,}, in the ledger {stored:,}: "
        f"{'zero lost' if stored == acked else f'{acked - stored} LOST'}"
    )


if __name__ == "__main__":
    main()
