"""The webhook fuzz at length: `--count` bodies (tests/service/test_webhook_fuzz.py's
strategies: payloads near Alertmanager's shape, odd labels and times, wrong types, bytes that
are not JSON) sent to `slurmedic serve` on kept-alive connections, as Alertmanager sends. The
CI test sends 2,000 and asserts; this counts: answers by status (a 5xx is a defect), requests
per second, and the alerts acknowledged (2xx) against those in the ledger afterwards (nothing
acknowledged may be missing).

    .venv/bin/python -m bench.webhook_fuzz [--count 100000] [--postgres]
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from collections import Counter
from pathlib import Path

import requests
from hypothesis import HealthCheck, Phase, given, settings
from sqlalchemy import select

from lab import postgres, processes
from lab.config import LabConfig
from tests.local_server import TOKEN, start_server, stop_server
from tests.service.test_webhook_fuzz import bodies
from webhook.core.alerts import fingerprint
from webhook.ledger.schema import AlertRow
from webhook.ledger.store import Ledger


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--count", type=int, default=100_000)
    p.add_argument("--postgres", action="store_true", help="the ledger on the lab's PostgreSQL")
    p.add_argument("--port-base", type=int, default=23000)
    args = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="slurmedic-fuzz-"))
    cfg = LabConfig(run_dir=tmp / "lab", port_base=args.port_base)
    extra: dict[str, str] = {}
    if args.postgres:
        postgres.start(cfg)
        extra["database_url"] = postgres.new_database(cfg, "fuzz")
    server = start_server(tmp, **extra)
    answers: Counter[int] = Counter()
    acked: set[str] = set()
    fivexx: list[str] = []
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {TOKEN}"}
    session = requests.Session()

    @settings(
        max_examples=args.count,
        deadline=None,
        database=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(body=bodies)
    def send(body: bytes) -> None:
        r = session.post(f"{server.url}/api/v1/alerts", data=body, headers=headers, timeout=30)
        answers[r.status_code] += 1
        if r.status_code >= 500 and len(fivexx) < 5:
            fivexx.append(f"{r.status_code} {r.text[:200]} for {body[:200]!r}")
        if r.status_code == 200:
            for a in json.loads(body)["alerts"]:
                acked.add(a.get("fingerprint") or fingerprint(a["labels"]))

    started = time.monotonic()
    try:
        send()
        took = time.monotonic() - started
        ledger = Ledger(server.db)
        with ledger.session() as s:
            stored = set(s.scalars(select(AlertRow.fingerprint)))
        sent = sum(answers.values())
        print(
            f"webhook fuzz ({'PostgreSQL' if args.postgres else 'SQLite'}): {sent} bodies in "
            f"{took:.0f} s ({sent / took:.0f}/s); answers "
            + ", ".join(f"{code}: {n}" for code, n in sorted(answers.items()))
            + f"; 5xx: {sum(n for c, n in answers.items() if c >= 500)}; alerts acknowledged "
            f"{len(acked)} (by fingerprint), missing from the ledger {len(acked - stored)}"
        )
        for line in fivexx:
            print("  5xx:", line)
    finally:
        stop_server(server.proc)
        if args.postgres:
            processes.stop(cfg, "postgres")
            shutil.rmtree(postgres.data_dir(cfg), ignore_errors=True)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
