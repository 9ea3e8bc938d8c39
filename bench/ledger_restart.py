"""What a restart of the loop reads back from a ledger that has kept a year of decisions: the
guards' memory (the retry budget's and the breaker's window), the exclusions Slurm may still
keep in the ExcNodeLists of the jobs it knows (older than that window), and the engine's
incidents.

The ledger is SQLite, filled with what a cluster of `--nodes` nodes failing at `--rate` per
1,000 node-days decides in `--days` (Meta RSC's 6.5): a drain and a requeue excluding the node
for each failure under a job, of jobs that come and go; one in twenty with the evidence of a
large job's every node (an application error on 512 nodes), the rest with that of a few.
`--alive` of those jobs are still in Slurm's view at the restart. Each read is timed, then run
again with its allocations traced, for its peak.

    .venv/bin/python -m bench.ledger_restart [--nodes 12288] [--days 365] [--alive 500]
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from webhook.core.decisions import Decision, GuardState
from webhook.core.incidents import IncidentKey
from webhook.core.policy import Policy
from webhook.ledger.store import Ledger

NOW = datetime(2026, 12, 1, tzinfo=UTC)


def evidence(rng: random.Random, at: datetime, nodes: int, n: int) -> tuple[dict[str, Any], ...]:
    return tuple(
        {
            "alertname": "TrainingTaskFailed",
            "node": f"gpu{rng.randrange(nodes):05d}",
            "fingerprint": f"{rng.getrandbits(64):016x}",
            "startsAt": at.strftime("%Y-%m-%dT%H:%M:%SZ"),
        }
        for _ in range(n)
    )


def fill(ledger: Ledger, nodes: int, days: float, rate: float, seed: int) -> tuple[int, list[int]]:
    """Decisions of `days` before NOW; the number of decisions and the jobs they are about."""
    rng = random.Random(seed)
    failures = int(nodes * days * rate / 1000)
    begin = NOW - timedelta(days=days)
    job, batch, count, jobs = 1000, [], 0, []
    for i in range(failures):
        at = begin + timedelta(seconds=(i + rng.random()) * days * 86400 / failures)
        job += rng.randrange(1, 4)  # jobs come and go
        jobs.append(job)
        node = f"gpu{rng.randrange(nodes):05d}"
        incident = str(IncidentKey.of_attempt(job, 0))
        ev = evidence(rng, at, nodes, 512 if rng.random() < 0.05 else rng.randrange(1, 9))
        common: dict[str, Any] = {
            "at": at,
            "incident": incident,
            "job": job,
            "cause": "gpu_hardware",
            "reason": "XID 79",
            "evidence": ev,
            "state": "executed",
        }
        batch += [
            Decision(action="drain", nodes=(node,), **common),
            Decision(action="requeue", exclude=(node,), **common),
        ]
        if len(batch) >= 1000:
            ledger.record(batch)
            count += len(batch)
            batch = []
    if batch:
        ledger.record(batch)
        count += len(batch)
    return count, jobs


def measure(what: str, read: Callable[[], Any]) -> Any:
    """The read timed, then again with its Python allocations traced (tracing slows it)."""
    began = time.perf_counter()
    got = read()
    took = time.perf_counter() - began
    del got
    tracemalloc.start()
    got = read()
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    print(f"| {what} | {took:.2f} | {peak / 2**20:.1f} | {len(got)} |")
    return got


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=12_288)
    ap.add_argument("--days", type=float, default=365)
    ap.add_argument("--rate", type=float, default=6.5, help="failures per 1,000 node-days")
    ap.add_argument("--alive", type=int, default=500, help="jobs in Slurm's view at the restart")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    policy = Policy()
    since = NOW - max(policy.retry_budget.window, policy.breaker.window)
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "ledger.db"
        ledger = Ledger(f"sqlite:///{db}")
        began = time.perf_counter()
        decided, jobs = fill(ledger, args.nodes, args.days, args.rate, args.seed)
        print(
            f"# A restart reads a ledger of {args.days:g} days of {args.nodes:,} nodes\n\n"
            f"- {decided:,} decisions ({db.stat().st_size / 2**20:.0f} MB of SQLite, filled in "
            f"{time.perf_counter() - began:.0f} s); {args.alive} jobs in Slurm's view\n"
        )
        rng = random.Random(args.seed)
        alive = set(rng.sample(jobs, args.alive))
        print("| read | seconds | peak MB (Python) | rows |")
        print("|---|---:|---:|---:|")
        older = measure(
            "ledger.exclusion_history (older exclusions)",
            lambda: list(ledger.exclusion_history(since, jobs=alive)),
        )
        kept = measure(
            "GuardState.exclusions_in_force (of the jobs Slurm knows)",
            lambda: GuardState(history=older).exclusions_in_force(since, alive),
        )
        measure("ledger.history (the guards' window)", lambda: list(ledger.history(since)))
        measure(
            "ledger.restore_incidents (the retention)",
            lambda: ledger.restore_incidents(since=NOW - policy.retention_age),
        )
        print(f"\n{len(kept)} older decisions kept in the guards' memory.")


if __name__ == "__main__":
    main()
